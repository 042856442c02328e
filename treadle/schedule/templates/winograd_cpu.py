"""The CPU template of ``WinogradConv`` (F(m x m, 3x3), see ``graph.ops.winograd``).

Work items are (block of output tiles, chunk of output channels) pairs, spread over the
threads. For its block an item

1. transforms the input tiles, ``v[e, t, c]`` for every transform position e, with the
   BT table unrolled into multiply-adds (zero coefficients vanish, +-1 ones are
   additions), along contiguous channels so the C compiler vectorises it;
2. runs one small matrix product ``m[e] = v[e] @ U[e]`` per position over the chunk's
   output channels with the matmul template's register tiles, reading v in place and U,
   which is stored in the tiles' panel order, directly;
3. transforms each tile's products back into its m x m outputs (AT unrolled) and stores
   them through the operator's epilogue (the bias, and whatever fusion adds).

An item recomputes its block's input transform for every channel chunk, which costs a
small fraction of the products; both buffers live on the thread's stack.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from treadle.errors import UnsupportedOpError
from treadle.graph.operator import Operator
from treadle.graph.ops.winograd import PANEL, TRANSFORMS, Transform
from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import float32
from treadle.ir.expr import Buffer, Const, Expr, Load, as_expr, logical_and, minimum, select
from treadle.ir.functor import rewrite, substitute, walk
from treadle.ir.mapping import unravel
from treadle.schedule.rules import Kernel, canonical_kernel, split_epilogue
from treadle.schedule.templates.gemm.micro_kernel import RegisterTile, register_tile
from treadle.target.cpu import CpuTarget

ROWS = 6                    # register tile: output tiles x one panel of output channels
MAX_TILES_PER_BLOCK = 60
V_BYTES = 1 << 18           # the transformed input tiles of a block
CHUNKS = (64, 48, 32, 16)   # output channels per work item, the largest dividing K


def schedule_winograd(op: Operator, name: str, target: CpuTarget) -> Kernel:
    f = TRANSFORMS[int(op.attrs.get("tile", 2))]
    out = op.definition[0]
    red, epilogue = split_epilogue(out)
    x, u = op.input_buffers[0], op.input_buffers[1]
    batch, height, width, channels = (_int(d) for d in x.shape)
    filters = _int(red.shape[-1])
    out_size = (height - 2, width - 2)
    grid = [batch, *(math.ceil(s / f.tile) for s in out_size)]
    tiles = math.prod(grid)
    per_block = min(MAX_TILES_PER_BLOCK, math.ceil(tiles / ROWS) * ROWS,
                    max(1, V_BYTES // (4 * f.positions * channels * ROWS)) * ROWS)
    chunk = next(c for c in CHUNKS if filters % c == 0)
    blocks, chunks = math.ceil(tiles / per_block), filters // chunk
    with FunctionBuilder(name) as fb:
        used = {n.buffer for n in walk(epilogue) if isinstance(n, Load)} | {x, u}
        for buffer in op.input_buffers:
            if buffer is not None and buffer in used:
                fb.add_param(buffer)
        fb.add_param(out.buffer)
        for item in fb.range(blocks * chunks, kind="parallel", name="item"):
            first = fb.let("first", item // chunks * per_block)
            k0 = fb.let("k0", item % chunks * chunk)
            v = fb.buffer("v", float32, [f.positions, per_block, channels])
            m = fb.buffer("m", float32, [f.positions, per_block, chunk])
            _input_transform(fb, f, x, v, first, grid, out_size)
            _products(fb, f, u, v, m, k0, channels, RegisterTile(ROWS, PANEL,
                                                                 target.register_lanes(PANEL)))
            _output_transform(fb, f, m, first, grid, out_size, k0, (red, epilogue, out.buffer))
    return canonical_kernel(fb.function, op.input_buffers, 1)


def _int(d) -> int:
    if isinstance(d, int):
        return d
    if isinstance(d, Const):
        return d.value
    raise UnsupportedOpError(f"WinogradConv needs static sizes, got {d}")


def _input_transform(fb: FunctionBuilder, f: Transform, x: Buffer, v: Buffer, first, grid,
                     out_size) -> None:
    """v[e, t, c] = (BT d BT^T)[e] for the input tile d of block tile t. Tiles past the
    last repeat it (their products are never stored); positions past the input's edge,
    where the output size is not a multiple of the tile, read as zero."""
    tiles, span = math.prod(grid), range(f.window)
    for t in fb.range(v.shape[1], name="t"):
        n, ty, tx = (fb.let(a, e) for a, e in
                     zip(("n", "ty", "tx"), unravel(minimum(first + t, tiles - 1), grid)))
        for c in fb.range(v.shape[2], name="c"):
            d = [[_tile_input(f, x, out_size, (n, ty * f.tile + i, tx * f.tile + j, c))
                  for j in span] for i in span]
            rows = [[fb.let("r", _combine(f.bt[a], [d[i][j] for i in span])) for j in span]
                    for a in span]
            for a in span:
                for b in span:
                    v[a * f.window + b, t, c] = _combine(f.bt[b], rows[a])


def _tile_input(f: Transform, x: Buffer, out_size, index) -> Expr:
    """x at (n, row, col, c), zero past an edge that the tiles overhang (an output size
    that is not a multiple of the tile)."""
    conds, index = [], list(index)
    for axis, out in enumerate(out_size, start=1):
        if out % f.tile:
            conds.append(index[axis] < out + 2)
            index[axis] = minimum(index[axis], as_expr(out + 1))
    value = x[tuple(index)]
    return select(logical_and(*conds), value, Const(0.0, float32)) if conds else value


def _combine(coefficients: np.ndarray, terms: Sequence[Expr]) -> Expr:
    """sum of coefficient * term, with the 0 and +-1 coefficients written as such."""
    total: Expr | None = None
    for k, term in zip(coefficients, terms):
        if k == 0:
            continue
        scaled = term if abs(k) == 1 else term * Const(float(abs(k)), float32)
        if total is None:
            total = scaled if k > 0 else -scaled
        else:
            total = total + scaled if k > 0 else total - scaled
    return total if total is not None else Const(0.0, float32)


def _products(fb: FunctionBuilder, f: Transform, u: Buffer, v: Buffer, m: Buffer, k0,
              channels: int, tile: RegisterTile) -> None:
    """m[e, t, j] = sum over c of v[e, t, c] * U[e, c, k0 + j], in register tiles."""
    lanes = tile.lanes
    per_block, chunk = m.shape[1], m.shape[2]
    for e in fb.range(f.positions, name="e"):
        for q in fb.range(chunk // PANEL, name="q"):
            panel = fb.let("panel", k0 // PANEL + q)
            for p in fb.range(per_block // ROWS, name="p"):
                def step(kk, e=e, p=p, panel=panel):
                    return (lambda r: v[e, p * ROWS + r, kk],
                            lambda w: u.vload((e, panel, kk, w * lanes), lanes))
                register_tile(fb, tile, m, (e, p * ROWS, q * PANEL), as_expr(True), channels,
                              step)


def _output_transform(fb: FunctionBuilder, f: Transform, m: Buffer, first, grid, out_size,
                      k0, output) -> None:
    """Each tile's outputs (AT M AT^T) through the epilogue, inside the output."""
    tiles, span = math.prod(grid), range(f.window)
    for t in fb.range(m.shape[1], name="t"):
        with fb.if_(first + t < tiles):
            n, ty, tx = (fb.let(a, e) for a, e in
                         zip(("n", "ty", "tx"), unravel(first + t, grid)))
            for j in fb.range(m.shape[2], name="j"):
                prods = [[m[a * f.window + b, t, j] for b in span] for a in span]
                rows = [[fb.let("s", _combine(f.at[a], [prods[i][b] for i in span]))
                         for b in span] for a in range(f.tile)]
                for a in range(f.tile):
                    for b in range(f.tile):
                        index = (n, ty * f.tile + a, tx * f.tile + b, k0 + j)
                        _store(fb, f, output, out_size, index, _combine(f.at[b], rows[a]))


def _store(fb: FunctionBuilder, f: Transform, output, out_size, index, value: Expr) -> None:
    red, epilogue, out = output
    conds = [coord < extent for coord, extent in zip(index[1:3], out_size) if extent % f.tile]
    result = rewrite(substitute(epilogue, dict(zip(red.axes, index))),
                     lambda node: value if isinstance(node, Load)
                     and node.buffer == red.buffer else None)
    if conds:
        with fb.if_(logical_and(*conds)):
            fb.store(out, index, result)
    else:
        fb.store(out, index, result)
