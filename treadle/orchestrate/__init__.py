"""Kernel orchestration (Korch): split operators into primitives, consider every kernel a
convex set of them can make, and let a solver pick the cheapest set that computes the
graph.

1. Fission (``graph.passes.fission``) turns composite operators into primitives.
2. The primitive graph is cut into parts of at most ``MAX_PART`` primitives at positions
   of its order where the greedy plan cuts too, fewest tensors crossing first; each part
   is solved alone, reading what earlier parts wrote.
3. In each part, candidate kernels are the differences of execution states
   (``orchestrate.states``) that treadle can build as one kernel
   (``orchestrate.primitives``), each writing either every result read outside it or
   only its last ones; the greedy plan's kernels, mapped onto the primitives, are
   candidates too, and so is each attention as one kernel, alone and with the greedy
   kernels' work around it (too large for the enumeration, and never cut by a part).
4. Candidates the roofline puts above their primitives run alone are dropped; the rest,
   most promising first and at most ``MAX_MEASURED`` per part, are built and measured
   (``orchestrate.cost``; cached, so identical layers are measured once).
5. The binary linear program (``orchestrate.blp``) picks kernels, bounded by the best
   plan without recomputation (a shortest path over execution states) or the greedy
   plan of the primitives, so the answer is never worse than either by measurement.
6. Korch's decision, in three comparisons: where greedy fusion of the model's own
   operators covers a part, it stays unless the chosen kernels beat it by ``MARGIN``
   (repeated measurements differ by a few percent); the whole model keeps greedy fusion
   unless the parts together beat it by as much; and built, the chosen kernels must run
   the model faster than greedy fusion's, timed interleaved in the model
   (``orchestrated``, the strategy the compiler driver registers).

Costs are measured by the target's timer; on a target with no device here (CUDA on a
machine without a GPU) they are the roofline's estimates instead, and the dump says so.

Under TREADLE_DUMP, ``orchestrate/`` holds the primitive graph, every candidate with its
estimate and cost, and each part's chosen kernels with the objective next to greedy's.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from treadle.dump import dump_folder, dump_text
from treadle.errors import DeviceUnavailableError, KernelError, TreadleError
from treadle.graph.graph import Graph
from treadle.graph.kernel_plan import Builder, KernelPlan, greedy, single
from treadle.graph.passes.fission import fission
from treadle.graph.tensor import Tensor
from treadle.orchestrate.blp import TIME_LIMIT_S, Infeasible, Option, run_order, solve
from treadle.orchestrate.cost import OrchestrationCache, estimate
from treadle.orchestrate.primitives import (NotAKernel, PrimitiveGraph, kernel_plan,
                                            writes_of)
from treadle.orchestrate.states import (bits, candidate_kernels, cheapest_path,
                                        execution_states)
from treadle.runtime.executor import Executable
from treadle.runtime.inputs import random_input
from treadle.schedule.fusion import fused_kernel
from treadle.timing import interleaved_medians
from treadle.tune.choice import measurement_progress
from treadle.tune.kernel import KernelMaker

log = logging.getLogger(__name__)

MAX_PART = 32
MAX_MEASURED = 400
# How much faster by measurement the chosen kernels must be to replace greedy fusion:
# repeated measurements of one kernel differ by a few percent.
MARGIN = 0.05


@dataclass
class Candidate:
    members: int  # primitives, as a bitmask of the primitive graph
    plan: KernelPlan
    estimate: float
    full: bool  # writes every result read outside it: one step of a plan without recomputing
    greedy: bool = False
    cost: float | None = None


# Measures candidates' plans: seconds per call each, None where one failed.
Measure = Callable[[Sequence[KernelPlan]], list]


@dataclass
class Summary:
    """What one orchestration did; times in seconds."""
    primitives: int = 0
    parts: int = 0
    states: int = 0
    candidates: int = 0
    measured: int = 0  # candidates with a cost (built and timed, or from the cache)
    solving: float = 0.0
    objective: float = 0.0  # the chosen kernels' measured total
    greedy: float = 0.0  # greedy fusion of the model's own operators, measured alike
    orchestrated: bool = False  # False: greedy fusion was no slower, and stays
    seconds: float = 0.0


@dataclass
class Orchestration:
    graph: Graph  # the primitive graph, or the model's own where greedy fusion stays
    plans: list[KernelPlan]
    summary: Summary


def orchestrated(graph: Graph, builder: Builder, measure: Measure | None = None
                 ) -> Executable:
    """The executable of ``graph`` with the kernels orchestration chooses, where they run
    the model faster than greedy fusion's (timed in the model, on random inputs of its
    constant shapes); greedy fusion's otherwise. ``measure`` replaces measuring
    candidates, for tests."""
    done = orchestrate(graph, builder.maker, measure)
    if done.graph is graph:  # greedy fusion stayed
        return builder.executable(graph, done.plans)
    chosen = builder.executable(done.graph, done.plans)
    if not all(isinstance(d, int) for t in graph.inputs for d in t.shape):
        return chosen
    with dump_folder("greedy fusion"):
        own = builder.executable(graph, greedy(graph))
    return _faster_in_context(chosen, own, graph)


# Calls of each model timed, interleaved, before choosing orchestrated kernels over greedy
# fusion: their costs measured alone overstate what fusing saves between the model's
# other kernels (Segformer-B0 ran 5% slower on a predicted 15% gain).
CONTEXT_CALLS = 10


def _faster_in_context(chosen: Executable, own: Executable, graph: Graph) -> Executable:
    """``chosen`` where it runs faster than ``own`` on random inputs of ``graph``'s
    constant shapes, else ``own``; ``chosen`` where the inputs fail a check of the
    model's or the target has no device here to run them."""
    rng = np.random.default_rng(0)
    inputs = [random_input(rng, t.dtype.numpy, t.shape) for t in graph.inputs]
    try:
        seconds = interleaved_medians({"chosen": lambda: chosen(*inputs),
                                       "own": lambda: own(*inputs)}, CONTEXT_CALLS, idle=0.0)
    except (KernelError, DeviceUnavailableError) as err:
        log.info("orchestrated kernels kept untimed: %s", err)
        dump_text(("orchestrate", "in_context.txt"), f"not timed in the model: {err}")
        return chosen
    keep = seconds["chosen"] < seconds["own"]
    report = (f"orchestrated {seconds['chosen'] * 1e3:.3f} ms, greedy fusion "
              f"{seconds['own'] * 1e3:.3f} ms a call in the model: keeping "
              f"{'orchestrated kernels' if keep else 'greedy fusion'}")
    log.info(report)
    dump_text(("orchestrate", "in_context.txt"), report)
    return chosen if keep else own


