"""Construction of schedules without measuring: Gensor's Markov chain over ETIR states
(``tune.etir``), and a Roller-style greedy constructor as its baseline.

Gensor (Algorithm 1): from the smallest tiles, each step computes the benefit of every
action, picks one by roulette in proportion (the cache action's weight scaled by
g(t) = 3 / (1 + e^(-ln 5 / 10 (t - 10))), so the chain moves outward as it cools), and
keeps the state it reaches with probability 1 - 1 / (1 + e^(-0.5 (-ln T - 10))); the
temperature halves each step from T0 down to the threshold. Several chains run from
seeds 0, 1, ...; every complete state they kept (an incomplete one completed by caching
outward) is a candidate, and so are the template's level-0 point and the points of its
level-2 hardware-centric space (resolved, never run: ranking 150 points costs
milliseconds, and they hold register tiles, 6 x 32 say, that the chain's formulas, blind
to instruction counts, rarely reach). Candidates are ranked by an analytic latency
(``gemm_seconds``: compute, packing, accumulator and per-step terms with weights fitted
to measurements), evaluated on the *resolved* config (``Template.resolve``: what runs).
The method "space" ranks the space and the level-0 point alone, without the chain.

The paper leaves T0, the threshold and the chain count open; chosen here, not tuned:
T0 = 2^48 and a threshold of 1 (48 steps, enough to grow a register tile, an L1 block and
an L2 block), 8 chains. Deterministic for a given target, memory hierarchy and seed.

The greedy constructor grows, level by level, the tile dimension of highest tiling
benefit while one above 1 fits, then caches outward (and adds chains while they pay):
Roller's aligned construction, judged by the same formulas.

Templates take part through an adapter (``CONSTRUCTIONS``, by template name) that says
what to tile and how a state becomes the template's config; a template without one keeps
its level-0 point.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Callable

from treadle.ir.functor import free_vars
from treadle.schedule.template import Template, default_point, valid_points
from treadle.schedule.templates.gemm.config import GemmConfig, registers_needed
from treadle.schedule.templates.gemm.pattern import GemmPattern, product, role_extents
from treadle.schedule.templates.gemm.resolve import ResolvedGemm
from treadle.schedule.templates.gemm.space import L2_SHARE, tile_bytes
from treadle.target.cpu import CpuTarget
from treadle.target.memory import MemoryHierarchy, memory_hierarchy
from treadle.tune.etir import (State, TensorAccess, TilingProblem, actions, benefit, cache,
                               initial_state)
from treadle.tune.measure import SYMBOL_SIZE  # a symbolic extent's stand-in, as when measuring

T0 = 2.0 ** 48
THRESHOLD = 1.0
CHAINS = 8
MAX_K_BLOCK = 1024
METHODS = ("gensor", "greedy", "space")
SPACE_LEVEL = 2  # the hardware-centric space whose points "gensor" also ranks


@dataclass(frozen=True)
class Construction:
    """A template's part in construction: its tiling problem for a pattern, the config of
    a state, and the analytic latency of a resolved config."""
    problem: Callable[[Any, CpuTarget], TilingProblem]
    config: Callable[[State], Any]
    seconds: Callable[[Any, MemoryHierarchy], float]


def construct(template: Template, pattern: Any, target: CpuTarget, method: str = "gensor",
              seed: int = 0, memory: MemoryHierarchy | None = None) -> list[tuple[Any, Any]]:
    """(config, resolved) candidates of ``method``, best predicted first; the level-0
    point alone for a template without a construction."""
    default = default_point(template, pattern, target)
    adapter = CONSTRUCTIONS.get(template.name)
    if adapter is None:
        return [default]
    memory = memory or memory_hierarchy()
    problem = adapter.problem(pattern, target)
    if method not in METHODS:
        raise ValueError(f"construction method {method!r}: expected one of {METHODS}")
    states = []
    if method == "gensor":
        states = [s for k in range(CHAINS) for s in anneal(problem, memory, seed + k)]
    elif method == "greedy":
        states = [greedy(problem, memory)]
    configs = list(dict.fromkeys(adapter.config(s) for s in states))
    if method in ("gensor", "space"):
        configs += template.space(pattern, SPACE_LEVEL, target)
    points = [default, *valid_points(template, pattern, configs, target)]
    unique = {}
    for config, resolved in points:
        unique.setdefault(resolved, config)
    return sorted(((c, r) for r, c in unique.items()),
                  key=lambda point: adapter.seconds(point[1], memory))


# ---- the two constructors --------------------------------------------------------------

def cache_weight(step: int) -> float:
    """g(t): the cache action's weight grows as the chain cools (Gensor, IV-C)."""
    return 3 / (1 + math.exp(-math.log(5) / 10 * (step - 10)))


