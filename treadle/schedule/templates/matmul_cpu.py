"""The CPU matrix-multiplication template, for every operator whose compute is a sum of
products of two operands (MatMul, Gemm, batched matmul, convolution).

``match_gemm`` reads the roles of the axes off the compute definition: output axes that
only the left factor uses are M, only the right factor N, both "batch"; the reduce axes
are K. The template never learns which operator it serves: it packs panels by evaluating
the factors at unravelled (batch, m, k) and (batch, k, n) positions, so a convolution's
im2col addressing happens inside the packing step and no im2col buffer exists.

Work distribution: the macro-tiles are the iterations of a parallel loop (each thread
takes a contiguous run of them). For each K block a macro-tile packs both factors into
micro-panels, ``[block_m / micro_m][micro_m][block_k]`` (rows of A) and
``[block_n / micro_n][block_k][micro_n]``, so the micro-kernel walks each row of A and
B's micro-panel linearly; the last micro-panel of a ragged edge is padded (local padding:
rows of A repeat the last, columns of B are zero), so the micro-kernel never checks
bounds. The micro-kernel is a fully unrolled register tile of fused multiply-adds (rows of
16 floats in 512-bit registers where the CPU has AVX-512F, 256-bit ones otherwise);
it starts from zero in the first K block and from the accumulator after that, and in the
last K block stores its results straight to the output (through the epilogue). A right
factor that reads only constants (weights) is laid out in micro-panel order once, at
compile time, never packed at run time, and prefetched a micro-panel ahead. Where every
macro-tile spans the same rows, the threads first pack the left factor for all of K
together, into a workspace every tile reads.
Blocks are clamped to the problem's constant sizes, so a small M, N or K costs no padded
work, and shrunk to split M and N evenly over the threads (``_balanced``). A factor that
only one register tile would read (M or N within one micro-tile: GEMV, tall-skinny) is
read in place instead of packed; an in-place right factor is streamed in short K blocks.

``split_k`` > 1 (small M x N, long K): the workers of ``spatial(groups, split_k)`` each
accumulate one K part of a macro-tile into a shared workspace; a second parallel loop
sums the parts and applies the epilogue.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Collection, Iterator, Sequence

from treadle.config import config
from treadle.errors import ScheduleConfigError
from treadle.ir.builder import FunctionBuilder
from treadle.ir.compute import Compute, compute, producer_of
from treadle.ir.dtypes import float32, vector
from treadle.ir.expr import (Binary, Buffer, Cast, Const, Expr, Load, Var, broadcast, call,
                             ceil_div, eq, maximum, minimum, select)
from treadle.ir.functor import free_vars, rewrite, substitute, walk
from treadle.ir.mapping import repeat, spatial, unravel
from treadle.ir.tabulate import tabulable
from treadle.schedule.rules import Inliner, Kernel, canonical_kernel, reachable
from treadle.target.cpu import host

STACK_BYTES = 1 << 20  # the packed panels and accumulator live on a thread's stack
CACHE_LINE = 64
# Packing B reads rows of a weight matrix that is usually in memory, not cache; each row
# of a block is a short stretch, too short for the hardware prefetcher to run ahead, so
# packing fetches the row this many rows further on.
PREFETCH_ROWS = 32
# Time to pack one element, in multiply-adds (measured on 1024^3): A goes through the left
# factor's index arithmetic (a convolution's im2col) row by row of the tile, B is copied
# from laid-out rows. A packed A element is reused block_n times, a B one block_m.
PACK_COST_A, PACK_COST_B = 12, 8


@dataclass(frozen=True)
class GemmConfig:
    """One point of the schedule space: macro-tile (block_*), register tile (micro_*), and
    how many parts the K loop is split into (split_k, for small M x N)."""
    block_m: int = 192
    block_n: int = 256
    block_k: int = 256
    micro_m: int = 6
    micro_n: int = 16
    split_k: int = 1


@dataclass(frozen=True)
class GemmPattern:
    compute: Compute
    left: Expr
    right: Expr
    batch_axes: tuple[Var, ...]
    m_axes: tuple[Var, ...]
    n_axes: tuple[Var, ...]
    # An element-wise compute applied to each result before it is stored (a bias, a
    # rounding cast), which reads the product at its own index.
    epilogue: Compute | None = None
    # The right factor reads only constants (weights): its panels are laid out once, at
    # compile time, instead of packed by every call (see with_constants).
    constant_right: bool = False

    @property
    def output(self) -> Compute:
        return self.epilogue or self.compute

    def store_value(self, acc: Expr, index: tuple) -> Expr:
        if self.epilogue is None:
            return acc
        value = substitute(self.epilogue.value, dict(zip(self.epilogue.axes, index)))
        return rewrite(value, lambda n: acc if isinstance(n, Load)
                       and n.buffer == self.compute.buffer else None)


def match_gemm(c: Compute) -> GemmPattern | None:
    """The GEMM roles of a float32 ``sum(left * right)`` compute, or None."""
    if c.reduce_op != "sum" or c.dtype != float32:
        return None
    value = c.value
    if not (isinstance(value, Binary) and value.op == "*"):
        return None
    left, right = value.a, value.b
    used_left, used_right = free_vars(left), free_vars(right)
    if not (_loads_only_inputs(left) and _loads_only_inputs(right)):
        return None
    batch = tuple(a for a in c.axes if a in used_left and a in used_right)
    m = tuple(a for a in c.axes if a in used_left and a not in used_right)
    n = tuple(a for a in c.axes if a not in used_left)
    if not m and not n:
        return None
    return GemmPattern(c, left, right, batch, m, n)


def match_gemm_output(out: Compute) -> GemmPattern | None:
    """A GEMM for ``out`` itself, or for the one product ``out`` maps element-wise."""
    if out.is_reduction:
        return match_gemm(out)
    value = Inliner(reachable([out]))(out.value)
    products = {n.buffer for n in walk(value) if isinstance(n, Load)
                and producer_of(n.buffer) is not None}
    if len(products) != 1:
        return None
    product = producer_of(products.pop())
    loads = [n for n in walk(value) if isinstance(n, Load) and n.buffer == product.buffer]
    if product.shape != out.shape or any(n.indices != out.axes for n in loads):
        return None
    pattern = match_gemm(product)
    if pattern is None:
        return None
    epilogue = Compute(out.buffer, out.axes, value)
    return replace(pattern, epilogue=epilogue)


def with_constants(pattern: GemmPattern, constants: Collection[Buffer]) -> GemmPattern:
    """``pattern``, its right factor marked constant when it reads only ``constants``, in
    expressions ``tabulate`` evaluates, over static K and N and no batch axis (the panels
    are one matrix of static size)."""
    right, c = pattern.right, pattern.compute
    loads = {n.buffer for n in walk(right) if isinstance(n, Load)}
    sizes = _extents(c, pattern.n_axes) + [_static(e) for e in c.reduce_extents]
    constant = (bool(loads) and loads <= set(constants) and tabulable(right)
                and not free_vars(right) & set(pattern.batch_axes)
                and all(isinstance(v, int) for v in sizes))
    return replace(pattern, constant_right=constant)


def _loads_only_inputs(e: Expr) -> bool:
    return all(producer_of(n.buffer) is None for n in walk(e) if isinstance(n, Load))


def _extents(c: Compute, axes: Sequence[Var]) -> list[Expr | int]:
    return [_static(c.shape[c.axes.index(a)]) for a in axes]


def _static(e: Expr) -> Expr | int:
    """A constant extent as a Python int, so that block sizes can be clamped to it."""
    return e.value if isinstance(e, Const) else e


def _product(values: Sequence) -> Expr | int:
    total = 1
    for v in values:
        total = total * v
    return total


def check_config(cfg: GemmConfig, threads: int) -> None:
    """Raises ScheduleConfigError for a config the template cannot generate."""
    fields = vars(cfg)
    bad = [f"{k}={v}" for k, v in fields.items() if not (isinstance(v, int) and v >= 1)]
    if bad:
        raise ScheduleConfigError(f"GemmConfig needs positive integers, got {', '.join(bad)}")
    lanes = host().lanes()
    if cfg.micro_n % lanes:
        raise ScheduleConfigError(f"micro_n={cfg.micro_n} is not a multiple of {lanes} lanes")
    if cfg.block_m % cfg.micro_m or cfg.block_n % cfg.micro_n:
        raise ScheduleConfigError(f"block {cfg.block_m}x{cfg.block_n} is not a multiple of the "
                                  f"register tile {cfg.micro_m}x{cfg.micro_n}")
    vectors = cfg.micro_n // lanes
    # Accumulators, one row of B vectors and the broadcast of A, in 256-bit vectors (see
    # tile_lanes).
    needed = cfg.micro_m * vectors + vectors + 1
    if needed > host().vector_registers:
        raise ScheduleConfigError(f"register tile {cfg.micro_m}x{cfg.micro_n} needs {needed} "
                                  f"vector registers, the target has {host().vector_registers}")


def _check_stack(gemm: _Gemm, threads: int) -> None:
    """The config, clamped to the problem, must fit its buffers on the stack."""
    cfg = gemm.cfg
    a_floats = 0 if _in_place(gemm)[0] else cfg.block_m * _left_row(cfg)
    floats = a_floats + _b_pack_floats(gemm) + _output_floats(cfg)
    if 4 * floats > STACK_BYTES:
        raise ScheduleConfigError(f"panels and accumulator of {cfg} need {4 * floats} bytes "
                                  f"of stack, more than {STACK_BYTES}")
    workspace = 4 * _groups(cfg, threads) * cfg.split_k * cfg.block_m * cfg.block_n
    if cfg.split_k > 1 and workspace > STACK_BYTES:
        raise ScheduleConfigError(f"split_k={cfg.split_k} needs a {workspace}-byte workspace, "
                                  f"more than {STACK_BYTES}")


def _b_pack_floats(gemm: _Gemm) -> int:
    """The size of the right factor's packed panels on the stack."""
    cfg = gemm.cfg
    if gemm.panels is not None:
        return 0
    return (cfg.micro_n if _in_place(gemm)[1] else cfg.block_n) * _panel_rows(cfg)


