"""Tuning one kernel for a whole range of sizes (DietCode): shape-generic variants, a cost
model learned from a fixed number of measurements, and a decision tree that dispatches.

A kernel whose sizes hold a symbol with a declared range (``compile(..., dynamic={"seq":
(1, 128)})``) is tuned once for every size of the range:

1. **Candidates.** The template's configs do not depend on the symbol (its space is
   derived from the hardware), and the template pads its register tiles (local padding:
   the compute stage has no bounds checks, only the stores are predicated), so each
   config is a shape-generic micro-kernel. Candidates are the space's points, plus the
   config a compile for a single size would fit to each of a few stand-in sizes of the
   range (``Template.sized_config``: small sizes want short register tiles and a split
   over the columns).
2. **Measurements, a fixed number.** Every stand-in config and the first MEASURED points
   of the space run at a size of the range where their tiles fit (within FIT_SLACK of
   exactly) and keep every thread busy, and at every stand-in size; a few candidates
   also run at the range's smallest size and at its least occupied one. How many does
   not depend on how many sizes the range holds. A model's workloads are measured together
   (``choose_dynamic_many``): each round builds all their candidates at once and times
   them in one child process.
3. **The cost model** predicts any candidate at any size (``CostModel``)::

       seconds = overhead + cold * right_once + per_mac * macs / (threads * f_occ)
                 + stream * (right_bytes - right_once)

   ``macs`` counts padded multiply-adds (f_pad), ``f_occ = k * occupancy + 1 - k`` with
   occupancy the busy share of the thread slots, ``right_bytes`` the right factor
   streamed once per block of rows, the first time (``right_once``) from memory.
   ``per_mac`` (f_MK, the micro-kernel's time per multiply-add) is measured for measured
   candidates and predicted for the others by gradient-boosted trees over the
   micro-kernel's features; ``k``, ``overhead``, ``cold`` and ``stream`` are fitted to the
   extra measurements, and a candidate timed at two sizes gets f_MK and a stream of its
   own from both. The model's guesses pick a second round of candidates to measure.
   Each measured candidate's predictions are bent through its own measurements
   (``_Tuning.anchored``), so the model only carries them between the timed sizes.
4. **Variants.** Among measured candidates, the one with the least weighted total time
   over the range (each size's time relative to the fastest candidate's there), then
   greedily, among those at least MIN_GAIN faster than the chosen ones at some size and
   up to MAX_VARIANTS, the one that helps most the size left furthest over MIN_GAIN
   slower than its fastest candidate while there is one, then the one that lowers the
   total most.
5. **Dispatch.** A decision tree learns which variant the model picks at every size of
   the range (every integer, weighted), and becomes an if-tree on the symbols in front of
   the variants, in the kernel's own C (``schedule.dispatch``): dispatch costs a few
   compares, and a saved model needs neither Python's tree nor scikit-learn. Sizes outside
   the range take the variant of the nearest size the tree saw.

Where the target has no device on this machine (CUDA without a GPU), nothing is
measured: every candidate's time at every size of the grid is the template's analytic
latency (Gensor's model, ``Constructible.predicted_seconds``), and steps 4 and 5 choose
from those. The dump's ``dynamic.txt`` says which cost source was used; an analytic
choice is not recorded, so a machine with the device measures.

The outcome is recorded like a tuned config (``tune.records``), keyed by the workload
with its symbols and their declared ranges, so a second compile measures nothing.
"""
from __future__ import annotations

import functools
import itertools
import logging
import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

import numpy as np

from treadle.dump import dump_text
from treadle.errors import DeviceUnavailableError, ScheduleConfigError
from treadle.ir.dtypes import index_type
from treadle.ir.expr import Var
from treadle.ir.functor import free_vars
from treadle.schedule.template import (Constructible, Sized, Template, default_point,
                                       valid_points)
from treadle.target import Target
from treadle.tune.measure import SYMBOL_SIZE, measure_functions
from treadle.tune.records import (config_of, read_record, record_location, replay,
                                  workload_text, write_record)

log = logging.getLogger(__name__)

FORMAT = "treadle-dynamic-record-2"
MAX_VARIANTS = 6
# Leaves of the dispatch tree: which variant pads least changes with a size's residues
# (13 rows suit 13 and 26, 8 rows suit 16), so a range needs many; each costs a compare.
MAX_LEAVES = 64
MIN_GAIN = 0.05        # a variant joins where it is 5% faster than the others at some size
MAX_GRID = 4096        # sizes the model scores, per kernel (a finer range is sampled)
QUANTILES = 3          # stand-in sizes at quantiles of the weight (see _stand_ins)
GROWTH = 1.5           # and sizes growing by half from the smallest (see _stand_ins)
MEASURED = {1: 2, 2: 8}     # space points measured in the first round, beside the stand-ins
EXPLORED = {1: 3, 2: 8}     # candidates the model picks for a second round
# Timings per run, within a time budget: each candidate runs at several sizes and the
# model is fitted to all of them, so a long run needs fewer timings than a static tuner's
# (3 of 50 ms); a short one, many (at 17 x 17, attention's candidates differed by less
# than 6 timings of 100 microseconds varied, and the variants chosen changed run to run).
# Runs of up to a millisecond are timed 30 times; BERT's runs of 3 ms and more, 30 times
# each, took 9 of its 13 s of timing, and varied as much from one tuning to the next
# when timed 10 times.
REPEATS = 30
BUDGET_S = 0.03
PROBED = 3             # candidates also timed at the smallest and least occupied sizes
FIT_SLACK = 0.1        # a size fitting a candidate's tiles this much worse than its best
                       # still measures its micro-kernel (see _full_size)