def keep_probability(temperature: float) -> float:
    return 1 - 1 / (1 + math.exp(-0.5 * (-math.log(temperature) - 10)))


def anneal(problem: TilingProblem, memory: MemoryHierarchy, seed: int) -> list[State]:
    """The complete states one seeded chain keeps (Algorithm 1)."""
    rng = random.Random(seed)
    state, kept, temperature, step = initial_state(problem), [], T0, 0
    while temperature > THRESHOLD:
        moves = actions(problem, state)
        weights = [benefit(problem, memory, state, label, after)
                   * (cache_weight(step) if label == "cache()" else 1.0)
                   for label, after in moves]
        if not any(weights):
            break
        state = rng.choices(moves, weights)[0][1]
        if rng.random() < keep_probability(temperature):
            kept.append(state)
        temperature, step = temperature / 2, step + 1
    kept.append(state)
    return [_completed(s) for s in kept]


def greedy(problem: TilingProblem, memory: MemoryHierarchy) -> State:
    """Roller-style: the best tiling move while one pays, then the next level out."""
    state = initial_state(problem)
    while True:
        moves = [(benefit(problem, memory, state, label, after), after)
                 for label, after in actions(problem, state)
                 if label.startswith("tile(") or label == "chain()"]
        best = max(moves, key=lambda m: m[0], default=(0.0, None))
        if best[0] > 1.0 + 1e-9:
            state = best[1]
        elif state.complete:
            return state
        else:
            state = cache(state)


def _completed(state: State) -> State:
    while not state.complete:
        state = cache(state)
    return state


# ---- the GEMM template -----------------------------------------------------------------

GEMM_LEVELS = ("registers", "L1", "L2", "L3")
B, M, N, K = range(4)  # dimensions of the GEMM problem


