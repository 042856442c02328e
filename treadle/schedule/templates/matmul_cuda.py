"""The CUDA matrix-multiplication template (Hidet's, section 5 of the paper), for every
compute the GEMM pattern matches (MatMul, batched products, convolution as implicit
GEMM), in the steps of the template protocol.

A block computes a ``block_m x block_n`` tile of C. Its threads load the next
``block_m x block_k`` slice of A and ``block_k x block_n`` slice of B cooperatively (a task
mapping spreads the elements over the threads, consecutive threads along whichever of K
and the rows is contiguous in the factor's memory, so the loads coalesce), through
registers into shared memory, while they
multiply the slices already there (double buffering, ``stages=2``: one barrier per step).
Each thread accumulates a ``thread_m x thread_n`` register tile. Its rows and columns come
in groups of four, the groups of neighbouring threads side by side: a warp reads a row of
a slice as consecutive 16-byte words (no bank conflicts; ptxas makes them 128-bit loads),
and writes C in runs of four.

Prologues are already inside the pattern's factors (A is evaluated at the unravelled
(batch, m, k), so a convolution's im2col addressing happens at the global loads) and the
epilogue is applied at the stores: post-scheduling fusion as on the CPU. Partial tiles
load zeros and skip their stores, so any size works, symbolic ones included.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Mapping

from treadle.errors import ScheduleConfigError
from treadle.graph.operator import Operator
from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import float32
from treadle.ir.expr import Buffer, Expr, Load, Var, as_expr, logical_and
from treadle.ir.functor import free_vars, substitute, walk
from treadle.ir.mapping import repeat, spatial, unravel
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import canonical_kernel
from treadle.schedule.templates.gemm import gemm_workload
from treadle.schedule.templates.gemm.pattern import (ROLES, GemmPattern, declare_parameters,
                                                     match_gemm_output, product, role_extents)
from treadle.schedule.tiling import State, TilingProblem, known
from treadle.target.cuda import CudaTarget
from treadle.target.memory import MemoryHierarchy

ELEMENT_BYTES = 4
GROUP = 4  # a thread's rows and columns come in runs of this many (one 128-bit word)
# Padding of each K row of a slice in shared memory: where neighbouring threads load
# consecutive K (and store a column of the K-major slice), their stores then fall into
# distinct banks.
PAD = 4
# Above this many registers a thread's tile would spill (255 is the hardware's limit;
# addressing and the staged loads need the rest).
MAX_TILE_REGISTERS = 160


@dataclass(frozen=True)
class MatmulCudaConfig:
    block_m: int = 128
    block_n: int = 128
    block_k: int = 8
    thread_m: int = 8
    thread_n: int = 8
    stages: int = 2

    @property
    def threads(self) -> int:
        return (self.block_m // self.thread_m) * (self.block_n // self.thread_n)

    @property
    def shared_bytes(self) -> int:
        return (self.stages * self.block_k * (self.block_m + self.block_n + 2 * PAD)
                * ELEMENT_BYTES)

    @property
    def tile_registers(self) -> int:
        """Registers of a thread's accumulators and the A column and B row they multiply."""
        return self.thread_m * self.thread_n + self.thread_m + self.thread_n

    @property
    def loads_per_thread(self) -> tuple[int, int]:
        """Elements of the A and the B slice each thread stages per step."""
        return (self.block_m * self.block_k // self.threads,
                self.block_k * self.block_n // self.threads)


@dataclass(frozen=True)
class ResolvedMatmulCuda:
    pattern: GemmPattern
    config: MatmulCudaConfig
    target: CudaTarget


BLOCKS = ((32, 32), (64, 32), (32, 64), (64, 64), (128, 64), (64, 128), (128, 128))
THREAD_TILES = ((4, 4), (4, 8), (8, 4), (8, 8))


class MatmulCudaTemplate:
    name = "matmul_cuda"
    config_type = MatmulCudaConfig

    def match(self, op: Operator) -> GemmPattern | None:
        if len(op.definition) != 1:
            return None
        pattern = match_gemm_output(op.definition[0])
        if pattern is None:
            return None
        return replace(pattern, inputs=tuple(op.input_buffers), checks=tuple(op.checks))

    def space(self, pattern: GemmPattern, level: int, target: CudaTarget
              ) -> list[MatmulCudaConfig]:
        """Level 0: the largest block tile that still gives every SM a block (the
        smallest where none does); otherwise every valid combination of block tile, K
        step, thread tile and stages (under 200 points), largest blocks first."""
        if level == 0:
            return [_default(pattern, target)]
        configs = []
        for (bm, bn), bk, (tm, tn), stages in itertools.product(
                reversed(BLOCKS), (8, 16), THREAD_TILES, (2, 1)):
            cfg = MatmulCudaConfig(bm, bn, bk, tm, tn, stages)
            try:
                self.check(pattern, cfg, target)
            except ScheduleConfigError:
                continue
            configs.append(cfg)
        return configs

    def check(self, pattern: GemmPattern, cfg: MatmulCudaConfig, target: CudaTarget) -> None:
        rules = [
            (cfg.thread_m % GROUP == 0 and cfg.thread_n % GROUP == 0,
             f"thread tile {cfg.thread_m}x{cfg.thread_n} is not in groups of {GROUP}"),
            (cfg.block_m % cfg.thread_m == 0 and cfg.block_n % cfg.thread_n == 0,
             "the block tile is not a whole number of thread tiles"),
            (target.warp_size <= cfg.threads <= target.max_threads_per_block
             and cfg.threads % target.warp_size == 0,
             f"{cfg.threads} threads is not a whole number of warps up to "
             f"{target.max_threads_per_block}"),
            (all(n >= 1 and n * cfg.threads == size for n, size in zip(
                cfg.loads_per_thread, (cfg.block_m * cfg.block_k, cfg.block_k * cfg.block_n))),
             "the threads cannot share the slices' loads evenly"),
            (cfg.shared_bytes <= target.shared_bytes_per_block,
             f"{cfg.shared_bytes} bytes of shared memory exceed the "
             f"{target.shared_bytes_per_block} of a block"),
            (cfg.stages in (1, 2), f"stages must be 1 or 2, got {cfg.stages}"),
            (cfg.tile_registers + sum(cfg.loads_per_thread) <= MAX_TILE_REGISTERS,
             "the thread tile and staged loads need too many registers"),
        ]
        for ok, rule in rules:
            if not ok:
                raise ScheduleConfigError(f"{self.name} {cfg}: {rule}")

    def resolve(self, pattern: GemmPattern, cfg: MatmulCudaConfig, target: CudaTarget
                ) -> ResolvedMatmulCuda:
        self.check(pattern, cfg, target)
        return ResolvedMatmulCuda(pattern, cfg, target)

    def emit(self, resolved: ResolvedMatmulCuda, name: str) -> Kernel:
        return _emit(resolved, name)

    def workload(self, pattern: GemmPattern) -> str:
        return gemm_workload(pattern)

    # What dynamic-shape tuning asks of a template (schedule.template.Sized): the costs
    # in matmul_cuda_cost, imported here when used because it imports this module.
    def sizes(self, pattern: GemmPattern) -> list:
        """The extents of the problem's axes, as expressions."""
        return [as_expr(e) for r in ROLES for e in role_extents(pattern)[r]]

    def sized_config(self, pattern: GemmPattern, config: MatmulCudaConfig, target: CudaTarget,
                     env: Mapping[Var, int]) -> MatmulCudaConfig:
        """What a compile for the sizes of ``env`` alone would run: its level-0 tile (the
        config given, symbolic sizes' default, has nothing else to fit)."""
        return _default(pattern, target, env)

    def work(self, resolved: ResolvedMatmulCuda, env: Mapping[Var, int]):
        from treadle.schedule.templates.matmul_cuda_cost import matmul_work
        return matmul_work(resolved, env)

    def features(self, resolved: ResolvedMatmulCuda, target: CudaTarget) -> dict[str, float]:
        from treadle.schedule.templates.matmul_cuda_cost import matmul_features
        return matmul_features(resolved, target)

    def layout_key(self, resolved: ResolvedMatmulCuda) -> None:
        """The template lays out no operand: every variant reads them as they are."""
        return None

    # What schedule construction asks of a template (schedule.template.Constructible):
    # in matmul_cuda_construction, imported here when used because it imports this module.
    def tiling_problem(self, pattern: GemmPattern, target: CudaTarget) -> TilingProblem:
        from treadle.schedule.templates.matmul_cuda_construction import matmul_problem
        return matmul_problem(pattern, target)

    def constructed_config(self, state: State) -> MatmulCudaConfig:
        from treadle.schedule.templates.matmul_cuda_construction import matmul_config
        return matmul_config(state)

    def predicted_seconds(self, resolved: ResolvedMatmulCuda, memory: MemoryHierarchy,
                          env: Mapping[Var, int] | None = None) -> float:
        from treadle.schedule.templates.matmul_cuda_construction import matmul_seconds
        return matmul_seconds(resolved, memory, env)


MATMUL_CUDA = MatmulCudaTemplate()


def _default(pattern: GemmPattern, target: CudaTarget, env: Mapping[Var, int] | None = None
             ) -> MatmulCudaConfig:
    """The largest block tile that gives every SM a block at the sizes the symbols take
    in ``env``."""
    sizes = {role: known(product(e), env) for role, e in role_extents(pattern).items()}
    if not all(isinstance(sizes[r], int) for r in ("batch", "m", "n")):
        return MatmulCudaConfig()  # symbolic sizes: the tile of large problems
    for bm, bn in sorted(BLOCKS, key=lambda b: -b[0] * b[1]):
        tiles = sizes["batch"] * -(-sizes["m"] // bm) * -(-sizes["n"] // bn)
        if tiles >= target.sms:
            break
    thread = 8 if bm * bn >= 64 * 64 else 4
    return MatmulCudaConfig(bm, bn, 8, thread, thread)


class _Problem:
    """The extents of each role and the factors evaluated at flat positions."""

    def __init__(self, pattern: GemmPattern):
        self.pattern = pattern
        self.extents = role_extents(pattern)
        self.size = {role: product(e) for role, e in self.extents.items()}

    def coords(self, role: str, flat) -> dict:
        axes = self.pattern.axes(role)
        return dict(zip(axes, unravel(flat, self.extents[role]))) if axes else {}

    def along_k(self, which: str) -> bool:
        """Whether consecutive K of a factor are adjacent in memory: the innermost index of
        its loads varies with the innermost K axis and not with the innermost row axis
        (A of a row-major product, a filter with its input channels innermost). Otherwise
        its rows are (B of a row-major product), and where the loads say neither, A runs
        along K and B along its rows."""
        rows = self.pattern.axes("m" if which == "left" else "n")
        k_axes = self.pattern.compute.reduce_axes
        loads = [n for n in walk(getattr(self.pattern, which)) if isinstance(n, Load)
                 and n.indices]
        if not loads or not rows or not k_axes:
            return which == "left"
        inner = free_vars(loads[0].indices[-1])
        by_k, by_row = k_axes[-1] in inner, rows[-1] in inner
        return by_k if by_k != by_row else which == "left"

    def factor(self, which: str, batch: dict, row, k) -> Expr:
        """A (``which`` = "left", rows are M) or B ("right", rows are N) at a position."""
        role = "m" if which == "left" else "n"
        env = {**batch, **self.coords(role, row), **self.coords("k", k)}
        return substitute(getattr(self.pattern, which), env)


def _emit(resolved: ResolvedMatmulCuda, name: str) -> Kernel:
    pattern, cfg = resolved.pattern, resolved.config
    problem = _Problem(pattern)
    M, N = problem.size["m"], problem.size["n"]
    with FunctionBuilder(name) as fb:
        declare_parameters(fb, pattern, True, [])
        tiles_m = (M + cfg.block_m - 1) // cfg.block_m
        tiles_n = (N + cfg.block_n - 1) // cfg.block_n
        for blk in fb.range(problem.size["batch"] * tiles_m * tiles_n, kind="blocks", name="blk"):
            batch = {a: fb.let(a.name, v) for a, v in
                     problem.coords("batch", blk // (tiles_m * tiles_n)).items()}
            m0 = fb.let("m0", blk // tiles_n % tiles_m * cfg.block_m)
            n0 = fb.let("n0", blk % tiles_n * cfg.block_n)
            a_tile = fb.buffer("a_tile", float32, [cfg.stages, cfg.block_k, cfg.block_m + PAD],
                               scope="shared")
            b_tile = fb.buffer("b_tile", float32, [cfg.stages, cfg.block_k, cfg.block_n + PAD],
                               scope="shared")
            for t in fb.range(cfg.threads, kind="threads", name="t"):
                _thread(fb, problem, cfg, t, batch, m0, n0, a_tile, b_tile)
    return canonical_kernel(fb.function, pattern.inputs, 1)


def _thread(fb: FunctionBuilder, problem: _Problem, cfg: MatmulCudaConfig, t, batch: dict,
            m0, n0, a_tile: Buffer, b_tile: Buffer) -> None:
    K = problem.size["k"]
    threads_n = cfg.block_n // cfg.thread_n
    ty, tx = fb.let("ty", t // threads_n), fb.let("tx", t % threads_n)
    acc = fb.buffer("acc", float32, [cfg.thread_m, cfg.thread_n])
    for i in fb.range(cfg.thread_m, kind="unroll"):
        for j in fb.range(cfg.thread_n, kind="unroll"):
            acc[i, j] = 0.0
    a_stage = fb.buffer("a_stage", float32, [cfg.loads_per_thread[0]])
    b_stage = fb.buffer("b_stage", float32, [cfg.loads_per_thread[1]])
    steps = fb.let("steps", (K + cfg.block_k - 1) // cfg.block_k)

    def load(step):
        _load_slice(fb, problem, cfg, t, a_stage, "left", batch, m0, step)
        _load_slice(fb, problem, cfg, t, b_stage, "right", batch, n0, step)

    def store(slot):
        _store_slice(fb, problem, cfg, t, a_stage, a_tile, "left", slot)
        _store_slice(fb, problem, cfg, t, b_stage, b_tile, "right", slot)

    with fb.if_(steps > 0):
        load(0)
        store(0)
    fb.barrier()
    for step in fb.range(steps, name="step"):
        with fb.if_(step + 1 < steps):
            load(step + 1)
        _multiply(fb, cfg, acc, a_tile, b_tile, step % cfg.stages, ty, tx)
        if cfg.stages == 1:
            fb.barrier()  # every thread has read the slice before it is overwritten
        with fb.if_(step + 1 < steps):
            store((step + 1) % cfg.stages)
        fb.barrier()
    _store_tile(fb, problem, cfg, acc, batch, m0, n0, ty, tx)


def _slice_position(cfg: MatmulCudaConfig, along_k: bool, rows: int, e):
    """(row, k) of element ``e`` of a slice of ``rows`` rows: consecutive elements run
    along K where the factor's consecutive K are adjacent in memory, else along its rows,
    so consecutive threads load consecutive addresses."""
    if along_k:
        return e // cfg.block_k, e % cfg.block_k
    return e % rows, e // rows


def _load_slice(fb, problem: _Problem, cfg: MatmulCudaConfig, t, stage: Buffer, which: str,
                batch: dict, row0, step) -> None:
    """Stages this thread's elements of the slice of A or B at ``step``; outside the problem
    they are zero."""
    limit, K = problem.size["m" if which == "left" else "n"], problem.size["k"]
    rows, along_k = _slice_rows(cfg, which), problem.along_k(which)
    for (e,) in (repeat(stage.shape[0].value, kind="unroll") * spatial(cfg.threads)).on(t):
        row, kk = _slice_position(cfg, along_k, rows, e)
        r, k = row0 + row, step * cfg.block_k + kk
        with fb.if_(logical_and(r < limit, k < K)):
            stage[e // cfg.threads] = problem.factor(which, batch, r, k)
        with fb.else_():
            stage[e // cfg.threads] = 0.0


def _store_slice(fb, problem: _Problem, cfg: MatmulCudaConfig, t, stage: Buffer, tile: Buffer,
                 which: str, slot) -> None:
    """The staged elements into shared memory, both slices K-major."""
    rows, along_k = _slice_rows(cfg, which), problem.along_k(which)
    for (e,) in (repeat(stage.shape[0].value, kind="unroll") * spatial(cfg.threads)).on(t):
        row, kk = _slice_position(cfg, along_k, rows, e)
        tile[slot, kk, row] = stage[e // cfg.threads]


def _slice_rows(cfg: MatmulCudaConfig, which: str) -> int:
    return cfg.block_m if which == "left" else cfg.block_n


def _offset(index, lanes_of_threads: int):
    """Row (or column) of a thread's ``index``-th element inside the block tile: runs of
    GROUP, the runs of neighbouring threads side by side."""
    return index // GROUP * (lanes_of_threads * GROUP) + index % GROUP


def _multiply(fb, cfg: MatmulCudaConfig, acc: Buffer, a_tile: Buffer, b_tile: Buffer, slot,
              ty, tx) -> None:
    threads_m, threads_n = cfg.block_m // cfg.thread_m, cfg.block_n // cfg.thread_n
    a = fb.buffer("a", float32, [cfg.thread_m])
    b = fb.buffer("b", float32, [cfg.thread_n])
    for kk in fb.range(cfg.block_k, kind="unroll", name="kk"):
        for i in fb.range(cfg.thread_m, kind="unroll"):
            a[i] = a_tile[slot, kk, ty * GROUP + _offset(i, threads_m)]
        for j in fb.range(cfg.thread_n, kind="unroll"):
            b[j] = b_tile[slot, kk, tx * GROUP + _offset(j, threads_n)]
        for i in fb.range(cfg.thread_m, kind="unroll"):
            for j in fb.range(cfg.thread_n, kind="unroll"):
                acc[i, j] = acc[i, j] + a[i] * b[j]


def _store_tile(fb, problem: _Problem, cfg: MatmulCudaConfig, acc: Buffer, batch: dict, m0, n0,
                ty, tx) -> None:
    pattern = problem.pattern
    threads_m, threads_n = cfg.block_m // cfg.thread_m, cfg.block_n // cfg.thread_n
    out = pattern.output.buffer
    for i in fb.range(cfg.thread_m, kind="unroll"):
        m = m0 + ty * GROUP + _offset(i, threads_m)
        for j in fb.range(cfg.thread_n, kind="unroll"):
            n = n0 + tx * GROUP + _offset(j, threads_n)
            with fb.if_(logical_and(m < problem.size["m"], n < problem.size["n"])):
                coords = {**batch, **problem.coords("m", m), **problem.coords("n", n)}
                index = tuple(coords[a] for a in pattern.compute.axes)
                out[index] = pattern.store_value(acc[i, j], index)
