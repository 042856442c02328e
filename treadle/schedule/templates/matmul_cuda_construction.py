"""What schedule construction (``tune.construct``) needs of the CUDA matmul template
(``matmul_cuda``): its tiling problem, the config of a state, and an analytic latency.

The tiling problem has the GEMM's dimensions (batch, m, n, k) and, as Gensor's GPU
states, a tile per level of the CUDA target's memory (``CudaTarget.memory()``):

    registers  a thread's tile, thread_m x thread_n, in runs of GROUP (4 to 16)
    shared     the block tile: a power-of-two count of thread tiles along m and along n
               (so the threads are a power of two: a whole number of warps from 32 on),
               and the K step of the slices staged in shared memory
    L2         the block tile itself (a grid of blocks shares L2): the level a complete
               state is at

Every level's tile keeps the template's upper limits (a thread tile's registers, threads
per block, shared bytes per block); the rules a growing block passes through on its way
(a whole number of warps, slices the threads share evenly) hold from the L2 level on, so
a chain leaves shared memory only with a block the template accepts. Step lists stop at
the first size covering the problem's extent. There are no accumulation chains: the
template does not split K.

The latency of a resolved config, in seconds: its blocks run in waves over the SMs, as
many at once per SM as its threads, registers and shared memory allow. One wave takes, on
one SM, the longest of these terms (and OVERLAP of the others):

    compute   the multiply-adds of its resident blocks (partial tiles compute whole) at
              the SM's peak, scaled down below FULL_WARPS resident warps (too few to
              hide the latency of the multiply-adds and shared loads)
    issue     the warp instructions, SCHEDULERS per cycle: a thin thread tile spends
              issue slots on loads that a GPU with as many lanes as slots cannot spare
    shared    every thread reads a column of A and a row of B per K from shared memory,
              and the block stores its slices there
    L2        every block reads its slices of A and B, (block_m + block_n) per K
    latency   per K step, a load from L2 and one from shared memory, overlapped by the
              resident blocks and the stages

and the whole is at least every operand and the output moved once at the DRAM bandwidth
of all SMs. A roofline with waves: enough to tell a tile that wastes the SMs (too few
blocks, a tail wave, padding) or starves them (too few warps, thin thread tiles) from a
good one; not fitted to measurements.
"""
from __future__ import annotations

import functools
import math
from typing import Mapping

from treadle.errors import ScheduleConfigError
from treadle.ir.expr import Var
from treadle.schedule.templates.gemm.construction import (B, K, M, N, operand_accesses,
                                                          problem_sizes)
from treadle.schedule.templates.gemm.pattern import ROLES, GemmPattern
from treadle.schedule.templates.matmul_cuda import (ELEMENT_BYTES, GROUP, MATMUL_CUDA,
                                                    MAX_TILE_REGISTERS, MatmulCudaConfig,
                                                    ResolvedMatmulCuda)
from treadle.schedule.tiling import State, TilingProblem
from treadle.target.cuda import CudaTarget
from treadle.target.memory import MemoryHierarchy

LEVELS = ("registers", "shared", "L2")
REGISTERS, SHARED, L2 = range(3)
THREAD_TILE_STEPS = tuple(range(GROUP, 4 * GROUP + 1, GROUP))
THREADS_ALONG = (1, 2, 4, 8, 16, 32)  # threads of a block along m or along n
K_STEPS = (8, 16, 32)
STAGES = 2  # a constructed config double-buffers its slices: one barrier per K step
# Registers a thread needs besides its tile and staged loads (addresses, indices, the
# loop), and the allocation's granularity: for occupancy only.
OTHER_REGISTERS = 32
REGISTER_GRANULE = 8
MAX_BLOCKS_PER_SM = 24  # Ada's limit, the lowest of the architectures in target.cuda
FULL_WARPS = 8  # two per scheduler of an SM
SCHEDULERS = 4  # warp instructions an SM issues per cycle
# The share of the terms that do not bound a wave still paid: an SM never overlaps its
# pipes perfectly, and without it configs at the same bound tie (a guess, not fitted).
OVERLAP = 0.25


def matmul_problem(pattern: GemmPattern, target: CudaTarget) -> TilingProblem:
    """The template's tiling problem for ``pattern`` on ``target`` (see the module)."""
    sizes = problem_sizes(pattern)

    def steps(level: int, dim: int, inner: int) -> list[int]:
        if dim == B or level == L2:
            return [inner]
        if level == REGISTERS:
            return _covering(THREAD_TILE_STEPS, sizes[dim]) if dim in (M, N) else [inner]
        if dim == K:
            return _covering(K_STEPS, sizes[K])
        return _covering([inner * t for t in THREADS_ALONG], sizes[dim])

    def fits(state: State) -> bool:
        cfg = matmul_config(state)
        if state.level == L2:
            return _accepted(pattern, cfg, target)
        return (cfg.tile_registers <= MAX_TILE_REGISTERS
                and cfg.threads <= target.max_threads_per_block
                and cfg.shared_bytes <= target.shared_bytes_per_block)

    def usage(state: State) -> float:
        cfg = matmul_config(state)
        if state.level == REGISTERS:
            return cfg.tile_registers / MAX_TILE_REGISTERS
        if state.level == SHARED:
            return cfg.shared_bytes / target.shared_bytes_per_block
        return target.sms * cfg.shared_bytes / target.l2_bytes  # a block's slices per SM
    return TilingProblem(ROLES, sizes, operand_accesses(pattern), LEVELS, steps, fits, usage,
                         target.sms)