# Before fitting: occupancy k, overhead s, cold and stream s/byte (memory at 20 GB/s, cache
# at 40 GB/s).
PRIOR = (0.5, 2e-6, 50e-12, 25e-12)


# ---- declared ranges -------------------------------------------------------------------------

@dataclass(frozen=True)
class SizeRange:
    """The sizes a symbol takes, ``lo..hi``, and how much each counts (all alike when
    ``weights`` is empty; a size it leaves out counts nothing)."""
    lo: int
    hi: int
    weights: tuple[tuple[int, float], ...] = ()

    def weight(self, size: int) -> float:
        return dict(self.weights).get(size, 0.0) if self.weights else 1.0

    def sizes(self, limit: int) -> list[int]:
        """Every size of the range, or ``limit`` of them spread evenly (with every
        weighted size kept)."""
        if self.hi - self.lo + 1 <= limit:
            return list(range(self.lo, self.hi + 1))
        spread = np.unique(np.linspace(self.lo, self.hi, limit).round().astype(int))
        return sorted(set(spread.tolist()) | {s for s, _ in self.weights})

    def __str__(self) -> str:
        weights = f" weights {list(self.weights)}" if self.weights else ""
        return f"{self.lo}..{self.hi}{weights}"


def size_ranges(dynamic: Mapping[str, Any]) -> dict[str, SizeRange]:
    """The user's ``dynamic`` argument checked: per symbol ``(lo, hi)``, a list of the
    sizes expected (the range they span, each counting once per appearance) or a
    ``{size: weight}`` histogram."""
    if not isinstance(dynamic, Mapping):
        raise TypeError(f"dynamic must map symbol names to ranges, not {type(dynamic).__name__}")
    return {str(name): _size_range(str(name), spec) for name, spec in dynamic.items()}


def _size_range(name: str, spec: Any) -> SizeRange:
    def fail(why: str) -> ValueError:
        return ValueError(f"dynamic[{name!r}] = {spec!r}: {why}; expected (lo, hi), a list of "
                          f"sizes or a {{size: weight}} mapping, sizes integers >= 0")
    if isinstance(spec, Mapping):
        weights = {}
        for size, weight in spec.items():
            if not _is_size(size) or not isinstance(weight, (int, float)) or weight < 0:
                raise fail(f"{size!r}: {weight!r} is not a size and a weight >= 0")
            weights[int(size)] = float(weight)
    elif isinstance(spec, tuple) and len(spec) == 2 and all(map(_is_size, spec)):
        lo, hi = int(spec[0]), int(spec[1])
        if lo > hi:
            raise fail("lo is greater than hi")
        return SizeRange(lo, hi)
    elif isinstance(spec, (list, tuple)) and spec and all(map(_is_size, spec)):
        weights = {}
        for size in spec:
            weights[int(size)] = weights.get(int(size), 0.0) + 1.0
    else:
        raise fail("not a range")
    if not weights or not sum(weights.values()) > 0:
        raise fail("no size has a weight")
    return SizeRange(min(weights), max(weights), tuple(sorted(weights.items())))