def orchestrate(graph: Graph, maker: KernelMaker, measure: Measure | None = None,
                time_limit: float = TIME_LIMIT_S) -> Orchestration:
    """The kernels of ``graph``, chosen by the program over measured candidates made by
    ``maker`` (its target and tuning level), and the graph they compute (``measure``
    replaces measuring, for tests); greedy fusion of the model's own operators where the
    choice is no faster by measurement."""
    _require_scipy()
    start = time.perf_counter()
    target, tune = maker.target, maker.tune
    # Chosen kernels are kept only for measured costs: given ones (tests) choose anew.
    cache = OrchestrationCache(target) if measure is None else None
    measure = measure or _measurer(maker, cache)
    pg = PrimitiveGraph.of(fission(graph), target)
    dump_text(("orchestrate", "primitives.txt"), _format_primitives(pg))
    own = greedy(graph)  # greedy fusion of the model's own operators
    seeds = _greedy_members(pg, pg.graph, greedy(pg.graph))
    composites = _greedy_members(pg, graph, own)
    summary = Summary(primitives=len(pg.ops))
    if not pg.ops:  # outputs are inputs or constants: no kernel to choose
        return Orchestration(graph, own, summary)
    plans: list[KernelPlan] = []
    reports, texts = [], []
    # No part cuts an attention, nor the greedy kernels its largest candidate takes in.
    attentions = [(core | _around(core, seeds), ()) for core in pg.attention_cores]
    for part in _parts(pg, seeds + attentions):
        texts.append(_part_text(pg, part, tune))
        try:
            chosen, report = _part_plans(pg, part, texts[-1], seeds, composites, measure,
                                         time_limit, summary, cache)
        except Infeasible:
            log.warning("orchestration: too many candidates failed to compute a part of "
                        "%s; keeping greedy fusion", graph.name)
            return Orchestration(graph, own, summary)
        plans += chosen
        reports.append(report)
    summary.greedy = _greedy_cost(own, measure, cache, "\n".join(texts))
    # As for a part: the parts' costs, measured alone, overstate what fusing saves between
    # a model's other kernels (Segformer-B0 ran 5% slower on a predicted 1% gain).
    summary.orchestrated = summary.objective < summary.greedy * (1 - MARGIN)
    summary.seconds = time.perf_counter() - start
    reports.insert(0, f"objective {summary.objective * 1e6:.1f} us, greedy fusion of the "
                      f"model's own operators {summary.greedy * 1e6:.1f} us: "
                      f"{'orchestrated' if summary.orchestrated else 'keeping greedy fusion'}")
    dump_text(("orchestrate", "plan.txt"), "\n\n".join(reports))
    if not summary.orchestrated:
        return Orchestration(graph, own, summary)
    return Orchestration(pg.graph, plans, summary)


