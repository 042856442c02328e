"""The GEMM program generated from a resolved config: ``emit``.

Work distribution: the macro-tiles are the iterations of a parallel loop (each thread
takes a contiguous run of them). For each K block a macro-tile packs both factors
(``packing``) and runs the register tile (``micro_kernel``) over every pair of
micro-panels; it starts from zero in the first K block and from the accumulator after
that, and in the last K block stores its results straight to the output (through the
epilogue). A right factor that reads only constants (weights) is laid out in micro-panel
order once, at compile time, never packed at run time, and prefetched a micro-panel
ahead. Where every macro-tile spans the same rows, the threads first pack the left
factor for all of K together, into a workspace every tile reads. A factor that only one
register tile would read is read in place instead of packed.

``split_k`` > 1 (small M x N, long K): the workers of ``spatial(groups, split_k)`` each
accumulate one K part of a macro-tile into a shared workspace; a second parallel loop
sums the parts and applies the epilogue.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from treadle.ir.builder import FunctionBuilder
from treadle.ir.expr import Buffer, Expr, Load, call, ceil_div, eq
from treadle.ir.functor import substitute
from treadle.ir.mapping import spatial, unravel
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import canonical_kernel
from treadle.schedule.templates.gemm.micro_kernel import Slice, register_tile, spill
from treadle.schedule.templates.gemm.packing import (KBlock, MacroTile, k_block, k_walk,
                                                     pack_left, pack_right, pack_whole_left,
                                                     whole_left_buffer)
from treadle.schedule.templates.gemm.pattern import (declare_parameters, right_row,
                                                     static_max, static_min)
from treadle.schedule.templates.gemm.resolve import ResolvedGemm, worker_groups
from treadle.schedule.templates.gemm.tiles import (TILE_ROWS, TILE_WORDS, TiledLeft,
                                                   TilePanels, acc_offset, acc_size,
                                                   begin_tiles, end_tiles, tile_index,
                                                   tile_parts, tile_product)


def emit(gemm: ResolvedGemm, name: str) -> Kernel:
    """The kernel ``name`` of a resolved GEMM; the pattern's checks (run-time conditions on
    symbolic sizes) are asserted before any work."""
    pattern, panels = gemm.pattern, gemm.panels
    with FunctionBuilder(name) as fb:
        laid_out = [panels.buffer] if panels is not None else []
        if gemm.whole_left:
            laid_out.append(whole_left_buffer(gemm))
        out, *extra = declare_parameters(fb, pattern, panels is None, laid_out)
        left = extra[-1] if gemm.whole_left else None
        if gemm.cfg.split_k == 1:
            _whole_k(fb, gemm, out, left)
        else:
            _split_k(fb, gemm, out)
    return canonical_kernel(fb.function, pattern.inputs, 1, (panels,) if panels else ())


def _whole_k(fb: FunctionBuilder, gemm: ResolvedGemm, out: Buffer, left: Buffer | None) -> None:
    cfg = gemm.cfg
    if left is not None:
        pack_whole_left(fb, gemm, left)
    for t in fb.range(gemm.num_tiles, kind="parallel", name="tile"):
        if gemm.tiled:
            begin_tiles(fb)
        tile = MacroTile(fb, gemm, t)
        acc = fb.buffer("acc", gemm.pattern.accumulator,
                        [acc_size(cfg.block_m, cfg.block_n)] if gemm.tiled
                        else [cfg.block_m, cfg.block_n])
        store = _store_tile if gemm.tiled else _store_rows
        _accumulate(fb, gemm, tile, acc, (), 0, gemm.size("k"), left,
                    lambda *finished: store(fb, gemm, out, tile, *finished))
        if gemm.tiled:
            end_tiles(fb)


def _store_rows(fb: FunctionBuilder, gemm: ResolvedGemm, out: Buffer, tile: MacroTile, rows: Buffer,
                p) -> None:
    """Stores the finished rows of micro-panel p of ``tile`` from ``rows`` (in L1), one
    element at a time, where fusion puts the epilogue: results never make a round trip
    through the macro-tile's accumulator, and each output row goes out in one stretch."""
    mr, nr = gemm.cfg.micro_m, gemm.cfg.micro_n
    for i in fb.range(static_min(mr, tile.rows - p * mr), name="i"):
        m = gemm.coords(fb, "m", tile.row0 + p * mr + i)
        # By micro-panels of columns: an epilogue that splits N (a reshape into heads)
        # divides col0 + q * micro_n + c, which simplifies to per-panel quotients, so the
        # stores along c stay contiguous and vectorise. A simd loop: inside the parallel
        # region gcc no longer knows the output does not overlap the epilogue's inputs
        # and would check for overlap at run time (5-15% of 1x1 convolutions with few
        # input channels, whose stores weigh most). Whole panels apart from the ragged
        # last one: a trip count of min(micro_n, ...) for every panel, where the columns
        # are a symbol, cost attention's T x T products 20% of their time.
        for q in fb.range(tile.cols // nr, name="q"):
            for c in fb.range(nr, kind="vectorize", name="c"):
                _store(fb, gemm, out, tile, m, q * nr + c, rows[i, q * nr + c])
        with fb.if_(tile.cols % nr > 0):
            last = tile.cols // nr * nr
            for c in fb.range(tile.cols - last, kind="vectorize", name="c"):
                _store(fb, gemm, out, tile, m, last + c, rows[i, last + c])


def _split_k(fb: FunctionBuilder, gemm: ResolvedGemm, out: Buffer) -> None:
    cfg, tiles = gemm.cfg, gemm.num_tiles
    groups, parts = worker_groups(cfg, gemm.threads), cfg.split_k
    dtype = gemm.pattern.accumulator
    partials = fb.buffer("partials", dtype, [groups * parts, cfg.block_m, cfg.block_n],
                         scope="shared")
    K = gemm.size("k")
    k_part = ceil_div(K, parts)
    for rnd in fb.range(ceil_div(tiles, groups), name="round"):
        for worker in fb.range(groups * parts, kind="parallel", name="worker"):
            for g, part in spatial(groups, parts).on(worker):
                with fb.if_(rnd * groups + g < tiles):
                    tile = MacroTile(fb, gemm, rnd * groups + g)
                    k_begin = fb.let("k_begin", static_min(part * k_part, K))
                    k_len = fb.let("k_len", static_min(k_part, K - k_begin))
                    _accumulate(fb, gemm, tile, partials, (g * parts + part,), k_begin, k_len)
        for row in fb.range(groups * cfg.block_m, kind="parallel", name="row"):
            for g, i in spatial(groups, cfg.block_m).on(row):
                with fb.if_(rnd * groups + g < tiles):
                    tile = MacroTile(fb, gemm, rnd * groups + g)
                    with fb.if_(i < tile.rows):
                        m = gemm.coords(fb, "m", tile.row0 + i)
                        for j in fb.range(tile.cols, name="j"):
                            total = fb.scalar("total", dtype, 0.0 if dtype.is_float else 0)
                            for p in fb.range(parts, name="p"):
                                total[()] = total[()] + partials[g * parts + p, i, j]
                            _store(fb, gemm, out, tile, m, j, total[()])


def _store(fb: FunctionBuilder, gemm: ResolvedGemm, out: Buffer, tile: MacroTile, m: dict, j,
           value: Expr) -> None:
    pattern = gemm.pattern
    n = dict(zip(pattern.n_axes, unravel(tile.col0 + j, gemm.extents["n"])))
    coords = {**tile.batch, **m, **n}
    index = tuple(coords[a] for a in pattern.compute.axes)
    out[index] = pattern.store_value(value, index)


def _accumulate(fb: FunctionBuilder, gemm: ResolvedGemm, tile: MacroTile, acc: Buffer, slot: tuple,
                k_begin, k_len, left: Buffer | None = None,
                finish: Callable[[Buffer, Expr], None] | None = None) -> None:
    """acc[slot + (i, j)] = the tile's products summed over K positions
    [k_begin, k_begin + k_len), one K block of packed panels at a time; with ``finish``,
    the last K block instead gathers each micro-panel p of rows in a [micro_m, block_n]
    buffer and hands it to ``finish(rows, p)``.

    A factor that only one register tile reads per K block (the macro-tile is a single
    micro-panel wide in the other factor's direction: GEMV, tall-skinny shapes) is read in
    place instead, as packing it would cost as much as the products. ``left``, when
    given, holds the left factor already packed for every K block (pack_whole_left).
    On AMX's tiles (gemm.tiled) each K block is _tile_block's, and ``finish(sums, p, q)``
    takes each register tile's sums."""
    cfg = gemm.cfg
    mr, nr = cfg.micro_m, cfg.micro_n
    left_in_place, right_in_place = gemm.in_place
    blocks = static_max(ceil_div(k_len, cfg.block_k), 1)
    rows = None if finish is None or gemm.tiled else fb.buffer(
        "rows", gemm.pattern.accumulator, [mr, cfg.block_n])
    for kb in fb.range(blocks, name="kb"):
        block = k_block(fb, gemm, kb, k_begin, k_len)
        if gemm.tiled:
            a_pack = (pack_left(fb, gemm, tile, block) if left is None
                      else TiledLeft(Slice(left, kb)))
            _tile_block(fb, gemm, tile, acc, (eq(kb, 0), eq(kb, blocks - 1)), block, a_pack,
                        finish)
            continue
        if left is not None:
            a_pack = Slice(left, kb)
        else:
            a_pack = None if left_in_place else pack_left(fb, gemm, tile, block)
        if gemm.panels is not None:
            b_pack = _Panels(gemm.panels.buffer, tile.col0 // nr, block.k0)
        else:
            # In place, the right factor's ragged last micro-panel still needs zero padding.
            b_pack = pack_right(fb, gemm, tile, block, ragged_only=right_in_place)
        packed = _Operands(gemm, tile, block.k0, a_pack, b_pack,
                           0 if right_in_place else None)
        in_place = replace(packed, b_pack=None)
        # Micro-panels of rows outer: a row's finished tiles complete whole output rows,
        # stored in one stretch (1x1 convolutions with few input channels, bound by writing
        # their output, gain 5-10% over B's micro-panels outer); the A micro-panel stays
        # in L1 instead of B's, at equal cost while both blocks sit in L2.
        for p in fb.range(ceil_div(tile.rows, mr), name="p"):
            for q in fb.range(ceil_div(tile.cols, nr), name="q"):
                args = (fb, gemm.register_tile, acc, slot + (p * mr, q * nr), eq(kb, 0), block.depth)
                last = None if rows is None else (
                    eq(kb, blocks - 1), lambda regs, q=q: spill(gemm.register_tile, regs, rows, (0, q * nr)))
                if right_in_place:
                    with fb.if_(q * nr + nr <= tile.cols):
                        register_tile(*args, in_place.reader(fb, p, q), last)
                    with fb.else_():
                        register_tile(*args, packed.reader(fb, p, q), last)
                else:
                    by_rows = k_walk(fb, gemm, block) if a_pack is None else None
                    register_tile(*args, packed.reader(fb, p, q), last, by_rows)
            if rows is not None:
                with fb.if_(eq(kb, blocks - 1)):
                    finish(rows, p)


def _tile_block(fb: FunctionBuilder, gemm: ResolvedGemm, tile: MacroTile, acc: Buffer,
                ends: tuple, block: KBlock, a_pack: TiledLeft,
                finish: Callable[[Buffer, Expr, Expr], None] | None) -> None:
    """_accumulate's K block on AMX's tiles (K is never split there: tiles.tile_config):
    ends = (first, last K block); the sums between K blocks in acc (tiles.acc_size), B's
    tiles from the laid-out panels. With ``finish``, the last K block hands each register
    tile's sums (tiles.tile_index's order) to ``finish(sums, p, q)``."""
    first, last = ends
    mr, nr = gemm.cfg.micro_m, gemm.cfg.micro_n
    b_pack = TilePanels(gemm.panels.buffer, tile.col0 // TILE_WORDS, block.k0)
    for p in fb.range(ceil_div(tile.rows, mr), name="p"):
        for q in fb.range(ceil_div(tile.cols, nr), name="q"):
            done = None if finish is None else (
                last, lambda sums, p=p, q=q: finish(sums, p, q))
            tile_product(fb, acc, acc_offset(p, q, gemm.cfg.block_n), first, block.depth,
                         a_pack, b_pack, p, q, done)


def _store_tile(fb: FunctionBuilder, gemm: ResolvedGemm, out: Buffer, tile: MacroTile,
                sums: Buffer, p, q) -> None:
    """Stores register tile (p, q)'s finished sums from the tiles' scratch (tiles.py's
    order) through the epilogue, a C tile's row of 16 columns at a time: no round trip
    through a buffer of rows, whose copy cost the tiles as much as a tenth of their
    time."""
    for (i, j), rows, cols in tile_parts(p, q, tile.rows, tile.cols):
        for r in fb.range(rows, name="r"):
            m = gemm.coords(fb, "m", tile.row0 + p * gemm.cfg.micro_m + i * TILE_ROWS + r)
            col = q * gemm.cfg.micro_n + j * TILE_WORDS

            def store_row(count) -> None:
                for w in fb.range(count, kind="vectorize", name="w"):
                    _store(fb, gemm, out, tile, m, col + w, sums[tile_index(i, j, r, w)])
            with fb.if_(cols >= TILE_WORDS):  # whole rows: a loop of constant length
                store_row(TILE_WORDS)
            with fb.else_():
                store_row(cols)


@dataclass(frozen=True)
class _Operands:
    """Where register tile (p, q) reads its factors in one K block: the packed panels, or
    the factor itself where its panel is None."""
    gemm: ResolvedGemm
    tile: MacroTile
    k0: Expr
    a_pack: Buffer | Slice | None
    b_pack: Buffer | _Panels | None
    b_panel: int | None  # the one micro-panel b_pack holds, or None for all of them

    def reader(self, fb: FunctionBuilder, p, q):
        """``step(kk)`` -> (a_of(r), b_of(v)) for register_tile; ``step((kk, k))`` with
        the K coordinates k of position kk already bound (a k_walk)."""
        def step(position):
            kk, k = position if isinstance(position, tuple) else (position, None)
            in_place = self.a_pack is None or self.b_pack is None
            if k is None:
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
        row = static_min(self.tile.row0 + p * mr + r, gemm.size("m") - 1)
        m = dict(zip(gemm.pattern.m_axes, unravel(row, gemm.extents["m"])))
        return gemm.pattern.element(substitute(gemm.pattern.left, {**self.tile.batch, **m, **k}))

    def _right(self, q, kk, k: dict, v) -> Expr:
        lanes = self.gemm.lanes
        if self.b_pack is not None:
            panel = q if self.b_panel is None else self.b_panel
            return self.b_pack.vload((panel, kk, v * lanes), lanes)
        col = self.tile.col0 + q * self.gemm.cfg.micro_n + v * lanes
        right, coords = right_row(self.gemm.pattern), {**self.tile.batch, **k}
        indices = tuple(substitute(i, coords) for i in right.indices[:-1]) + (col,)
        return Load(right.buffer, indices, lanes)


@dataclass(frozen=True)
class _Panels:
    """A tile's micro-panels in the panels laid out at compile time (panel_layout), from
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
