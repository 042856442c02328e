"""What schedule construction (``tune.construct``) needs of the CPU GEMM template: its
tiling problem (a register tile, an L1 block, an L2 macro-tile and every thread's tile in
L3), the config a state stands for, and the analytic latency the candidates are ranked
by (``gemm_seconds``: compute, packing, accumulator and per-step terms with weights
fitted to measurements), evaluated on the *resolved* config: what runs.
"""
from __future__ import annotations

import math
from typing import Mapping

from treadle.ir.expr import Var
from treadle.ir.functor import free_vars
from treadle.schedule.templates.gemm.config import GemmConfig, registers_needed
from treadle.schedule.templates.gemm.pattern import ROLES, GemmPattern, product, role_extents
from treadle.schedule.templates.gemm.resolve import ResolvedGemm
from treadle.schedule.templates.gemm.space import L2_SHARE, tile_bytes
from treadle.schedule.tiling import State, TensorAccess, TilingProblem, concrete
from treadle.target.cpu import CpuTarget
from treadle.target.memory import MemoryHierarchy

GEMM_LEVELS = ("registers", "L1", "L2", "L3")
B, M, N, K = range(4)  # dimensions of the GEMM problem
MAX_K_BLOCK = 1024


def gemm_problem(pattern: GemmPattern, target: CpuTarget) -> TilingProblem:
    """The GEMM's dimensions (batch, m, n, k), which each operand reads (from the roles
    of its axes in the compute definition), and the template's step lists and capacities:
    a register tile of whole SIMD vectors within the register file, an L1 block of the two
    micro-panels, an L2 macro-tile of whole register tiles in its share of L2, and every
    thread's tile together in half of L3."""
    sizes = problem_sizes(pattern)
    lanes, registers = target.lanes(), target.vector_registers
    tensors = operand_accesses(pattern)

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
    return TilingProblem(ROLES, sizes, tensors, GEMM_LEVELS, steps,
                         lambda s: max(usages(s)) <= 1, lambda s: usages(s)[s.level],
                         target.cores, max(2, target.cores))


def problem_sizes(pattern: GemmPattern, env: Mapping[Var, int] | None = None
                  ) -> tuple[int, ...]:
    """The extents of (batch, m, n, k) with the symbols at ``env``'s values, a symbolic
    one as construction counts it (``tiling.concrete``)."""
    extents = role_extents(pattern)
    return tuple(concrete(product(extents[r]), env) for r in ROLES)


def operand_accesses(pattern: GemmPattern) -> tuple[TensorAccess, ...]:
    """Which of (batch, m, n, k) each factor's index reads, and the output's (batch, m, n):
    the accesses of any GEMM-pattern template's tiling problem."""
    tensors = tuple(TensorAccess(frozenset(d for d, role in enumerate(ROLES)
                                           if _reads(factor, pattern, role)))
                    for factor in (pattern.left, pattern.right))
    return tensors + (TensorAccess(frozenset({B, M, N}), output=True),)


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


def gemm_terms(gemm: ResolvedGemm, memory: MemoryHierarchy,
               env: Mapping[Var, int] | None = None) -> dict[str, float]:
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
    batch, m, n, k = (concrete(gemm.size(r), env) for r in ROLES)
    mr, nr, bm, bn, bk = cfg.micro_m, cfg.micro_n, cfg.block_m, cfg.block_n, cfg.block_k
    fmas, loads = mr * nr / 16, (mr + nr / gemm.lanes) / 2
    efficiency = fmas / max(fmas, loads)
    items = batch * math.ceil(m / bm) * math.ceil(n / bn) * cfg.split_k
    # Of all the work, the busiest thread's share (of none, none).
    per_thread = math.ceil(items / threads) / items if items else 0.0
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


def gemm_seconds(gemm: ResolvedGemm, memory: MemoryHierarchy,
                 env: Mapping[Var, int] | None = None) -> float:
    """Predicted time of a resolved GEMM: the weighted sum of its terms (gemm_terms)."""
    return sum(WEIGHTS[name] * value for name, value in gemm_terms(gemm, memory, env).items())


def _reads(factor, pattern: GemmPattern, role: str) -> bool:
    return bool(set(pattern.axes(role)) & free_vars(factor))