def _part_plans(pg: PrimitiveGraph, part: int, text: str, seeds, composites,
                measure: Measure, time_limit: float, summary: Summary,
                cache: OrchestrationCache | None) -> tuple[list[KernelPlan], str]:
    """The part's kernels, from the cache where they are stored (by ``text``), and what
    the dump says of them."""
    stored = None if cache is None else _stored(pg, part, cache.part(text))
    if stored is not None:
        chosen, objective = stored
        summary.parts += 1
        summary.objective += objective
        return chosen, (f"part of {part.bit_count()} primitives: {len(chosen)} kernels "
                        f"from the cache, {objective * 1e6:.1f} us")
    inside = [s for s in seeds if s[0] & part]
    extra = [s for s in composites if s[0] & part == s[0]]
    chosen, objective, report = _orchestrate_part(pg, part, inside, extra, measure,
                                                  time_limit, summary)
    if cache is not None:
        cache.store_part(text, _storable(pg, part, chosen, objective))
    return [c.plan for c in chosen], report


def _greedy_cost(plans: Sequence[KernelPlan], measure: Measure,
                 cache: OrchestrationCache | None, text: str) -> float:
    """The measured cost of greedy fusion's ``plans``, kept with the parts' kernels
    (``text`` describes them all)."""
    key = f"greedy fusion of\n{text}"
    stored = None if cache is None else cache.part(key)
    if stored is not None and isinstance(stored.get("objective"), (int, float)):
        return float(stored["objective"])
    cost = _cost_of(plans, measure)
    if cache is not None:
        cache.store_part(key, {"objective": cost})
    return cost


def _part_text(pg: PrimitiveGraph, part: int, tune: int | str) -> str:
    """What decides a part's kernels: each primitive's type, attributes and tensors (by
    position in the part, or an outside tensor's number, type and shape, and which
    results later parts read), the tuning level, and the orchestrator's source."""
    local = {id(pg.ops[p]): k for k, p in enumerate(bits(part))}
    outside: dict[int, int] = {}
    required = _required(pg, part)
    lines = [f"tune {tune}", f"source {_source_digest()}"]
    for p in bits(part):
        op = pg.ops[p]
        reads = []
        for t in op.inputs:
            if t is None:
                reads.append("-")
            elif t.producer is not None and id(t.producer) in local:
                reads.append(f"p{local[id(t.producer)]}.{t.producer.outputs.index(t)}")
            else:
                number = outside.setdefault(id(t), len(outside))
                kind = "constant" if t.is_constant else "input"
                reads.append(f"{kind}{number}:{t.dtype}{list(t.shape)}")
        writes = [f"{t.dtype}{list(t.shape)}{' read after' if id(t) in required else ''}"
                  for t in op.outputs]
        lines.append(f"{op.op_type} {sorted(op.attrs.items())!r} ({', '.join(reads)}) "
                     f"-> {', '.join(writes)}")
    return "\n".join(lines)


@functools.lru_cache(maxsize=None)
def _source_digest() -> str:
    """The source of the orchestrator, fission and the fused attention kernel: a change to
    any chooses anew."""
    package = Path(__file__).resolve().parent
    files = sorted(package.glob("*.py")) + [
        package.parent / "graph" / "passes" / "fission.py",
        package.parent / "schedule" / "templates" / "attention_cpu.py"]
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:16]


def _storable(pg: PrimitiveGraph, part: int, chosen: Sequence[Candidate],
              objective: float) -> dict:
    """The part's kernels as positions within it: each kernel's members (a mask over the
    part's primitives) and the results it writes (primitive, output)."""
    position = {p: k for k, p in enumerate(bits(part))}
    index = {id(op): k for k, op in enumerate(pg.ops)}
    kernels = []
    for c in chosen:
        members = sum(1 << position[p] for p in bits(c.members))
        writes = [[position[index[id(t.producer)]], t.producer.outputs.index(t)]
                  for t in c.plan.outputs]
        kernels.append([members, writes])
    return {"kernels": kernels, "objective": objective}


