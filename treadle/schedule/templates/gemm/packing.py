"""Packing the GEMM's factors into the register tile's micro-panel order.

For each K block a macro-tile packs both factors into micro-panels,
``[block_m / micro_m][micro_m][block_k]`` (rows of A) and
``[block_n / micro_n][block_k][micro_n]``, so the micro-kernel walks each row of A and
B's micro-panel linearly; the last micro-panel of a ragged edge is padded (local padding:
rows of A repeat the last, columns of B are zero), so the micro-kernel never checks
bounds. Packing evaluates the factors at unravelled (batch, m, k) and (batch, k, n)
positions, so whatever a factor computes (a convolution's im2col, a fused prologue)
happens here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from treadle.ir.builder import FunctionBuilder
from treadle.ir.expr import Buffer, Expr, ceil_div, select
from treadle.ir.functor import substitute
from treadle.ir.mapping import repeat, unravel
from treadle.schedule.templates.gemm.micro_kernel import Slice
from treadle.schedule.templates.gemm.pattern import interleaved_batch, static_max, static_min
from treadle.schedule.templates.gemm.resolve import ResolvedGemm, k_row, left_row, panel_rows
from treadle.schedule.templates.gemm.tiles import K_STEP, TiledLeft, left_tiles_shape, pad_left

class MacroTile:
    """One macro-tile: its batch coordinates, first row and column, and valid extents.

    Tiles are numbered batch-major, except where the batch interleaves with the left
    factor's rows (interleaved_batch: a channels-last grouped convolution): there the
    tiles of one block of rows, a band of the image, follow each other for every group,
    so a thread's run of tiles reads each band while it is cached (RegNet's first grouped
    layer, 3.2 MB of image, 1.4x faster than group by group)."""

    def __init__(self, fb: FunctionBuilder, gemm: ResolvedGemm, tile):
        cfg = gemm.cfg
        block_m = gemm.tile_rows
        if not isinstance(block_m, int):
            block_m = fb.let("tile_rows", block_m)
        tiles_m = ceil_div(gemm.size("m"), block_m)
        tiles_n = ceil_div(gemm.size("n"), cfg.block_n)
        if interleaved_batch(gemm.pattern):
            batches = gemm.size("batch")
            self.batch = gemm.coords(fb, "batch", tile % batches)
            tile = tile // batches
            self.row0 = fb.let("row0", tile // tiles_n * block_m)
        else:
            self.batch = gemm.coords(fb, "batch", tile // (tiles_m * tiles_n))
            self.row0 = fb.let("row0", tile % (tiles_m * tiles_n) // tiles_n * block_m)
        # An expression, not a let: the epilogue's index arithmetic (a reshape splitting N)
        # simplifies only where it sees col0 is a multiple of block_n (see program._store_rows).
        self.col0 = tile % tiles_n * cfg.block_n
        self.rows = fb.let("rows", static_min(block_m, gemm.size("m") - self.row0))
        self.cols = fb.let("cols", static_min(cfg.block_n, gemm.size("n") - self.col0))


@dataclass(frozen=True)
class KBlock:
    """K positions [k0, k0 + depth); ``aligned`` when k0 is known to start a row of the
    innermost K axes (see k_row)."""
    k0: Expr
    depth: Expr
    aligned: bool


def k_block(fb: FunctionBuilder, gemm: ResolvedGemm, kb, k_begin, k_len) -> KBlock:
    """K block ``kb`` of the K positions [k_begin, k_begin + k_len)."""
    block_k = gemm.cfg.block_k
    k0 = fb.let("k0", k_begin + kb * block_k)
    depth = fb.let("depth", static_max(static_min(block_k, k_len - kb * block_k), 0))
    row = k_row(gemm.extents["k"])
    aligned = row is not None and block_k % row[1] == 0 and isinstance(k_begin, int) \
        and k_begin % row[1] == 0
    return KBlock(k0, depth, aligned)


def k_walk(fb: FunctionBuilder, gemm: ResolvedGemm, block: KBlock) -> Iterator[tuple[Expr, dict]]:
    """(kk, coordinates of K position k0 + kk) for every kk < depth. Where K has rows (see
    k_row), the block is walked as the stretches it covers of each row, so the outer
    coordinates cost a division per row rather than per position: a 3x3 convolution's
    packing spent most of its time dividing, and blocks need not hold whole rows (a block
    of 192 over rows of 512 channels covers parts of two)."""
    row = k_row(gemm.extents["k"])
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
        begin = 0 if block.aligned else fb.let("kcol0", static_max(block.k0 - start, 0))
        outer = unravel(first + r, extents[:-count])
        coords = {a: fb.let(a.name, v) for a, v in zip(axes[:-count], outer)}
        for c in fb.range(static_min(width, end - start) - begin, name="kcol"):
            col = begin + c
            inner = dict(zip(axes[-count:], unravel(col, extents[-count:])))
            yield fb.let("kk", start + col - block.k0), {**coords, **inner}


def whole_left_buffer(gemm: ResolvedGemm) -> Buffer:
    """The workspace of the left factor's panels for every K block, [blocks,
    block_m / micro_m, micro_m, block_k + a line] (see resolve._one_row_of_tiles, left_row)."""
    cfg = gemm.cfg
    blocks = ceil_div(gemm.size("k"), cfg.block_k)
    if gemm.tiled:
        return Buffer("a_all", gemm.pattern.accumulator,
                      (blocks, *left_tiles_shape(cfg.block_m, cfg.block_k)))
    return Buffer("a_all", gemm.pattern.accumulator, (blocks, cfg.block_m // cfg.micro_m, cfg.micro_m,
                                     left_row(cfg)))


def pack_whole_left(fb: FunctionBuilder, gemm: ResolvedGemm, left: Buffer) -> None:
    """Packs every K block of the left factor into ``left``, a K block per iteration of a
    parallel loop; the products start once all are packed (the next parallel loop)."""
    K = gemm.size("k")
    rows = MacroTile(fb, gemm, 0)
    for kb in fb.range(ceil_div(K, gemm.cfg.block_k), kind="parallel", name="kb"):
        pack_left(fb, gemm, rows, k_block(fb, gemm, kb, 0, K), Slice(left, kb))


def pack_left(fb: FunctionBuilder, gemm: ResolvedGemm, tile: MacroTile, block: KBlock,
               into: Slice | None = None) -> Buffer | Slice | TiledLeft:
    """a_pack[p, r, kk] = left(row0 + p * micro_m + r, k0 + kk); into ``into`` or a new
    buffer. Each row of a micro-panel is its own stretch of K (the micro-kernel broadcasts
    from micro_m rows at fixed distances from one pointer), so packing copies along the
    left factor's rows — a convolution's input channels, a matrix's K — in stretches the
    C compiler vectorises, instead of scattering each element micro_m floats apart
    (MobileNetV2 3.5%, ResNet-50 3%, Inception-V3 2.6% faster). Rows past the tile's last
    repeat it (their sums are never stored), so a ragged micro-panel is packed like a
    whole one. On tiles (gemm.tiled), into tiles.py's tile order, K padded with zeros to
    a whole step (by _tile_walk where K is one axis: rows of a tile's 16 words, which
    the C compiler vectorises)."""
    cfg, mr = gemm.cfg, gemm.cfg.micro_m
    shape = (left_tiles_shape(cfg.block_m, cfg.block_k) if gemm.tiled
             else [cfg.block_m // mr, mr, left_row(cfg)])
    a_pack = into or fb.buffer("a_pack", gemm.pattern.accumulator, shape)
    if gemm.tiled:
        a_pack = TiledLeft(a_pack)
    stepped = gemm.tiled and k_row(gemm.extents["k"]) is None
    for p in fb.range(ceil_div(tile.rows, mr), name="p"):
        for r in fb.range(mr, name="r"):
            m = gemm.coords(fb, "m", tile.row0 + static_min(p * mr + r, tile.rows - 1))
            walk = (_tile_walk(fb, gemm, block) if stepped
                    else ((kk, k, None) for kk, k in k_walk(fb, gemm, block)))
            for kk, k, valid in walk:
                value = gemm.pattern.element(
                    substitute(gemm.pattern.left, {**tile.batch, **m, **k}))
                a_pack[p, r, kk] = value if valid is None else select(valid, value, 0)
    if gemm.tiled and not stepped:
        pad_left(fb, a_pack, tile.rows, block.depth)
    return a_pack


def _tile_walk(fb: FunctionBuilder, gemm: ResolvedGemm, block: KBlock
               ) -> Iterator[tuple[Expr, dict, Expr | None]]:
    """(kk, coordinates of K position k0 + kk, None) in whole steps of tiles.K_STEP
    words, then the last step's (kk, coordinates, whether kk is in the block): past the
    block the coordinates stay at its last position, whose value packing replaces by 0."""
    steps = block.depth // K_STEP
    for step in fb.range(steps, name="ks"):
        for w in fb.range(K_STEP, kind="vectorize", name="kw"):
            kk = step * K_STEP + w
            yield kk, gemm.coords(fb, "k", block.k0 + kk), None
    with fb.if_(block.depth % K_STEP > 0):
        for w in fb.range(K_STEP, kind="vectorize", name="kw"):
            kk = steps * K_STEP + w
            last = static_min(kk, block.depth - 1)
            yield kk, gemm.coords(fb, "k", block.k0 + last), kk < block.depth


def pack_right(fb: FunctionBuilder, gemm: ResolvedGemm, tile: MacroTile, block: KBlock,
                ragged_only: bool) -> Buffer:
    """b_pack[p, kk, c] = right(k0 + kk, col0 + p * micro_n + c), zero past the last
    column. Whole micro-panels are filled row by row of the block (K outer), so each
    row of B is read along one contiguous stretch, which the hardware prefetcher
    follows (4% of 1024^3 over panel by panel); the ragged last one is filled with
    bounds checks. With ``ragged_only``, just the ragged panel, into b_pack[0].

    No software prefetch: constant weights are laid out at compile time (and prefetched
    there, see program._Panels), so B here is an activation, in cache when the kernel
    before has just written it. A prefetch per panel row made no difference to static
    products and cost those of symbolic width 10-25% (attention's T x T products).

    Panels are a cache line more than block_k rows apart: at exactly block_k rows (a
    multiple of 4 KiB), filling a row of every panel hit one L1 set block_n / micro_n
    times over, and a 7x7x512 convolution spent a third of its time in those stores."""
    cfg, nr = gemm.cfg, gemm.cfg.micro_n
    panels = 1 if ragged_only else cfg.block_n // nr
    dtype = gemm.pattern.accumulator
    b_pack = fb.buffer("b_pack", dtype, [panels, panel_rows(cfg), nr])
    zero = 0.0 if dtype.is_float else 0

    def fill_row(p, slot, kk, k: dict, checked: bool) -> None:
        for (col,) in repeat(nr).on(0):
            value = gemm.pattern.element(_right_at(gemm, tile, p * nr + col, k))
            b_pack[slot, kk, col] = (select(p * nr + col < tile.cols, value, zero)
                                     if checked else value)

    if not ragged_only:
        for kk, k in k_walk(fb, gemm, block):
            for p in fb.range(tile.cols // nr, name="p"):
                fill_row(p, p, kk, k, checked=False)
    with fb.if_(tile.cols % nr > 0):
        last = tile.cols // nr
        for kk, k in k_walk(fb, gemm, block):
            fill_row(last, 0 if ragged_only else last, kk, k, checked=True)
    return b_pack


def _right_at(gemm: ResolvedGemm, tile: MacroTile, col, k: dict) -> Expr:
    """The right factor at the tile's column ``col`` and K coordinates ``k``."""
    n = dict(zip(gemm.pattern.n_axes, unravel(tile.col0 + col, gemm.extents["n"])))
    return substitute(gemm.pattern.right, {**tile.batch, **n, **k})