def matmul_config(state: State) -> MatmulCudaConfig:
    thread, block = state.tiles[REGISTERS], state.tiles[SHARED]
    return MatmulCudaConfig(block_m=block[M], block_n=block[N], block_k=block[K],
                            thread_m=thread[M], thread_n=thread[N], stages=STAGES)


def matmul_seconds(resolved: ResolvedMatmulCuda, memory: MemoryHierarchy,
                   env: Mapping[Var, int] | None = None) -> float:
    """The predicted time of a resolved config with the symbols at ``env``'s values: its
    waves, each as long as its longest term (``wave_terms``) and OVERLAP of the others,
    or every operand and the output once at DRAM bandwidth."""
    cfg, target = resolved.config, resolved.target
    sizes = problem_sizes(resolved.pattern, env)
    batch, m, n, k = sizes
    waves = math.ceil(_blocks(cfg, sizes) / (target.sms * blocks_per_sm(cfg, target)))
    once = ELEMENT_BYTES * batch * (m * k + k * n + m * n)
    dram_ns = once / (memory.level("DRAM").bandwidth * target.sms)
    terms = wave_terms(resolved, memory, sizes).values()
    wave_ns = max(terms) + OVERLAP * (sum(terms) - max(terms))
    return 1e-9 * max(waves * wave_ns, dram_ns)


def wave_terms(resolved: ResolvedMatmulCuda, memory: MemoryHierarchy,
               sizes: tuple[int, ...] | None = None) -> dict[str, float]:
    """Nanoseconds one SM takes over a wave of its resident blocks (see the module), by
    what bounds it, at ``sizes`` (batch, m, n, k; by default the pattern's own)."""
    cfg, target = resolved.config, resolved.target
    sizes = sizes or problem_sizes(resolved.pattern)
    steps = math.ceil(sizes[K] / cfg.block_k)
    k = steps * cfg.block_k  # the last slice loads zeros
    # Blocks an SM runs together (one where there are none: an empty problem has no waves).
    at_once = max(1, min(blocks_per_sm(cfg, target),
                         math.ceil(_blocks(cfg, sizes) / target.sms)))
    warps = at_once * cfg.threads / target.warp_size
    cycle = memory.level("registers").latency_ns  # one cycle (target.cuda)
    slices = cfg.block_m + cfg.block_n  # elements of A and B a block stages per K
    # Per K and thread: the multiply-adds, the 128-bit shared loads that feed them, and
    # the staged loads and stores of the slices.
    instructions = (cfg.thread_m * cfg.thread_n + (cfg.thread_m + cfg.thread_n) / GROUP
                    + 2 * sum(cfg.loads_per_thread) / cfg.block_k)
    shared, l2 = memory.level("shared"), memory.level("L2")
    return {
        "compute": at_once * cfg.block_m * cfg.block_n * k
        / (memory.peak_gflops / 2 * min(1.0, warps / FULL_WARPS)),
        "issue": warps * instructions * k * cycle / SCHEDULERS,
        "shared": at_once * (cfg.threads * (cfg.thread_m + cfg.thread_n) + slices)
        * ELEMENT_BYTES * k / shared.bandwidth,
        "L2": at_once * slices * ELEMENT_BYTES * k / l2.bandwidth,
        "latency": steps * (l2.latency_ns + shared.latency_ns)
        / (at_once * cfg.stages),
    }


@functools.lru_cache(maxsize=1024)  # asked for every candidate at every size of a range
def blocks_per_sm(cfg: MatmulCudaConfig, target: CudaTarget) -> int:
    """Blocks of ``cfg`` an SM holds at once: its threads, registers and shared memory."""
    per_thread = min(target.max_registers_per_thread,
                     _round_up(cfg.tile_registers + sum(cfg.loads_per_thread)
                               + OTHER_REGISTERS, REGISTER_GRANULE))
    return max(1, min(target.max_threads_per_sm // cfg.threads,
                      target.registers_per_sm // (per_thread * cfg.threads),
                      target.shared_bytes_per_sm // cfg.shared_bytes, MAX_BLOCKS_PER_SM))


def _blocks(cfg: MatmulCudaConfig, sizes: tuple[int, ...]) -> int:
    batch, m, n, _ = sizes
    return batch * math.ceil(m / cfg.block_m) * math.ceil(n / cfg.block_n)


def _accepted(pattern: GemmPattern, cfg: MatmulCudaConfig, target: CudaTarget) -> bool:
    try:
        MATMUL_CUDA.check(pattern, cfg, target)
    except ScheduleConfigError:
        return False
    return True


def _covering(steps, extent: int) -> list[int]:
    """``steps`` up to the first that covers ``extent``: a larger tile only pads."""
    steps = list(steps)
    return steps[:next((i + 1 for i, s in enumerate(steps) if s >= extent), len(steps))]


def _round_up(value: int, granule: int) -> int:
    return -(-value // granule) * granule