def _stored(pg: PrimitiveGraph, part: int, data: dict | None
            ) -> tuple[list[KernelPlan], float] | None:
    """The kernels stored for the part, rebuilt over its primitives; None where there are
    none or they do not fit it (a damaged entry is chosen anew)."""
    if data is None:
        return None
    local = list(bits(part))
    try:
        plans = []
        for members, writes in data["kernels"]:
            mask = sum(1 << local[k] for k in range(len(local)) if members >> k & 1)
            tensors = [pg.ops[local[p]].outputs[k] for p, k in writes]
            plans.append(kernel_plan(pg, mask, tensors))
        return plans, float(data["objective"])
    except (KeyError, IndexError, TypeError, ValueError, NotAKernel) as err:
        log.warning("orchestration: a stored plan does not fit its part (%s); choosing anew",
                    err)
        return None


def _require_scipy() -> None:
    try:
        importlib.import_module("scipy.optimize")
    except ImportError as err:
        raise ImportError("orchestration solves a binary linear program with scipy, which "
                          "is not installed: pip install 'treadle[orchestrate]'") from err


def _greedy_members(pg: PrimitiveGraph, graph: Graph, plans: Sequence[KernelPlan]
                    ) -> list[tuple[int, tuple[Tensor, ...]]]:
    """Each of ``plans`` (kernels of ``graph``, which fission turned into ``pg``) as the
    primitives computing what it writes from what other kernels write, and those
    tensors; found by name, since fission gives a replaced tensor its old name as an
    alias. A plan whose results fission rewrote away is left out."""
    by_name: dict[str, Tensor] = {}
    for t in pg.graph.tensors:
        for name in (t.name, *t.aliases):
            by_name.setdefault(name, t)
    index = {id(op): k for k, op in enumerate(pg.ops)}
    produced = {t.name: plan for plan in plans for op in plan.ops for t in op.outputs}
    found = []
    for plan in plans:
        if any(t.name not in by_name for t in plan.outputs):
            continue
        stop = {id(by_name[name]) for name, owner in produced.items()
                if owner is not plan and name in by_name}
        members = _computing([by_name[t.name] for t in plan.outputs], stop, index)
        if members:
            found.append((members, tuple(by_name[t.name] for t in plan.outputs)))
    return found


def _computing(outputs: list[Tensor], stop: set[int], index: dict[int, int]) -> int:
    """The primitives (numbered by ``index``) computing ``outputs`` from the tensors in
    ``stop``, graph inputs and constants."""
    found = 0
    stack = list(outputs)
    while stack:
        t = stack.pop()
        if id(t) in stop or t.producer is None or id(t.producer) not in index:
            continue
        k = index[id(t.producer)]
        if not found >> k & 1:
            found |= 1 << k
            stack += [u for u in t.producer.inputs if u is not None]
    return found


def _cost_of(plans: Sequence[KernelPlan], measure: Measure) -> float:
    """The measured cost of running ``plans`` as the compiler builds them: a plan that
    does not fuse as one kernel runs as one kernel per operator."""
    costs = measure(plans)
    total = 0.0
    for plan, cost in zip(plans, costs):
        if cost is None:
            singles = measure([single(op) for op in plan.ops])
            cost = float("inf") if None in singles else sum(singles)
        total += cost
    return total