def _output_floats(cfg: GemmConfig) -> int:
    """The accumulator of a macro-tile and the finished rows of one micro-panel."""
    return (cfg.block_m + cfg.micro_m) * cfg.block_n


def _groups(cfg: GemmConfig, threads: int) -> int:
    """How many macro-tiles split_k workers compute at once."""
    return max(1, threads // cfg.split_k)


def _min(a, b):
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else minimum(a, b)


def _max(a, b):
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else maximum(a, b)


def _round_up(x: int, multiple: int) -> int:
    return -(-max(x, 1) // multiple) * multiple


@dataclass(frozen=True)
class _Gemm:
    """The sizes of one GEMM and the config clamped to them."""
    pattern: GemmPattern
    extents: dict  # role ("batch", "m", "n", "k") -> extents of its axes
    cfg: GemmConfig
    panels: Compute | None = None  # the right factor laid out at compile time

    def size(self, role: str):
        return _product(self.extents[role])

    def coords(self, fb: FunctionBuilder, role: str, flat) -> dict:
        """The axes of ``role`` at a flat position, bound once by lets."""
        axes = {"batch": self.pattern.batch_axes, "m": self.pattern.m_axes,
                "n": self.pattern.n_axes, "k": self.pattern.compute.reduce_axes}[role]
        if not axes:
            return {}
        values = unravel(flat, self.extents[role])
        return {a: fb.let(a.name, v) for a, v in zip(axes, values)}


def _clamped(cfg: GemmConfig, M, N, K) -> GemmConfig:
    """Blocks no larger than the constant sizes they tile (no padded work on small dims),
    and micro-panels of A as even as the register tile allows: as many as micro_m rows
    need, each of the fewest rows that cover M (M = 49 takes 4 of 13 rows, not 4 of 14)."""
    if isinstance(M, int):
        panels = -(-max(M, 1) // cfg.micro_m)
        micro_m = -(-max(M, 1) // panels)
        block_m = cfg.block_m // cfg.micro_m * micro_m
        cfg = replace(cfg, micro_m=micro_m, block_m=min(block_m, _round_up(M, micro_m)))
    if isinstance(N, int):
        cfg = replace(cfg, block_n=min(cfg.block_n, _round_up(N, cfg.micro_n)))
    if isinstance(K, int):
        cfg = replace(cfg, block_k=min(cfg.block_k, max(K, 1)))
    return cfg


# A right factor read in place (one micro-panel of rows: GEMV, decoding) streams from
# memory; short K blocks over wide column blocks walk few rows at a time, each over a
# long contiguous stretch, which the hardware prefetcher follows (3x faster than 256 x 256
# on a 1 x 4096 x 4096 GEMV).
STREAM_BLOCK_K = 8
STREAM_BLOCK_N = 1024


def _streaming(cfg: GemmConfig, M, N, K) -> GemmConfig:
    block_n = max(cfg.block_n, _round_up(STREAM_BLOCK_N, cfg.micro_n))
    return _clamped(replace(cfg, block_k=min(cfg.block_k, STREAM_BLOCK_K), block_n=block_n),
                    M, N, K)


def _one_pass_over_panels(cfg: GemmConfig, M, N, K) -> GemmConfig:
    """With one micro-panel of rows (GEMV, decoding), each of B's laid-out micro-panels is
    read once: all of K in one block streams each micro-panel whole, a long contiguous
    stretch the hardware prefetcher follows, rather than a short stretch per K block."""
    one_panel = isinstance(M, int) and M <= cfg.micro_m
    if one_panel and isinstance(K, int) and 4 * cfg.micro_m * K <= STACK_BYTES // 4:
        return replace(cfg, block_k=max(K, 1))
    return cfg


def _balanced(cfg: GemmConfig, batch, M, N, workers: int, packs_right: bool) -> GemmConfig:
    """For constant sizes, blocks no larger than the config's that split M and N evenly and
    keep ``workers`` equally busy: the most useful work per padded, packed tile slot.

    The overhead term is the packing per multiply-add (PACK_COST_A, PACK_COST_B; on
    1024^3 larger blocks win over evener ones). A right factor laid out at compile time
    (``packs_right`` false) costs nothing per tile; between tilings that score alike it
    then gives each thread rows of its own (M in a multiple of ``workers`` blocks): each
    packs only its rows of A, where a split of N packs all of A in a parallel loop of its
    own whose panels every thread reads (128 x 768 x 768: 65-row tiles 5% faster than
    384-column ones, warm or cold)."""
    if not all(isinstance(v, int) and v > 0 for v in (batch, M, N)):
        return cfg
    mr, nr = cfg.micro_m, cfg.micro_n
    tiles_m, tiles_n = ceil_div(M, cfg.block_m), ceil_div(N, cfg.block_n)
    cost_b = PACK_COST_B if packs_right else 0

    def score(tm: int, tn: int) -> tuple[float, int, int, int]:
        bm, bn = _round_up(ceil_div(M, tm), mr), _round_up(ceil_div(N, tn), nr)
        tiles = batch * ceil_div(M, bm) * ceil_div(N, bn)
        slots = ceil_div(tiles, workers) * workers * bm * bn
        value = batch * M * N / slots / (1 + PACK_COST_A / bn + cost_b / bm)
        return value, bm, bn, ceil_div(M, bm)

    candidates = [score(tm, tn) for tm in range(tiles_m, tiles_m + 2 * workers + 1)
                  for tn in range(tiles_n, tiles_n + 2 * workers + 1)]
    _, bm, bn, _ = max(candidates, key=lambda c: (c[0], not packs_right and c[3] % workers == 0))
    return replace(cfg, block_m=bm, block_n=bn)


# Positions in a row of K that packing walks without dividing; a shorter innermost axis
# is merged with the next ones out (see _row).
MIN_ROW = 16


def _row(k_extents: Sequence) -> tuple[int, int] | None:
    """(axes, width): how many innermost of several K axes packing walks as one row (see
    _k_walk), and the row's length. The innermost axis (a convolution's input channels)
    alone, or merged with the next ones out while shorter than MIN_ROW: the 3 channels of
    an image make rows of 3 x kernel width, one contiguous stretch of a channels-last
    input, whose coordinates the simplifier folds back into the address."""
    count, width = 0, 1
    for extent in reversed(k_extents[1:]):  # at least one axis stays outside the row
        if not isinstance(extent, int):
            break
        count, width = count + 1, width * extent
        if width >= MIN_ROW:
            break
    return (count, width) if count else None


def _whole_rows(cfg: GemmConfig, k_extents: Sequence) -> GemmConfig:
    """A K block of whole rows, where one fits."""
    row = _row(k_extents)
    if row is not None and row[1] <= cfg.block_k:
        return replace(cfg, block_k=cfg.block_k // row[1] * row[1])
    return cfg


def schedule_gemm(name: str, inputs: Sequence[Buffer | None], pattern: GemmPattern,
                  cfg: GemmConfig = GemmConfig(),
                  checks: Sequence[tuple[Expr, str]] = ()) -> Kernel:
    """The GEMM kernel for ``pattern``; ``checks`` are run-time conditions on symbolic
    sizes (from the operator) that the kernel asserts before any work."""
    threads = config.num_threads
    check_config(cfg, threads)
    c = pattern.compute
    extents = {"batch": _extents(c, pattern.batch_axes), "m": _extents(c, pattern.m_axes),
               "n": _extents(c, pattern.n_axes), "k": [_static(e) for e in c.reduce_extents]}
    sizes = [_product(extents[r]) for r in ("m", "n", "k")]
    workers = threads if cfg.split_k == 1 else _groups(cfg, threads)
    panels = _panel_layout(pattern, extents, cfg.micro_n) if pattern.constant_right else None
    clamped = _clamped(cfg, *sizes)
    if _in_place(_Gemm(pattern, extents, clamped, panels))[1]:
        clamped = _streaming(clamped, *sizes)
    elif panels is not None:
        clamped = _one_pass_over_panels(clamped, *sizes)
    clamped = _balanced(clamped, _product(extents["batch"]), *sizes[:2], workers,
                        packs_right=panels is None)
    clamped = _whole_rows(clamped, extents["k"])
    gemm = _Gemm(pattern, extents, clamped, panels)
    _check_stack(gemm, threads)
    with FunctionBuilder(name) as fb:
        sources = [pattern.left, panels.value if panels else pattern.right]
        if pattern.epilogue is not None:
            sources.append(pattern.epilogue.value)
        used = {n.buffer for e in sources for n in walk(e) if isinstance(n, Load)}
        if panels is not None:  # read by the layout, at compile time, not by the kernel
            used -= {n.buffer for n in walk(pattern.right) if isinstance(n, Load)}
        for buffer in inputs:
            if buffer is not None and buffer in used:
                fb.add_param(buffer)
        out = fb.add_param(pattern.output.buffer)
        if panels is not None:
            fb.add_param(panels.buffer)
        left = fb.add_param(_whole_left_buffer(gemm)) if _one_row_of_tiles(gemm) else None
        symbols = {v for p in fb.params for d in p.shape for v in free_vars(d)}
        symbols |= {v for cond, _ in checks for v in free_vars(cond)}
        for var in sorted(symbols, key=lambda v: v.name):
            fb.add_param(var)
        for cond, message in checks:
            fb.assert_(cond, message)
        if gemm.cfg.split_k == 1:
            _whole_k(fb, gemm, out, left)
        else:
            _split_k(fb, gemm, out, threads)
    return canonical_kernel(fb.function, inputs, 1, (panels,) if panels else ())


def _panel_layout(pattern: GemmPattern, extents: dict, nr: int) -> Compute:
    """The constant right factor as [ceil(N / nr), K, nr]: a register tile's micro-panel
    is one contiguous stretch, read in K order as packing would lay it out. Columns past
    N repeat the last one (their sums are never stored)."""
    c, N, K = pattern.compute, _product(extents["n"]), _product(extents["k"])

    def element(q, k, r):
        n = unravel(minimum(q * nr + r, N - 1), extents["n"])
        coords = {**dict(zip(pattern.n_axes, n)),
                  **dict(zip(c.reduce_axes, unravel(k, extents["k"])))}
        return _f32(substitute(pattern.right, coords))
    return compute("panels", [ceil_div(N, nr), K, nr], element)


class _Tile:
    """One macro-tile: its batch coordinates, first row and column, and valid extents."""

    def __init__(self, fb: FunctionBuilder, gemm: _Gemm, tile):
        cfg = gemm.cfg
        tiles_m = ceil_div(gemm.size("m"), cfg.block_m)
        tiles_n = ceil_div(gemm.size("n"), cfg.block_n)
        self.batch = gemm.coords(fb, "batch", tile // (tiles_m * tiles_n))
        self.row0 = fb.let("row0", tile % (tiles_m * tiles_n) // tiles_n * cfg.block_m)
        # An expression, not a let: the epilogue's index arithmetic (a reshape splitting N)
        # simplifies only where it sees col0 is a multiple of block_n (see _store_rows).
        self.col0 = tile % tiles_n * cfg.block_n
        self.rows = fb.let("rows", _min(cfg.block_m, gemm.size("m") - self.row0))
        self.cols = fb.let("cols", _min(cfg.block_n, gemm.size("n") - self.col0))


def _num_tiles(gemm: _Gemm):
    cfg = gemm.cfg
    return (gemm.size("batch") * ceil_div(gemm.size("m"), cfg.block_m)
            * ceil_div(gemm.size("n"), cfg.block_n))


def _whole_k(fb: FunctionBuilder, gemm: _Gemm, out: Buffer, left: Buffer | None) -> None:
    cfg = gemm.cfg
    if left is not None:
        _pack_whole_left(fb, gemm, left)
    for t in fb.range(_num_tiles(gemm), kind="parallel", name="tile"):
        tile = _Tile(fb, gemm, t)
        acc = fb.buffer("acc", float32, [cfg.block_m, cfg.block_n])
        _accumulate(fb, gemm, tile, acc, (), 0, gemm.size("k"), left,
                    lambda rows, p: _store_rows(fb, gemm, out, tile, rows, p))


def _store_rows(fb: FunctionBuilder, gemm: _Gemm, out: Buffer, tile: _Tile, rows: Buffer,
                p) -> None:
    """Stores the finished rows of micro-panel p of ``tile`` from ``rows`` (in L1), one
    element at a time, where fusion puts the epilogue: results never make a round trip
    through the macro-tile's accumulator, and each output row goes out in one stretch."""
    mr, nr = gemm.cfg.micro_m, gemm.cfg.micro_n
    for i in fb.range(_min(mr, tile.rows - p * mr), name="i"):
        m = gemm.coords(fb, "m", tile.row0 + p * mr + i)
        # By micro-panels of columns: an epilogue that splits N (a reshape into heads)
        # divides col0 + q * micro_n + c, which simplifies to per-panel quotients, so the
        # stores along c stay contiguous and vectorise. A simd loop: inside the parallel
        # region gcc no longer knows the output does not overlap the epilogue's inputs
        # and would check for overlap at run time (5-15% of 1x1 convolutions with few
        # input channels, whose stores weigh most).
        for q in fb.range(ceil_div(tile.cols, nr), name="q"):
            for c in fb.range(_min(nr, tile.cols - q * nr), kind="vectorize", name="c"):
                _store(fb, gemm, out, tile, m, q * nr + c, rows[i, q * nr + c])


def _split_k(fb: FunctionBuilder, gemm: _Gemm, out: Buffer, threads: int) -> None:
    cfg, tiles = gemm.cfg, _num_tiles(gemm)
    groups, parts = _groups(cfg, threads), cfg.split_k
    partials = fb.buffer("partials", float32, [groups * parts, cfg.block_m, cfg.block_n],
                         scope="shared")
    K = gemm.size("k")
    k_part = ceil_div(K, parts)
    for rnd in fb.range(ceil_div(tiles, groups), name="round"):
        for worker in fb.range(groups * parts, kind="parallel", name="worker"):
            for g, part in spatial(groups, parts).on(worker):
                with fb.if_(rnd * groups + g < tiles):
                    tile = _Tile(fb, gemm, rnd * groups + g)
                    k_begin = fb.let("k_begin", _min(part * k_part, K))
                    k_len = fb.let("k_len", _min(k_part, K - k_begin))
                    _accumulate(fb, gemm, tile, partials, (g * parts + part,), k_begin, k_len)
        for row in fb.range(groups * cfg.block_m, kind="parallel", name="row"):
            for g, i in spatial(groups, cfg.block_m).on(row):
                with fb.if_(rnd * groups + g < tiles):
                    tile = _Tile(fb, gemm, rnd * groups + g)
                    with fb.if_(i < tile.rows):
                        m = gemm.coords(fb, "m", tile.row0 + i)
                        for j in fb.range(tile.cols, name="j"):
                            total = fb.scalar("total", float32, 0.0)
                            for p in fb.range(parts, name="p"):
                                total[()] = total[()] + partials[g * parts + p, i, j]
                            _store(fb, gemm, out, tile, m, j, total[()])


def _store(fb: FunctionBuilder, gemm: _Gemm, out: Buffer, tile: _Tile, m: dict, j,
           value: Expr) -> None:
    pattern = gemm.pattern
    n = dict(zip(pattern.n_axes, unravel(tile.col0 + j, gemm.extents["n"])))
    coords = {**tile.batch, **m, **n}
    index = tuple(coords[a] for a in pattern.compute.axes)
    out[index] = pattern.store_value(value, index)


def _accumulate(fb: FunctionBuilder, gemm: _Gemm, tile: _Tile, acc: Buffer, slot: tuple,
                k_begin, k_len, left: Buffer | None = None,
                finish: Callable[[Buffer, Expr], None] | None = None) -> None:
    """acc[slot + (i, j)] = the tile's products summed over K positions
    [k_begin, k_begin + k_len), one K block of packed panels at a time; with ``finish``,
    the last K block instead gathers each micro-panel p of rows in a [micro_m, block_n]
    buffer and hands it to ``finish(rows, p)``.

    A factor that only one register tile reads per K block (the macro-tile is a single
    micro-panel wide in the other factor's direction: GEMV, tall-skinny shapes) is read in
    place instead, as packing it would cost as much as the products. ``left``, when
    given, holds the left factor already packed for every K block (_pack_whole_left)."""
    cfg = gemm.cfg
    mr, nr = cfg.micro_m, cfg.micro_n
    left_in_place, right_in_place = _in_place(gemm)
    blocks = _max(ceil_div(k_len, cfg.block_k), 1)
    rows = None if finish is None else fb.buffer("rows", float32, [mr, cfg.block_n])
    for kb in fb.range(blocks, name="kb"):
        block = _k_block(fb, gemm, kb, k_begin, k_len)
        if left is not None:
            a_pack = _Slice(left, kb)
        else:
            a_pack = None if left_in_place else _pack_left(fb, gemm, tile, block)
        if gemm.panels is not None:
            b_pack = _Panels(gemm.panels.buffer, tile.col0 // nr, block.k0)
        else:
            # In place, the right factor's ragged last micro-panel still needs zero padding.
            b_pack = _pack_right(fb, gemm, tile, block, ragged_only=right_in_place)
        packed = _Operands(gemm, tile, block.k0, a_pack, b_pack,
                           0 if right_in_place else None)
        in_place = replace(packed, b_pack=None)
        # Micro-panels of rows outer: a row's finished tiles complete whole output rows,
        # stored in one stretch (1x1 convolutions with few input channels, bound by writing
        # their output, gain 5-10% over B's micro-panels outer); the A micro-panel stays
        # in L1 instead of B's, at equal cost while both blocks sit in L2.
        for p in fb.range(ceil_div(tile.rows, mr), name="p"):
            for q in fb.range(ceil_div(tile.cols, nr), name="q"):
                args = (fb, cfg, acc, slot + (p * mr, q * nr), eq(kb, 0), block.depth)
                last = None if rows is None else (
                    eq(kb, blocks - 1), lambda regs, q=q: _spill(cfg, regs, rows, (0, q * nr)))
                if right_in_place:
                    with fb.if_(q * nr + nr <= tile.cols):
                        register_tile(*args, in_place.reader(fb, p, q), last)
                    with fb.else_():
                        register_tile(*args, packed.reader(fb, p, q), last)
                else:
                    register_tile(*args, packed.reader(fb, p, q), last)
            if rows is not None:
                with fb.if_(eq(kb, blocks - 1)):
                    finish(rows, p)


@dataclass(frozen=True)
class _KBlock:
    """K positions [k0, k0 + depth); ``aligned`` when k0 is known to start a row of the
    innermost K axes (see _row)."""
    k0: Expr
    depth: Expr
    aligned: bool


def _k_block(fb: FunctionBuilder, gemm: _Gemm, kb, k_begin, k_len) -> _KBlock:
    """K block ``kb`` of the K positions [k_begin, k_begin + k_len)."""
    block_k = gemm.cfg.block_k
    k0 = fb.let("k0", k_begin + kb * block_k)
    depth = fb.let("depth", _max(_min(block_k, k_len - kb * block_k), 0))
    row = _row(gemm.extents["k"])
    aligned = row is not None and block_k % row[1] == 0 and isinstance(k_begin, int) \
        and k_begin % row[1] == 0
    return _KBlock(k0, depth, aligned)


def _k_walk(fb: FunctionBuilder, gemm: _Gemm, block: _KBlock) -> Iterator[tuple[Expr, dict]]:
    """(kk, coordinates of K position k0 + kk) for every kk < depth. Where K has rows (see
    _row), the block is walked as the stretches it covers of each row, so the outer
    coordinates cost a division per row rather than per position: a 3x3 convolution's
    packing spent most of its time dividing, and blocks need not hold whole rows (a block
    of 192 over rows of 512 channels covers parts of two)."""
    row = _row(gemm.extents["k"])
    if row is None:
        for kk in fb.range(block.depth, name="kk"):
            yield kk, gemm.coords(fb, "k", block.k0 + kk)
        return
    count, width = row
    axes, extents = gemm.pattern.compute.reduce_axes, gemm.extents["k"]
    first = fb.let("krow0", block.k0 // width)
    end = block.k0 + block.depth
    for r in fb.range(ceil_div(end, width) - first, name="krow"):
        start = fb.let("kstart", (first + r) * width)
        begin = 0 if block.aligned else fb.let("kcol0", _max(block.k0 - start, 0))
        outer = unravel(first + r, extents[:-count])
        coords = {a: fb.let(a.name, v) for a, v in zip(axes[:-count], outer)}
        for c in fb.range(_min(width, end - start) - begin, name="kcol"):
            col = begin + c
            inner = dict(zip(axes[-count:], unravel(col, extents[-count:])))
            yield fb.let("kk", start + col - block.k0), {**coords, **inner}


def _in_place(gemm: _Gemm) -> tuple[bool, bool]:
    """Whether the left and the right factor are read in place (see _accumulate)."""
    cfg = gemm.cfg
    return (cfg.block_n == cfg.micro_n,
            cfg.block_m == cfg.micro_m and gemm.panels is None
            and _right_vector(gemm, {}, None) is not None)


@dataclass(frozen=True)
class _Operands:
    """Where register tile (p, q) reads its factors in one K block: the packed panels, or
    the factor itself where its panel is None."""
    gemm: _Gemm
    tile: _Tile
    k0: Expr
    a_pack: Buffer | _Slice | None
    b_pack: Buffer | _Panels | None
    b_panel: int | None  # the one micro-panel b_pack holds, or None for all of them

    def reader(self, fb: FunctionBuilder, p, q):
        """``step(kk)`` -> (a_of(r), b_of(v)) for register_tile."""
        def step(kk):
            in_place = self.a_pack is None or self.b_pack is None
            k = self.gemm.coords(fb, "k", self.k0 + kk) if in_place else {}
            if isinstance(self.b_pack, _Panels):
                # Laid-out weights come from memory on the first row panel; a line of the
                # next micro-panel per step has it in cache by the time the tile moves on
                # (BERT's dense layers, ResNet-50's 7x7 layers: 2-3% of the whole model).
                fb.evaluate(call("prefetch", self.b_pack.ahead(q, kk)))
            return (lambda r: self._left(p, kk, k, r)), (lambda v: self._right(q, kk, k, v))
        return step

    def _left(self, p, kk, k: dict, r) -> Expr:
        if self.a_pack is not None:
            return self.a_pack[p, r, kk]
        gemm, mr = self.gemm, self.gemm.cfg.micro_m
        # Rows past the edge repeat the last row; their sums are never stored.
        row = _min(self.tile.row0 + p * mr + r, gemm.size("m") - 1)
        m = dict(zip(gemm.pattern.m_axes, unravel(row, gemm.extents["m"])))
        return _f32(substitute(gemm.pattern.left, {**self.tile.batch, **m, **k}))

    def _right(self, q, kk, k: dict, v) -> Expr:
        lanes = tile_lanes(self.gemm.cfg)
        if self.b_pack is not None:
            panel = q if self.b_panel is None else self.b_panel
            return self.b_pack.vload((panel, kk, v * lanes), lanes)
        col = self.tile.col0 + q * self.gemm.cfg.micro_n + v * lanes
        return _right_vector(self.gemm, {**self.tile.batch, **k}, col)


def _right_vector(gemm: _Gemm, coords: dict, col) -> Expr | None:
    """A register's worth (tile_lanes) of consecutive columns of the right factor from
    ``col`` as one vector load, where it is a load whose last index is the (only) N axis;
    None otherwise (with col None: whether it is such a load)."""
    right, n_axes = gemm.pattern.right, gemm.pattern.n_axes
    if not (isinstance(right, Load) and right.lanes == 1 and len(n_axes) == 1
            and right.indices[-1] == n_axes[0]
            and all(n_axes[0] not in free_vars(i) for i in right.indices[:-1])):
        return None
    if col is None:
        return right
    indices = tuple(substitute(i, coords) for i in right.indices[:-1]) + (col,)
    return Load(right.buffer, indices, tile_lanes(gemm.cfg))


def _f32(e: Expr) -> Expr:
    return e if e.dtype == float32 else Cast(e, float32)


@dataclass(frozen=True)
class _Slice:
    """The part of ``buffer`` at one first index, indexed as a buffer of its own (the
    panels of one K block among every block's, one set of a register tile's
    accumulators)."""
    buffer: Buffer
    first: Expr | int

    def __getitem__(self, index: tuple) -> Expr:
        return self.buffer[(self.first, *index)]

    def __setitem__(self, index: tuple, value) -> None:
        self.buffer[(self.first, *index)] = value


@dataclass(frozen=True)
class _Panels:
    """A tile's micro-panels in the panels laid out at compile time (_panel_layout), from
    panel ``first`` and K position ``k0``, indexed as a packed panel buffer."""
    buffer: Buffer
    first: Expr
    k0: Expr

    def vload(self, index: tuple, lanes: int) -> Expr:
        panel, kk, lane = index
        return self.buffer.vload((self.first + panel, self.k0 + kk, lane), lanes)

    def ahead(self, panel, kk) -> Expr:
        """The element that panel + 1 holds where ``vload`` reads panel (past the last
        panel an address outside the buffer, harmless for a prefetch)."""
        return self.buffer[self.first + panel + 1, self.k0 + kk, 0]


def _one_row_of_tiles(gemm: _Gemm) -> bool:
    """Whether every macro-tile spans the same rows (constant M within one block, no batch)
    and the left factor packed for all of K stays in the cores' L2 caches: the threads
    then pack A once, together, instead of once per tile each (a 128 x 768 x 3072 dense
    layer re-packed A for each of its N tiles; a 7x7x512 3x3 convolution, 49 x 4608,
    spent a fifth of its time packing all of A on both threads). A symbolic tile count
    packs per tile: that is right for any count."""
    cfg, M, K, tiles = gemm.cfg, gemm.size("m"), gemm.size("k"), _num_tiles(gemm)
    if not (isinstance(M, int) and isinstance(K, int) and M <= cfg.block_m
            and gemm.size("batch") == 1 and cfg.split_k == 1 and not _in_place(gemm)[0]
            and isinstance(tiles, int) and tiles > 1):
        return False
    target = host()
    packed_bytes = 4 * ceil_div(K, cfg.block_k) * cfg.block_m * _left_row(cfg)
    return packed_bytes <= target.cores * target.l2_bytes


def _whole_left_buffer(gemm: _Gemm) -> Buffer:
    """The workspace of the left factor's panels for every K block, [blocks,
    block_m / micro_m, micro_m, block_k + a line] (see _one_row_of_tiles, _left_row)."""
    cfg = gemm.cfg
    blocks = ceil_div(gemm.size("k"), cfg.block_k)
    return Buffer("a_all", float32, (blocks, cfg.block_m // cfg.micro_m, cfg.micro_m,
                                     _left_row(cfg)))


def _pack_whole_left(fb: FunctionBuilder, gemm: _Gemm, left: Buffer) -> None:
    """Packs every K block of the left factor into ``left``, a K block per iteration of a
    parallel loop; the products start once all are packed (the next parallel loop)."""
    K = gemm.size("k")
    rows = _Tile(fb, gemm, 0)
    for kb in fb.range(ceil_div(K, gemm.cfg.block_k), kind="parallel", name="kb"):
        _pack_left(fb, gemm, rows, _k_block(fb, gemm, kb, 0, K), _Slice(left, kb))


def _pack_left(fb: FunctionBuilder, gemm: _Gemm, tile: _Tile, block: _KBlock,
               into: _Slice | None = None) -> Buffer | _Slice:
    """a_pack[p, r, kk] = left(row0 + p * micro_m + r, k0 + kk); into ``into`` or a new
    buffer. Each row of a micro-panel is its own stretch of K (the micro-kernel broadcasts
    from micro_m rows at fixed distances from one pointer), so packing copies along the
    left factor's rows — a convolution's input channels, a matrix's K — in stretches the
    C compiler vectorises, instead of scattering each element micro_m floats apart
    (MobileNetV2 3.5%, ResNet-50 3%, Inception-V3 2.6% faster). Rows past the tile's last
    repeat it (their sums are never stored), so a ragged micro-panel is packed like a
    whole one."""
    cfg, mr = gemm.cfg, gemm.cfg.micro_m
    a_pack = into or fb.buffer("a_pack", float32, [cfg.block_m // mr, mr, _left_row(cfg)])
    for p in fb.range(ceil_div(tile.rows, mr), name="p"):
        for r in fb.range(mr, name="r"):
            m = gemm.coords(fb, "m", tile.row0 + _min(p * mr + r, tile.rows - 1))
            for kk, k in _k_walk(fb, gemm, block):
                a_pack[p, r, kk] = _f32(substitute(gemm.pattern.left, {**tile.batch, **m, **k}))
    return a_pack


def _left_row(cfg: GemmConfig) -> int:
    """Floats from one packed row of A to the next: block_k and a cache line, so that the
    rows of a micro-panel fall in different L1 sets when block_k is a power of two."""
    return cfg.block_k + ceil_div(CACHE_LINE, 4)


def _pack_right(fb: FunctionBuilder, gemm: _Gemm, tile: _Tile, block: _KBlock,
                ragged_only: bool) -> Buffer:
    """b_pack[p, kk, c] = right(k0 + kk, col0 + p * micro_n + c), zero past the last
    column. Whole micro-panels are filled row by row of the block (K outer), so each
    row of B is read along one contiguous stretch, which the hardware prefetcher
    follows (4% of 1024^3 over panel by panel); the ragged last one is filled with
    bounds checks. With ``ragged_only``, just the ragged panel, into b_pack[0].

    Panels are a cache line more than block_k rows apart: at exactly block_k rows (a
    multiple of 4 KiB), filling a row of every panel hit one L1 set block_n / micro_n
    times over, and a 7x7x512 convolution spent a third of its time in those stores."""
    cfg, nr = gemm.cfg, gemm.cfg.micro_n
    panels = 1 if ragged_only else cfg.block_n // nr
    b_pack = fb.buffer("b_pack", float32, [panels, _panel_rows(cfg), nr])

    def fill_row(p, slot, kk, k: dict, checked: bool) -> None:
        for (col,) in repeat(nr).on(0):
            value = _f32(_right_at(gemm, tile, p * nr + col, k))
            b_pack[slot, kk, col] = (select(p * nr + col < tile.cols, value, 0.0)
                                     if checked else value)

    if not ragged_only:
        for kk, k in _k_walk(fb, gemm, block):
            ahead = _rows_ahead(gemm, k)
            for p in fb.range(tile.cols // nr, name="p"):
                if ahead is not None:
                    fb.evaluate(call("prefetch", _right_at(gemm, tile, p * nr, ahead)))
                fill_row(p, p, kk, k, checked=False)
    with fb.if_(tile.cols % nr > 0):
        last = tile.cols // nr
        for kk, k in _k_walk(fb, gemm, block):
            fill_row(last, 0 if ragged_only else last, kk, k, checked=True)
    return b_pack


def _right_at(gemm: _Gemm, tile: _Tile, col, k: dict) -> Expr:
    """The right factor at the tile's column ``col`` and K coordinates ``k``."""
    n = dict(zip(gemm.pattern.n_axes, unravel(tile.col0 + col, gemm.extents["n"])))
    return substitute(gemm.pattern.right, {**tile.batch, **n, **k})


def _rows_ahead(gemm: _Gemm, k: dict) -> dict | None:
    """K coordinates PREFETCH_ROWS rows of B past ``k`` (along the innermost K axis; past
    its end the address is another row's or outside B, harmless for a prefetch), or None
    when B is not a plain load whose address could be fetched."""
    if not isinstance(gemm.pattern.right, Load):
        return None
    inner = gemm.pattern.compute.reduce_axes[-1]
    return {**k, inner: k[inner] + PREFETCH_ROWS}


def _panel_rows(cfg: GemmConfig) -> int:
    """Rows of one packed B micro-panel: block_k, plus at least a cache line (see
    _pack_right)."""
    return cfg.block_k + ceil_div(CACHE_LINE, 4 * cfg.micro_n)


def tile_lanes(cfg: GemmConfig) -> int:
    """Lanes of the register tile's vectors: a row of 16 floats takes one 512-bit register
    where the target has them. Tiles are still sized in 256-bit vectors (check_config,
    the schedule space), so the widest registers serve 16-wide tiles, not tiles twice as
    wide: on 128 x 768 x 768, 14 x 16 in 512-bit registers ran 9-11% faster than in
    256-bit ones and 3-10% faster than 14 x 32 or 12 x 32 in 512-bit ones."""
    return host().register_lanes(cfg.micro_n)


def register_tile(fb: FunctionBuilder, cfg: GemmConfig, acc: Buffer, origin: tuple, first,
                  depth, step, last: tuple | None = None) -> None:
    """acc[origin + (r, c)] (+)= the sum over kk < depth of a(r) * b(c), in a fully unrolled
    micro_m x micro_n tile of vector registers; ``step(kk)`` gives the operand readers
    ``a_of(r)`` (a scalar) and ``b_of(v)`` (the v-th vector of the row of B). With
    ``last`` = (condition, finish), where the condition holds the registers go to
    ``finish(regs)`` instead of acc."""
    lanes = tile_lanes(cfg)
    mr, vectors = cfg.micro_m, cfg.micro_n // lanes
    registers = repeat(mr, vectors, kind="unroll")
    *slot, row, col = origin
    regs = fb.buffer("regs", vector(float32, lanes), [mr, vectors])
    with fb.if_(first):
        for r, v in registers.on(0):
            regs[r, v] = broadcast(0.0, lanes)
    with fb.else_():
        for r, v in registers.on(0):
            regs[r, v] = acc.vload((*slot, row + r, col + v * lanes), lanes)
    chains = _chains(mr * vectors * lanes)
    if chains == 1:
        _multiply_add(fb, regs, registers, step, fb.range(depth, name="kk"), lanes)
    else:
        # Too few accumulators to cover the FMA latency (one row: GEMV, decoding): every
        # chain sums every chains-th K position, and the chains add up at the end.
        extra = fb.buffer("chains", vector(float32, lanes), [chains - 1, mr, vectors])
        for c, r, v in repeat(chains - 1, mr, vectors, kind="unroll").on(0):
            extra[c, r, v] = broadcast(0.0, lanes)
        for kk in fb.range(depth // chains, name="kk"):
            for c in range(chains):
                into = regs if c == 0 else _Slice(extra, c - 1)
                _multiply_add(fb, into, registers, step, [kk * chains + c], lanes)
        _multiply_add(fb, regs, registers, step,
                      (depth // chains * chains + kk for kk in
                       fb.range(depth % chains, name="kk")), lanes)
        for c, r, v in repeat(chains - 1, mr, vectors, kind="unroll").on(0):
            regs[r, v] = regs[r, v] + extra[c, r, v]
    if last is None:
        _spill(cfg, regs, acc, origin)
        return
    done, finish = last
    with fb.if_(done):
        finish(regs)
    with fb.else_():
        _spill(cfg, regs, acc, origin)


# Multiply-adds a register tile keeps in flight, in float lanes: an FMA's latency (4
# cycles) times the lanes the FMA units retire per cycle (2 x 8 on AVX2 and on AMD's
# AVX-512, which runs a 512-bit FMA as two 256-bit halves).
LANES_IN_FLIGHT = 64


def _chains(lanes: int) -> int:
    """How many independent sums a tile of ``lanes`` accumulator lanes splits K into."""
    return -(-LANES_IN_FLIGHT // lanes)


def _multiply_add(fb: FunctionBuilder, regs, registers, step, positions, lanes: int) -> None:
    """regs[r, v] += a(r) * b(v) at each K position of ``positions``."""
    for kk in positions:
        a_of, b_of = step(kk)
        for r, v in registers.on(0):
            regs[r, v] = call("fma", broadcast(a_of(r), lanes), b_of(v), regs[r, v])


def _spill(cfg: GemmConfig, regs: Buffer, into: Buffer, origin: tuple) -> None:
    """into[origin + (r, c)] = the register tile's vectors."""
    *slot, row, col = origin
    lanes = tile_lanes(cfg)
    for r, v in repeat(cfg.micro_m, cfg.micro_n // lanes, kind="unroll").on(0):
        into[(*slot, row + r, col + v * lanes)] = regs[r, v]