def gemm_problem(pattern: GemmPattern, target: CpuTarget) -> TilingProblem:
    """The GEMM's dimensions (batch, m, n, k), which each operand reads (from the roles
    of its axes in the compute definition), and the template's step lists and capacities:
    a register tile of whole SIMD vectors within the register file, an L1 block of the two
    micro-panels, an L2 macro-tile of whole register tiles in its share of L2, and every
    thread's tile together in half of L3."""
    extents = role_extents(pattern)
    sizes = tuple(_size(product(extents[r])) for r in ("batch", "m", "n", "k"))
    lanes, registers = target.lanes(), target.vector_registers
    tensors = tuple(TensorAccess(frozenset(d for d, role in enumerate(("batch", "m", "n", "k"))
                                           if _reads(factor, pattern, role)))
                    for factor in (pattern.left, pattern.right))
    tensors += (TensorAccess(frozenset({B, M, N}), output=True),)

    def steps(level: int, dim: int, inner: int) -> list[int]:
        if dim == B:
            return [1]
        if level == 0:
            if dim == M:
                return list(range(1, registers))
            if dim == N:
                return [lanes * v for v in range(1, registers // 2 + 1)]
            return [1]
        if level == 1 and dim == K:
            top = min(-(-sizes[K] // 16) * 16, MAX_K_BLOCK)
            return sorted({min(s, sizes[K]) for s in range(16, top + 1, 16)})
        if level == 2 and dim in (M, N):
            return [inner * k for k in range(1, max(1, -(-sizes[dim] // inner)) + 1)][:64]
        return [inner]

    def usages(state: State) -> list[float]:
        reg, l1, l2 = state.tiles[0], state.tiles[1], state.tiles[2]
        tile = tile_bytes(l2[M], l2[N], l2[K])
        return [registers_needed(reg[M], reg[N], target) / registers,
                (l1[M] + l1[N]) * l1[K] * 4 / target.l1d_bytes,
                tile / (L2_SHARE[2][1] * target.l2_bytes),
                target.cores * tile / (target.l3_bytes // 2)]
    return TilingProblem(("batch", "m", "n", "k"), sizes, tensors, GEMM_LEVELS, steps,
                         lambda s: max(usages(s)) <= 1, lambda s: usages(s)[s.level],
                         target.cores, max(2, target.cores))


def gemm_config(state: State) -> GemmConfig:
    reg, l1, l2 = state.tiles[0], state.tiles[1], state.tiles[2]
    return GemmConfig(block_m=l2[M], block_n=l2[N], block_k=l1[K], micro_m=reg[M],
                      micro_n=reg[N], split_k=state.chains)


# The model's terms, each in seconds at its level's nominal rate, and the weight of each:
# fitted (non-negative least squares on relative error, ``bench/construct.py --fit``) to
# the measured times of every level-2 point of the benchmark's GEMM-template operators.
# Fitted on an AMD EPYC (Zen 4, AVX-512, 2 threads) over 28 operators and 1330 points;
# cross-validated on two halves of the operators, the model's pick among each level-2
# space measured 0.92x and 0.95x the fastest (geometric means). "memory" and "blocks"
# fitted to 0: their time hides under the others on these shapes.
WEIGHTS = {"compute": 0.705, "pack_left": 5.834, "pack_right": 11.887, "panels": 2.342,
           "accumulators": 2.964, "memory": 0.0, "reduction": 1.58, "blocks": 0.0,
           "steps": 0.464}


def gemm_terms(gemm: ResolvedGemm, memory: MemoryHierarchy) -> dict[str, float]:
    """The terms of a resolved GEMM's predicted time (see gemm_seconds), in seconds:

        compute       multiply-adds over the peak, the register tile's efficiency (FMAs
                      against the loads that feed them, two of each per cycle) and the
                      balance of work items over the threads
        pack_left     A packed once per column block, through L2
        pack_right    B packed once per row block, through L2
        panels        laid-out weights read once per row block, from L3
        accumulators  the accumulators loaded and stored once per K block, in L1
        memory        every operand once from memory where all fits half of L3, else
                      what packing reads
        reduction     split K's final sum
        blocks        fixed time per macro-tile and K block, per thread, in 100 ns
        steps         the register tile's K steps per thread (loop and address work), in ns
    """
    cfg, threads = gemm.cfg, gemm.threads
    batch, m, n, k = (_size(gemm.size(r)) for r in ("batch", "m", "n", "k"))
    mr, nr, bm, bn, bk = cfg.micro_m, cfg.micro_n, cfg.block_m, cfg.block_n, cfg.block_k
    fmas, loads = mr * nr / 16, (mr + nr / gemm.lanes) / 2
    efficiency = fmas / max(fmas, loads)
    items = batch * math.ceil(m / bm) * math.ceil(n / bn) * cfg.split_k
    per_thread = math.ceil(items / threads) / items  # of all the work, the busiest's share
    macs = batch * math.ceil(m / mr) * mr * math.ceil(n / nr) * nr * k
    l1, l2, l3, dram = (memory.level(name) for name in ("L1", "L2", "L3", "DRAM"))
    left_packed = not gemm.in_place[0]
    right_packed = gemm.panels is None and not gemm.in_place[1]
    a_packed = 4 * batch * m * k * math.ceil(n / bn)
    b_packed = 4 * batch * k * n * math.ceil(m / bm)
    whole = 4 * batch * (m * k + k * n + m * n)
    k_blocks = math.ceil(k / cfg.split_k / bk) * cfg.split_k
    return {
        "compute": macs * per_thread / (memory.peak_gflops / 2 * 1e9 * efficiency),
        "pack_left": left_packed * a_packed * per_thread / (l2.bandwidth * 1e9),
        "pack_right": right_packed * b_packed * per_thread / (l2.bandwidth * 1e9),
        "panels": (gemm.panels is not None) * b_packed * per_thread / (l3.bandwidth * 1e9),
        "accumulators": 8 * batch * m * n * k_blocks * per_thread / (l1.bandwidth * 1e9),
        "memory": (whole if whole <= l3.capacity // 2 else a_packed + b_packed)
        / (dram.bandwidth * 1e9),
        "reduction": (cfg.split_k > 1) * 8 * batch * m * n * cfg.split_k
        / (l2.bandwidth * 1e9 * threads),
        "blocks": 1e-7 * math.ceil(items * math.ceil(k / cfg.split_k / bk) / threads),
        "steps": 1e-9 * macs * per_thread / (mr * nr),
    }


def gemm_seconds(gemm: ResolvedGemm, memory: MemoryHierarchy) -> float:
    """Predicted time of a resolved GEMM: the weighted sum of its terms (gemm_terms)."""
    return sum(WEIGHTS[name] * value for name, value in gemm_terms(gemm, memory).items())


def _size(extent) -> int:
    return extent if isinstance(extent, int) else SYMBOL_SIZE


def _reads(factor, pattern: GemmPattern, role: str) -> bool:
    return bool(set(pattern.axes(role)) & free_vars(factor))


CONSTRUCTIONS = {"gemm": Construction(gemm_problem, gemm_config, gemm_seconds)}