def _parts(pg: PrimitiveGraph, seeds) -> list[int]:
    """The primitives in parts of at most MAX_PART (where a cut exists), cut between
    positions no greedy kernel spans, fewest tensors crossing first."""
    n = len(pg.ops)
    spanned = [False] * (n + 1)
    for members, _ in seeds:
        low, high = (members & -members).bit_length() - 1, members.bit_length() - 1
        for i in range(low + 1, high + 1):
            spanned[i] = True
    parts, start = [], 0
    while n - start > MAX_PART:
        cuts = [i for i in range(start + MAX_PART // 2, start + MAX_PART + 1) if not spanned[i]]
        if not cuts:
            cuts = [i for i in range(start + MAX_PART + 1, n) if not spanned[i]][:1]
            if not cuts:
                break
        cut = min(reversed(cuts), key=lambda i: _crossing(pg, i))
        parts.append(((1 << cut) - 1) & ~((1 << start) - 1))
        start = cut
    parts.append(((1 << n) - 1) & ~((1 << start) - 1))
    return parts


def _crossing(pg: PrimitiveGraph, cut: int) -> int:
    """How many tensors primitives before ``cut`` write for primitives after it."""
    before = {id(op) for op in pg.ops[:cut]}
    return len({id(t) for op in pg.ops[cut:] for t in op.inputs
                if t is not None and id(t.producer) in before})


def _orchestrate_part(pg: PrimitiveGraph, part: int, seeds, extra, measure: Measure,
                      time_limit: float, summary: Summary
                      ) -> tuple[list[Candidate], float, str]:
    """The part's chosen kernels, their cost and what the dump says of them, counted in
    ``summary``; ``seeds`` are the greedy kernels of the primitive graph, ``extra`` those
    of the model's own operators (a Softmax kept whole), as candidates."""
    start = time.perf_counter()
    required = _required(pg, part)
    candidates, states = _candidates(pg, part, seeds, extra, required)
    candidates[len(candidates):] = _attention_candidates(pg, part, seeds, required, candidates)
    _measure(candidates, measure)
    usable = [c for c in candidates if c.cost is not None]
    written = {id(t) for p in bits(part) for t in pg.ops[p].outputs}
    options = [_option(c, written) for c in usable]
    greedy_plan = _incumbent(seeds, usable)
    greedy_cost = sum(usable[k].cost for k in greedy_plan)
    path = _cheapest_path(pg, part, usable)
    incumbent = path[0] if path is not None and path[1] < greedy_cost else greedy_plan
    solution = solve(options, frozenset(required), incumbent, time_limit)
    chosen, objective = [usable[k] for k in solution.chosen], solution.objective
    # The model's own fusion where it covers the part and the choice gains too little.
    own = run_order(options, _incumbent(extra, usable), frozenset(required)) if extra else None
    kept = bool(own) and solution.objective > sum(usable[k].cost for k in own) * (1 - MARGIN)
    if kept:
        chosen, objective = [usable[k] for k in own], sum(usable[k].cost for k in own)
    verdict = "the model's own fusion stays" if kept else "chosen"
    report = "\n".join([
        f"part of {part.bit_count()} primitives: {states} states, {len(candidates)} "
        f"candidates, {len(usable)} measured", f"objective {solution.objective * 1e6:.1f} us "
        f"(greedy {greedy_cost * 1e6:.1f} us, without recomputing "
        f"{'-' if path is None else f'{path[1] * 1e6:.1f} us'}), "
        f"{'optimal' if solution.optimal else 'best found in time'}, "
        f"solved in {solution.seconds:.2f} s, part took {time.perf_counter() - start:.1f} s",
        f"{verdict}: {objective * 1e6:.1f} us",
        *(f"  {_describe(pg, c)}" for c in chosen),
        "candidates:", *(f"  {_describe(pg, c)}" for c in candidates)])
    summary.parts += 1
    summary.states += states
    summary.candidates += len(candidates)
    summary.measured += len(usable)
    summary.solving += solution.seconds
    summary.objective += objective
    return chosen, objective, report


def _cheapest_path(pg: PrimitiveGraph, part: int, usable: list[Candidate]
                   ) -> tuple[list[int], float] | None:
    """The best plan computing each primitive of the part once (``states.cheapest_path``)
    over the candidates that write everything read outside them."""
    steps = [k for k, c in enumerate(usable) if c.full]
    kernels = [(usable[k].members, _reads(pg, usable[k].members) & part) for k in steps]
    found = cheapest_path(kernels, [usable[k].cost for k in steps], part)
    return None if found is None else ([steps[k] for k in found[0]], found[1])


def _reads(pg: PrimitiveGraph, members: int) -> int:
    """The primitives outside ``members`` that they read from."""
    found = 0
    for p in bits(members):
        found |= pg.producers[p]
    return found & ~members


def _incumbent(seeds, usable: list[Candidate]) -> list[int]:
    """The greedy plan among the usable candidates: its kernels, and where one failed to
    build as one kernel, its primitives one by one (as the compiler then builds it);
    empty where even that is not possible."""
    index = {(c.members, _ids(c.plan.outputs)): k for k, c in enumerate(usable)}
    singles = {c.members: k for k, c in enumerate(usable) if c.members.bit_count() == 1}
    chosen: dict[int, None] = {}
    for members, writes in seeds:
        if (members, _ids(writes)) in index:
            chosen[index[(members, _ids(writes))]] = None
        elif all(1 << p in singles for p in bits(members)):
            chosen.update((singles[1 << p], None) for p in bits(members))
        else:
            return []
    return list(chosen)


def _required(pg: PrimitiveGraph, part: int) -> set[int]:
    """The tensors the part must write: graph outputs and what later parts read."""
    outputs = {id(t) for t in pg.graph.outputs}
    found = set()
    for p in bits(part):
        for t in pg.ops[p].outputs:
            readers = pg.consumers(t)
            if id(t) in outputs or any(not part >> r & 1 for r in readers):
                found.add(id(t))
    return found


def _candidates(pg: PrimitiveGraph, part: int, seeds, extra, required: set[int]
                ) -> tuple[list[Candidate], int]:
    """The part's buildable candidates (greedy's first), promising ones first, and how
    many execution states they came from."""
    local = list(bits(part))
    position = {p: k for k, p in enumerate(local)}
    producers = [sum(1 << position[q] for q in bits(pg.producers[p] & part)) for p in local]
    states = execution_states(producers)
    found: dict[tuple, Candidate] = {}
    for members, writes in [*seeds, *extra]:
        try:
            plan = kernel_plan(pg, members, writes)
        except NotAKernel:
            continue
        found.setdefault((members, _ids(plan.outputs)),
                         _candidate(pg, members, plan, required, greedy=True))
    singles = {}
    for kernel in candidate_kernels(producers, states):
        members = sum(1 << local[k] for k in bits(kernel))
        for sinks_only in (False, True):
            writes = writes_of(pg, members, required, sinks_only)
            if not writes:
                continue
            try:
                plan = kernel_plan(pg, members, writes)
            except NotAKernel:
                continue
            key = (members, _ids(plan.outputs))
            if key not in found:
                found[key] = _candidate(pg, members, plan, required)
            if members.bit_count() == 1:
                singles[members] = found[key].estimate
    saving = {id(c): sum(singles.get(1 << p, 0.0) for p in bits(c.members)) - c.estimate
              for c in found.values()}
    kept = [c for c in found.values()
            if c.greedy or c.members.bit_count() == 1 or saving[id(c)] > 0]
    kept.sort(key=lambda c: (not c.greedy, c.members.bit_count() != 1, -saving[id(c)]))
    return kept[:max(MAX_MEASURED, sum(1 for c in kept if c.greedy
                                       or c.members.bit_count() == 1))], len(states)


def _around(core: int, seeds) -> int:
    """The primitives outside ``core`` of the greedy kernels that share one with it."""
    found = 0
    for members, _ in seeds:
        if members & core:
            found |= members
    return found & ~core


def _attention_candidates(pg: PrimitiveGraph, part: int, seeds, required: set[int],
                          known: Sequence[Candidate]) -> list[Candidate]:
    """Fused attention kernels (``orchestrate.primitives.attention_core``) of the part,
    too large for the enumeration and always measured: the attention alone, with the
    greedy kernels' work before it, after it or both, and with the layout primitives
    it reads through, where each builds as one kernel."""
    seen = {(c.members, _ids(c.plan.outputs)) for c in known}
    found = []
    for core in pg.attention_cores:
        if core & ~part:
            continue
        around = _around(core, seeds) & part
        before = around & _ancestors(pg, core)
        after = around & ~before
        moves = _moves_into(pg, core) & part
        for members in dict.fromkeys((core, core | before, core | after, core | before | after,
                                      core | moves, core | moves | after)):
            writes = writes_of(pg, members, required, sinks_only=False)
            try:
                plan = kernel_plan(pg, members, writes)
            except NotAKernel as err:
                log.debug("orchestration: no attention kernel of %d primitives: %s",
                          members.bit_count(), err)
                continue
            if (members, _ids(plan.outputs)) not in seen:
                seen.add((members, _ids(plan.outputs)))
                found.append(_candidate(pg, members, plan, required))
    return found


def _moves_into(pg: PrimitiveGraph, members: int) -> int:
    """The layout primitives (slices, reshapes, transposes) ``members`` read through, up
    to the first primitive that computes: Q, K and V cut out of one projection's result,
    which a kernel reads in place instead of copying."""
    found, frontier = 0, _reads(pg, members)
    while frontier:
        layout = 0
        for p in bits(frontier):
            if pg.categories[p] == "layout":
                layout |= 1 << p
        found |= layout
        frontier = _reads(pg, layout) & ~found
    return found


def _ancestors(pg: PrimitiveGraph, members: int) -> int:
    """The primitives ``members`` depend on, outside them."""
    found, frontier = 0, _reads(pg, members)
    while frontier:
        found |= frontier
        frontier = _reads(pg, frontier) & ~found
    return found & ~members


def _candidate(pg: PrimitiveGraph, members: int, plan: KernelPlan, required: set[int],
               greedy: bool = False) -> Candidate:
    full = _ids(plan.outputs) == _ids(writes_of(pg, members, required, sinks_only=False))
    return Candidate(members, plan, estimate(plan, pg.target), full, greedy)


def _ids(tensors: Sequence[Tensor]) -> frozenset[int]:
    return frozenset(id(t) for t in tensors)


def _measure(candidates: list[Candidate], measure: Measure) -> None:
    for c, seconds in zip(candidates, measure([c.plan for c in candidates])):
        c.cost = seconds


def _option(c: Candidate, written: set[int]) -> Option:
    """The candidate in the program: it reads those of ``written`` (the tensors this
    part's primitives compute) that it does not compute itself."""
    return Option(_ids(c.plan.outputs), frozenset(id(t) for t in c.plan.inputs
                                                  if id(t) in written), c.cost)


def _describe(pg: PrimitiveGraph, c: Candidate) -> str:
    names = ", ".join(f"{pg.ops[p].op_type}[{pg.ops[p].name}]" for p in bits(c.members))
    cost = "failed" if c.cost is None else f"{c.cost * 1e6:.1f} us"
    writes = ", ".join(t.name for t in c.plan.outputs)
    return (f"{cost} (estimate {c.estimate * 1e6:.1f} us){' greedy' if c.greedy else ''}: "
            f"{{{names}}} -> {writes}")


def _format_primitives(pg: PrimitiveGraph) -> str:
    return "\n".join(f"{k}: {category:11s} {op!r}"
                     for k, (op, category) in enumerate(zip(pg.ops, pg.categories)))


def _warn_skipped(skipped: Counter, warned: set) -> None:
    """One warning per reason: candidates that share a name and an error (the same fusion
    tried with several neighbours, or measured again in context) would otherwise repeat
    one line many times."""
    for (name, reason), count in skipped.items():
        if (name, reason) in warned:
            continue
        warned.add((name, reason))
        times = f" ({count} candidates)" if count > 1 else ""
        log.warning("orchestration: candidate %s is skipped: %s%s", name, reason, times)


def _measurer(maker: KernelMaker, cache: OrchestrationCache) -> Measure:
    """Builds each plan's kernel as the compiler will (with ``maker``) and measures it; a
    view costs nothing, a plan that fails to build is skipped. Where the target has no
    device here, every cost is the roofline's estimate."""
    warned: set = set()
    analytic: list[str] = []  # why costs are estimated, once they are

    def measure(plans: Sequence[KernelPlan]) -> list:
        if not analytic:
            with dump_folder("candidates"):  # each candidate's schedule, apart from the model's
                try:
                    return _measured(plans)
                except DeviceUnavailableError as err:
                    analytic.append(str(err))
                    log.info("orchestration: costs are roofline estimates: %s", err)
                    dump_text(("orchestrate", "cost_source.txt"),
                              f"roofline estimates, not measurements: {err}")
        return [estimate(plan, maker.target) for plan in plans]

    def _measured(plans: Sequence[KernelPlan]) -> list:
        functions, where, labels = [], [], []
        costs: list = [0.0 if p.is_view else None for p in plans]
        skipped: Counter = Counter()
        for k, plan in enumerate(plans):
            if plan.is_view:
                continue
            try:
                kernel = fused_kernel(plan, f"candidate{k}", maker)
            except TreadleError as err:
                skipped[plan.name, str(err)] += 1
                continue
            functions.append(kernel.function)
            where.append(k)
            labels.append(plan.name)
        _warn_skipped(skipped, warned)
        with measurement_progress(len(functions), "orchestration") as bar:
            seconds = cache.measure(functions, labels, bar.update)
        for k, s in zip(where, seconds):
            costs[k] = s
        return costs
    return measure