def _is_size(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0


# ---- the decision tree -----------------------------------------------------------------------

@dataclass(frozen=True)
class Tree:
    """A binary decision tree on symbol values. Node ``(f, t, left, right)`` sends
    ``values[symbols[f]] <= t`` to ``left``, else to ``right``; a leaf is ``(-1, v, -1,
    -1)`` and chooses variant ``v``. Node 0 is the root."""
    symbols: tuple[str, ...]
    nodes: tuple[tuple[int, int, int, int], ...]

    def predict(self, values: Mapping[str, int]) -> int:
        node = self.nodes[0]
        while node[0] >= 0:
            feature, threshold, left, right = node
            node = self.nodes[left if values[self.symbols[feature]] <= threshold else right]
        return node[1]

    @property
    def variants(self) -> list[int]:
        return sorted({n[1] for n in self.nodes if n[0] < 0})


def fit_tree(symbols: Sequence[str], grid: np.ndarray, labels: np.ndarray,
             weights: np.ndarray) -> Tree:
    """The tree (at most MAX_LEAVES leaves) that best reproduces ``labels`` over ``grid``
    (a row of symbol values per point), weighted by ``weights``."""
    if len(set(labels.tolist())) == 1:
        return Tree(tuple(symbols), ((-1, int(labels[0]), -1, -1),))
    from sklearn.tree import DecisionTreeClassifier
    model = DecisionTreeClassifier(max_leaf_nodes=MAX_LEAVES, random_state=0)
    model.fit(grid, labels, sample_weight=weights)
    t = model.tree_
    nodes = []
    for k in range(t.node_count):
        if t.children_left[k] < 0:
            nodes.append((-1, int(model.classes_[int(np.argmax(t.value[k]))]), -1, -1))
        else:  # integer values: x <= 16.5 is x <= 16
            nodes.append((int(t.feature[k]), math.floor(t.threshold[k]),
                          int(t.children_left[k]), int(t.children_right[k])))
    return _pruned(Tree(tuple(symbols), tuple(nodes)))


def _pruned(tree: Tree) -> Tree:
    """The tree without splits whose sides choose the same variant, nodes renumbered
    from the root."""
    nodes: list[tuple[int, int, int, int]] = []

    def add(k: int) -> int:
        feature, value, left, right = tree.nodes[k]
        at = len(nodes)
        nodes.append(tree.nodes[k])
        if feature >= 0:
            lo, hi = add(left), add(right)
            if nodes[lo][0] < 0 and nodes[lo] == nodes[hi]:
                leaf = nodes[lo]
                del nodes[at + 1:]
                nodes[at] = leaf
            else:
                nodes[at] = (feature, value, lo, hi)
        return at
    add(0)
    return Tree(tree.symbols, tuple(nodes))


# ---- the cost model --------------------------------------------------------------------------

@dataclass(frozen=True)
class CostModel:
    occupancy: float  # k of f_occ
    overhead: float   # seconds per call
    cold: float       # seconds per byte of the right factor's first read (from memory)
    stream: float     # seconds per byte of its further reads

    def f_occ(self, work) -> float:
        return self.occupancy * work.occupancy + 1 - self.occupancy

    def compute(self, work) -> float:
        """Multiply-adds per thread, stretched where threads idle: f_MK's multiplier."""
        return work.macs / (work.threads * self.f_occ(work))

    def seconds(self, per_mac: float, work, stream: float | None = None) -> float:
        """The time of a candidate with ``per_mac`` at ``work``; ``stream``, where given,
        is the candidate's own time per byte streamed, in place of the model's."""
        stream = self.stream if stream is None else stream
        return (self.fixed(work) + per_mac * self.compute(work)
                + stream * (work.right_bytes - work.right_once))

    def fixed(self, work) -> float:
        """What every candidate pays: the call, and reading the right factor once."""
        return self.overhead + self.cold * work.right_once

    def per_mac(self, seconds: float, work) -> float:
        """The time per multiply-add a measurement of ``seconds`` implies (f_MK)."""
        rest = max(seconds - self.fixed(work) - self.stream * (work.right_bytes - work.right_once),
                   0.05 * seconds)
        return rest * work.threads * self.f_occ(work) / max(work.macs, 1)


@dataclass(frozen=True)
class Sample:
    """One candidate timed at a size where it keeps every thread busy (``full``) and at
    another size (``probe``)."""
    full: Any  # Work
    full_seconds: float
    probe: Any  # Work
    probe_seconds: float


def fit_cost_model(samples: Sequence[Sample], prior: CostModel = CostModel(*PRIOR)) -> CostModel:
    """k, overhead, cold and stream fitted so that each sample's full-size time, carried
    to its probe size, predicts the probe's time (least squares on log times). Without
    samples, the prior."""
    if not samples:
        return prior
    from scipy.optimize import least_squares
    scale = np.array([1.0, 1e-6, 1e-12, 1e-12])  # k, microseconds, picoseconds per byte

    def residuals(x):
        model = CostModel(*(x * scale))
        return [math.log(model.seconds(model.per_mac(s.full_seconds, s.full), s.probe))
                - math.log(s.probe_seconds) for s in samples]
    start = np.array([prior.occupancy, prior.overhead, prior.cold, prior.stream]) / scale
    fit = least_squares(residuals, start, bounds=([0, 0, 0, 0], [1, 1e4, 1e4, 1e4]))
    return CostModel(*(fit.x * scale))


class PerMac:
    """f_MK of every candidate: measured where it was, else predicted by gradient-boosted
    trees over the micro-kernels' features (log time per multiply-add)."""

    def __init__(self, features: Sequence[dict], measured: Mapping[int, Measured]):
        self.measured = {c: m.per_mac for c, m in measured.items()}
        self.features = np.array([[f[k] for k in sorted(f)] for f in features])
        self.predicted = np.full(len(features), np.nan)
        if len(self.measured) >= 4:
            from sklearn.ensemble import GradientBoostingRegressor
            index = sorted(self.measured)
            model = GradientBoostingRegressor(n_estimators=60, max_depth=2, random_state=0)
            model.fit(self.features[index], np.log([self.measured[k] for k in index]))
            self.predicted = np.exp(model.predict(self.features))
        elif self.measured:
            self.predicted[:] = float(np.median(list(self.measured.values())))

    def __getitem__(self, k: int) -> float:
        return self.measured.get(k, self.predicted[k])


# ---- choosing variants -----------------------------------------------------------------------

@dataclass(frozen=True)
class DynamicChoice:
    """The variants of one kernel over its symbols' ranges and the tree choosing them:
    ``tree.predict`` gives an index into ``configs`` and ``resolved``."""
    template: Template
    configs: tuple
    resolved: tuple
    tree: Tree
    source: str  # "measured", "analytic" (no device), "record", or "default" where every
    # candidate failed


def dynamic_symbols(template: Template, pattern: Any, ranges: Mapping[str, SizeRange]
                    ) -> list[str]:
    """The declared symbols the kernel's sizes depend on (none: one config serves)."""
    if not isinstance(template, Sized) or template.config_type is None:
        return []
    names = {v.name for e in template.sizes(pattern) for v in free_vars(e)}
    return sorted(names & set(ranges))


def choose_dynamic(template: Template, pattern: Any, name: str,
                   ranges: Mapping[str, SizeRange], level: int, target: Target
                   ) -> DynamicChoice:
    """The variants and dispatch tree of ``pattern`` over ``ranges`` (see the module's
    docstring), from a record when one is stored."""
    return choose_dynamic_many([(template, pattern, name)], ranges, level, target)[0]


def choose_dynamic_many(kernels: Sequence[tuple[Template, Any, str]],
                        ranges: Mapping[str, SizeRange], level: int, target: Target
                        ) -> list[DynamicChoice]:
    """The choice of each ``(template, pattern, name)``, the workloads without a record
    tuned together: each round of measuring builds every workload's candidates at once
    and times them in one child, so a model pays the compiler's and the child's start-up
    twice, not twice per workload. Equal workloads (repeated layers) are tuned once."""
    choices: dict[str, DynamicChoice] = {}
    tunings: dict[str, _Tuning] = {}
    workloads = []
    for template, pattern, name in kernels:
        symbols = dynamic_symbols(template, pattern, ranges)
        workload = "\n".join([workload_text(template, pattern, f"dynamic {level}", target)]
                             + [f"range {s}: {ranges[s]}" for s in symbols])
        workloads.append(workload)
        if workload not in choices and workload not in tunings:
            stored = _load(workload, template, pattern, target)
            if stored is not None:
                choices[workload] = stored
            else:
                tunings[workload] = _Tuning.start(template, pattern, name, symbols, ranges,
                                                  level, target)
    if tunings:
        started = list(tunings.values())
        try:
            _measure(started, level)
        except DeviceUnavailableError as err:
            _without_device(started, err)
        for workload, tuning in tunings.items():
            choices[workload] = tuning.finish(workload)
    return [choices[w] for w in workloads]


def _measure(started: Sequence[_Tuning], level: int) -> None:
    """The two rounds of measuring, every workload's runs timed together."""
    from treadle.tune.choice import measurement_progress
    # at most: each explored candidate where it fits best and at every stand-in size
    explored = sum(EXPLORED[level] * (1 + len(t.stand_ins)) for t in started)
    total = sum(len(t.first) for t in started) + explored
    names = started[0].name + (f" and {len(started) - 1} more" if len(started) > 1 else "")
    with measurement_progress(total, f"{names} (dynamic)") as bar:
        _time_runs(started, [t.first for t in started], bar)
        extra = [t.explore() for t in started]
        bar.update(explored - sum(map(len, extra)))
        _time_runs(started, extra, bar)


def _without_device(started: Sequence[_Tuning], err: DeviceUnavailableError) -> None:
    """Where the target has no device here, every candidate's time at every size is the
    template's analytic latency (Gensor's model, ``Constructible.predicted_seconds``); a
    template without one cannot be tuned for a range, and the error stands."""
    for tuning in started:
        if not isinstance(tuning.template, Constructible):
            raise err
    log.info("dynamic shapes: costs are analytic estimates: %s", err)
    for tuning in started:
        tuning.analytic = str(err)


def select_variants(times: np.ndarray, weights: np.ndarray) -> list[int]:
    """Candidates (rows of ``times``, seconds per grid point) chosen greedily to lower
    the weighted total of the fastest chosen one at each point, each point's time taken
    relative to the fastest candidate's there: a size counts by its weight, not by how
    long it runs (a sequence of 128 would otherwise outweigh every short one, and short
    ones would run whatever suits long ones). While a size of some weight still runs
    over MIN_GAIN slower than its fastest candidate, the candidate that helps the worst
    such size most comes first: by total alone, BERT's 768 x 768 layers filled their six
    variants with small gains over mid sizes and ran a 5-row tile at a sequence of 1,
    18% slower in the model than the 1-row one."""
    times = times / np.min(times, axis=0)
    chosen = [int(np.argmin(times @ weights))]
    best = times[chosen[0]]
    while len(chosen) < MAX_VARIANTS:
        better = best - np.minimum(times, best)
        eligible = (better / best).max(axis=1) >= MIN_GAIN
        gains = np.where(eligible, better @ weights, 0.0)
        worst = int(np.argmax(np.where(weights > 0, best, 0.0)))
        helping = np.flatnonzero(eligible & (better[:, worst] > 0))
        if best[worst] > 1 + MIN_GAIN and helping.size:
            k = int(max(helping, key=lambda c: (better[c, worst], gains[c])))
        else:
            k = int(np.argmax(gains))
            if gains[k] <= 0:
                break
        chosen.append(k)
        best = np.minimum(best, times[k])
    return chosen


def _grid(template, pattern, symbols: list[str], ranges) -> tuple[list[dict], np.ndarray]:
    """The symbol bindings the model scores, with their weights; symbols without a
    declared range take the measuring stand-in size."""
    per_axis = max(2, int(MAX_GRID ** (1 / max(len(symbols), 1))))
    axes = [ranges[s].sizes(per_axis) for s in symbols]
    others = {v for e in template.sizes(pattern) for v in free_vars(e)
              if v.name not in symbols}
    grid, weights = [], []
    for values in itertools.product(*axes):
        env = {Var(s, index_type): v for s, v in zip(symbols, values)}
        env.update({v: SYMBOL_SIZE for v in others})
        grid.append(env)
        weights.append(math.prod(ranges[s].weight(v) for s, v in zip(symbols, values)))
    weights = np.array(weights)
    return grid, weights / weights.sum()


def _candidates(template, pattern, level: int, target: Target, grid: list[dict],
                weights: np.ndarray) -> tuple[list[tuple[Any, Any]], dict[int, int]]:
    """(config, resolved) of every distinct candidate: the single-size configs of the
    stand-in sizes first, then the space of ``level``; and the grid index each stand-in
    config was made for. Where the template lays a constant operand out by its register
    tile's width, every variant keeps the default's width, so that the kernel holds one
    copy of the weights."""
    default, _ = default_point(template, pattern, target)
    stand_ins = _stand_ins(grid, weights)
    made_for = {}
    for g in stand_ins:
        made_for.setdefault(template.sized_config(pattern, default, target, grid[g]), g)
    configs = list(made_for) + template.space(pattern, max(level, 1), target)
    points = valid_points(template, pattern, list(dict.fromkeys(configs)), target)
    layout = template.layout_key(points[0][1]) if points else None
    unique: dict[Any, Any] = {}
    for config, resolved in points:
        if template.layout_key(resolved) == layout:
            unique.setdefault(resolved, config)
    if not unique:
        raise ScheduleConfigError(f"the {template.name} template accepts no candidate")
    found = [(c, r) for r, c in unique.items()]
    origins = {k: made_for[c] for k, (c, _) in enumerate(found) if c in made_for}
    return found, origins


def _stand_ins(grid: list[dict], weights: np.ndarray) -> list[int]:
    """Grid indices of the stand-in sizes: the quantiles (``_quantiles``), and sizes
    growing from the smallest, by half up to the median and doubling after it. Small
    sizes span few register tiles, so a few rows more or less change which tile pads
    least; and powers of two alone flatter tiles of power-of-two rows (a batched 17 x 17
    product ran 4 x 16 tiles at half the speed of the 9 x 16 ones that a size of 18
    fits). Large sizes cost the most to time and differ less."""
    quantiles = _quantiles(weights)
    found, median = set(quantiles), quantiles[QUANTILES // 2]
    order = sorted(range(len(grid)), key=lambda g: sorted(grid[g].values()))
    last, growth = None, GROWTH
    for g in order:
        size = max(grid[g].values(), default=0)
        if last is None or size >= growth * last or g == median:
            found.add(g)
            last = max(size, 1)
        if g == median:
            growth = 2.0
    return sorted(found)


def _quantiles(weights: np.ndarray) -> list[int]:
    """Grid indices at evenly spaced quantiles of the weight, the first and last
    included."""
    cumulative = np.cumsum(weights)
    return [int(min(np.searchsorted(cumulative, q), len(weights) - 1))
            for q in np.linspace(0, 1, QUANTILES)]


@dataclass
class _Tuning:
    """One workload's tuning, between its rounds of measuring: the candidates, their
    works over the grid, the runs (candidate, grid index) of the first round, and each
    run's seconds as they come."""
    template: Template
    pattern: Any
    name: str
    symbols: list[str]
    grid: list[dict]
    weights: np.ndarray
    points: list[tuple[Any, Any]]
    works: list[list]
    level: int
    target: Target
    stand_ins: list[int]  # grid indices of the stand-in sizes
    origins: dict[int, int]  # candidate -> the stand-in its config was made for
    first: list[tuple[int, int]]
    seconds: dict[tuple[int, int], float | None] = field(default_factory=dict)
    model: CostModel = CostModel(*PRIOR)
    measured: dict[int, Measured] = field(default_factory=dict)
    analytic: str | None = None  # why costs are estimated, where they are

    @classmethod
    def start(cls, template, pattern, name: str, symbols: list[str], ranges, level: int,
              target: Target) -> "_Tuning":
        grid, weights = _grid(template, pattern, symbols, ranges)
        points, origins = _candidates(template, pattern, level, target, grid, weights)
        works = [[template.work(r, env) for env in grid] for _, r in points]
        space = [c for c in range(len(points)) if c not in origins][:MEASURED[level]]
        tuning = cls(template, pattern, name, symbols, grid, weights, points, works, level,
                     target, sorted(set(origins.values())), origins, [])
        first = sorted(origins) + space
        runs = [run for c in first for run in tuning.runs_of(c)]
        runs += [(c, g) for c in first[:PROBED] for g in _probe_sizes(works[c])]
        tuning.first = list(dict.fromkeys(runs))
        return tuning

    def runs_of(self, c: int) -> list[tuple[int, int]]:
        """Where candidate ``c`` is timed: where its tiles fit best, and at every
        stand-in size; or, for a config made for one stand-in, at that one and its
        neighbours (where it may win) and at the range's ends. Elsewhere the model carries
        its time from those: timing every candidate at every size spent most of a dense
        layer's tuning at the large ones; timing a 5 x 16 tile at sizes up to 8 and 80
        alone, the model carried it to 128 at 25% below its time."""
        sizes = self.stand_ins
        if c in self.origins:
            k = sizes.index(self.origins[c])
            ends = _quantiles(self.weights)[::QUANTILES - 1]
            sizes = sorted(set(sizes[max(k - 1, 0):k + 2] + ends))
        return list(dict.fromkeys([(c, _full_size(self.works[c]))]
                                  + [(c, g) for g in sizes]))

    def explore(self) -> list[tuple[int, int]]:
        """After the first round: the model fitted, f_MK of the measured candidates, and
        the runs of the second round, the candidates the model expects to gain most."""
        runs = self.first
        seconds = [self.seconds[r] for r in runs]
        self.model = fit_cost_model(_samples(runs, seconds, self.works))
        self.measured = _per_macs(runs, seconds, self.works, self.model)
        per_mac = PerMac([self.template.features(r, self.target) for _, r in self.points],
                         self.measured)
        explore = _promising(per_mac, self.model, self.works, self.weights, self.measured,
                             EXPLORED[self.level])
        return [run for c in explore for run in self.runs_of(c)]

    def finish(self, workload: str) -> DynamicChoice:
        """The variants and their tree, stored under ``workload`` where measured."""
        if self.analytic is not None:
            return self.predicted()
        extra = [r for r in self.seconds if r not in self.first]
        self.measured.update(_per_macs(extra, [self.seconds[r] for r in extra], self.works,
                                       self.model))
        template, measured, works = self.template, self.measured, self.works
        if not measured:
            log.warning("tuning %s: every candidate failed; using the level-0 point",
                        self.name)
            default = default_point(template, self.pattern, self.target)
            return DynamicChoice(template, (default[0],), (default[1],),
                                 Tree(tuple(self.symbols), ((-1, 0, -1, -1),)), "default")
        rows = sorted(measured)
        times = np.array([self.anchored(c, self.values) for c in rows])
        choice, variants = self.chosen(rows, times, "measured")
        dump_text((self.name, "dynamic.txt"),
                  _report(self.points, measured, self.model, self.grid, works, variants))
        _store(workload, choice, self.model)
        return choice

    def predicted(self) -> DynamicChoice:
        """The variants and their tree from every candidate's analytic latency at every
        size of the grid; not stored, as a target with a device measures instead."""
        memory = self.target.memory()
        times = np.array([[self.template.predicted_seconds(r, memory, env) for env in self.grid]
                          for _, r in self.points])
        choice, variants = self.chosen(list(range(len(self.points))), times, "analytic")
        dump_text((self.name, "dynamic.txt"), "\n".join(
            [f"cost source: the template's analytic latency, not measurements: "
             f"{self.analytic}"]
            + [f"variant {k}: {self.points[c][1].config}" for k, c in enumerate(variants)]))
        return choice

    @functools.cached_property
    def values(self) -> np.ndarray:
        """The symbols' values at each grid point, a row per point."""
        return np.array([[env[Var(s, index_type)] for s in self.symbols] for env in self.grid])

    def chosen(self, rows: list[int], times: np.ndarray, source: str
               ) -> tuple[DynamicChoice, list[int]]:
        """The variants among candidates ``rows`` (``times``: a row of seconds over the
        grid for each) and the tree dispatching them; and the candidates they are."""
        chosen = select_variants(times, self.weights)
        labels = np.argmin(times[chosen], axis=0)
        tree = fit_tree(self.symbols, self.values, labels, self.weights)
        used = tree.variants  # a variant the tree never picks is dropped
        tree = _renumbered(tree, {old: new for new, old in enumerate(used)})
        variants = [rows[chosen[k]] for k in used]
        return DynamicChoice(self.template, tuple(self.points[c][0] for c in variants),
                             tuple(self.points[c][1] for c in variants), tree,
                             source), variants

    def anchored(self, c: int, values: np.ndarray) -> np.ndarray:
        """Candidate ``c``'s predicted seconds over the grid (``values``: its symbol
        values), bent to pass through its measurements: each size takes the measured
        over predicted ratios of the timed sizes, weighted by inverse squared distance
        in log size. The model carries the measurements between sizes and no further:
        a fit over all of them misses each one by 10-20%, enough to pick the wrong
        variant where two are close."""
        m = self.measured[c]
        predicted = np.array([self.model.seconds(m.per_mac, w, m.stream)
                              for w in self.works[c]])
        timed = [(g, t) for (k, g), t in self.seconds.items() if k == c and t is not None]
        if not timed:
            return predicted
        at = np.array([g for g, _ in timed])
        ratios = np.log([t for _, t in timed]) - np.log(predicted[at])
        coords = np.log1p(values.astype(float))
        distance = ((coords[:, None, :] - coords[None, at, :]) ** 2).sum(axis=2)
        weights = 1.0 / (distance + 1e-12)
        return predicted * np.exp(weights @ ratios / weights.sum(axis=1))


def _time_runs(tunings: Sequence[_Tuning], runs: Sequence[list[tuple[int, int]]], bar) -> None:
    """Times the runs of every tuning in one measuring call (each candidate emitted
    once however many sizes it runs at), into each tuning's ``seconds``. A kernel that
    reads weights in a layout of its own is timed with them cold, as a model's call
    finds them; one that reads activations alone, with them in cache, as the kernel
    before it leaves them. (Timed cold after the large sizes' runs, attention's
    17 x 17 products all ran at memory speed, and which tile won was noise.)"""
    functions, sizes, labels, owners, cold = [], [], [], [], []
    for tuning, own in zip(tunings, runs):
        emitted = {c: tuning.template.emit(tuning.points[c][1], tuning.name)
                   for c in dict.fromkeys(c for c, _ in own)}
        for c, g in own:
            size = {v.name: n for v, n in tuning.grid[g].items()}
            functions.append(emitted[c].function)
            cold.append(bool(emitted[c].derived))
            sizes.append(size)
            labels.append(f"of {tuning.name} ({tuning.points[c][0]} at {size})")
            owners.append((tuning, (c, g)))
    if not functions:
        return
    seconds = measure_functions(functions, target=tunings[0].target, sizes=sizes,
                                labels=labels, progress=bar, repeats=REPEATS,
                                cold=cold, budget=BUDGET_S)
    for (tuning, run), t in zip(owners, seconds):
        tuning.seconds[run] = t


def _full_size(works: list) -> int:
    """The largest grid point where the candidate's tiles fit and keep the threads busy
    within FIT_SLACK of the best it does anywhere (its time is then mostly the
    micro-kernel's). That is usually the range's largest size, which its end's run times
    anyway: the exact best fit cost a run as long again (BERT's 3-row tiles ran at 126,
    127 and 128)."""
    fit = [w.occupancy * w.useful_macs / max(w.macs, 1) for w in works]
    best = max(fit)
    return max((g for g in range(len(works)) if fit[g] >= (1 - FIT_SLACK) * best),
               key=lambda g: works[g].macs)


def _probe_sizes(works: list) -> list[int]:
    """The smallest size, and the least occupied one (where they differ)."""
    smallest = min(range(len(works)), key=lambda g: works[g].macs)
    idle = min(range(len(works)), key=lambda g: (works[g].occupancy, -works[g].macs))
    return sorted({smallest, idle})


def _samples(runs, seconds, works) -> list[Sample]:
    """Each candidate's full-size time paired with each of its other times."""
    full = {c: (works[c][g], t) for (c, g), t in zip(runs, seconds)
            if t is not None and g == _full_size(works[c])}
    return [Sample(*full[c], works[c][g], t) for (c, g), t in zip(runs, seconds)
            if t is not None and c in full and g != _full_size(works[c])]


@dataclass(frozen=True)
class Measured:
    """What a candidate's measurements say of it: f_MK, and where it ran at two sizes
    that tell them apart, its own time per byte of the right factor streamed (a config
    reading all of K at once streams differently from one in short K blocks)."""
    per_mac: float
    stream: float | None = None


def _per_macs(runs, seconds, works, model: CostModel) -> dict[int, Measured]:
    """Each timed candidate's f_MK (and stream, see Measured): a least-squares fit of
    its times over its sizes, or from one time the model's stream and f_MK alone."""
    from scipy.optimize import nnls
    timed: dict[int, list[tuple[Any, float]]] = {}
    for (c, g), t in zip(runs, seconds):
        if t is not None:
            timed.setdefault(c, []).append((works[c][g], t))
    found = {}
    for c, pairs in timed.items():
        found[c] = Measured(float(np.exp(np.mean([np.log(model.per_mac(t, w))
                                                   for w, t in pairs]))))
        if len(pairs) >= 2:
            a = np.array([[model.compute(w), w.right_bytes - w.right_once] for w, _ in pairs])
            b = np.array([max(t - model.fixed(w), 0.0) for w, t in pairs])
            scale = a.max(axis=0)
            if np.linalg.matrix_rank(a / np.where(scale > 0, scale, 1)) == 2:
                x, _ = nnls(a / scale, b)
                if x[0] > 0:
                    found[c] = Measured(x[0] / scale[0], x[1] / scale[1])
    return found


def _promising(per_mac: PerMac, model: CostModel, works, weights, measured, count: int
               ) -> list[int]:
    """Unmeasured candidates ranked by how much the model says they would lower the
    weighted total of the measured ones."""
    if not measured:
        return []
    predicted = {c: np.array([model.seconds(per_mac[c], w) for w in works[c]])
                 for c in range(len(works))}
    best = np.min([predicted[c] for c in measured], axis=0)
    gains = {c: best @ weights - np.minimum(best, predicted[c]) @ weights
             for c in predicted if c not in measured}
    ranked = sorted((c for c in gains if gains[c] > 0), key=lambda c: -gains[c])
    return ranked[:count]


def _report(points, measured, model: CostModel, grid, works, variants) -> str:
    """The fitted model and every measured candidate's f_MK and predicted times."""
    shown = sorted({0, len(grid) // 8, len(grid) // 4, len(grid) // 2, len(grid) - 1})
    sizes = ", ".join(str(dict((v.name, n) for v, n in grid[g].items())) for g in shown)
    lines = [f"model: {model}", f"predicted microseconds at: {sizes}"]
    for c in sorted(measured, key=lambda c: c not in variants):
        mark = f"variant {variants.index(c)}" if c in variants else "measured"
        m = measured[c]
        predicted = " ".join(f"{model.seconds(m.per_mac, works[c][g], m.stream) * 1e6:.1f}"
                             for g in shown)
        stream = measured[c].stream
        own = "" if stream is None else f", stream {stream * 1e12:.1f} ps/byte"
        lines.append(f"{mark}: {points[c][1].config} f_MK {measured[c].per_mac * 1e12:.1f} "
                     f"ps{own}: "
                     f"{predicted}")
    return "\n".join(lines)


def _renumbered(tree: Tree, numbers: Mapping[int, int]) -> Tree:
    return Tree(tree.symbols, tuple((f, numbers[t] if f < 0 else t, lo, hi)
                                    for f, t, lo, hi in tree.nodes))


# ---- records ---------------------------------------------------------------------------------

def _store(workload: str, choice: DynamicChoice, model: CostModel) -> None:
    write_record(workload, {
        "format": FORMAT, "workload": workload,
        "configs": [_as_dict(c) for c in choice.configs],
        "resolved": [_as_dict(r.config) for r in choice.resolved],
        "tree": {"symbols": list(choice.tree.symbols), "nodes": list(choice.tree.nodes)},
        "model": _as_dict(model)})


def _load(workload: str, template, pattern, target) -> DynamicChoice | None:
    """The stored variants and tree, each variant replayed (``records.replay``); None
    when there is no record or it is unusable (then it is tuned and written again)."""
    kind = template.config_type
    try:
        data = read_record(workload, FORMAT)
        configs = tuple(config_of(c, kind) for c in data["configs"])
        resolved = tuple(replay(template, pattern, c, config_of(r, kind), target)
                         for c, r in zip(configs, data["resolved"], strict=True))
        nodes = tuple(tuple(int(v) for v in n) for n in data["tree"]["nodes"])
        tree = Tree(tuple(str(s) for s in data["tree"]["symbols"]), nodes)
        _check_tree(tree, len(configs))
        return DynamicChoice(template, configs, resolved, tree, "record")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:  # ScheduleConfigError too
        log.warning("ignoring unusable tuning record %s (%s); it will be rewritten",
                    record_location(workload), err)
        return None


def _check_tree(tree: Tree, variants: int) -> None:
    """Every node well formed and reached from the root once: a damaged record must not
    send dispatch into a loop or past the variants."""
    seen, stack = set(), [0]
    while stack:
        k = stack.pop()
        if k in seen or not 0 <= k < len(tree.nodes) or len(tree.nodes[k]) != 4:
            raise ValueError(f"tree node {k} is missing, malformed or reached twice")
        seen.add(k)
        feature, value, left, right = tree.nodes[k]
        if feature < 0:
            if not 0 <= value < variants:
                raise ValueError(f"leaf {k} chooses variant {value} of {variants}")
        elif feature >= len(tree.symbols):
            raise ValueError(f"node {k} tests symbol {feature} of {len(tree.symbols)}")
        else:
            stack += [left, right]
    if len(seen) != len(tree.nodes):
        raise ValueError("the tree has nodes its root does not reach")


def _as_dict(value) -> dict:
    return {f.name: getattr(value, f.name) for f in fields(value)}
