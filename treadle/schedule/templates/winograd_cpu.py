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
from treadle.ir.expr import (Buffer, Const, Expr, Load, as_expr, ceil_div, logical_and,
                              minimum, select)
from treadle.ir.functor import free_vars, rewrite, substitute, walk
from treadle.ir.mapping import unravel
from treadle.ir.simplify import simplify_expr
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import canonical_kernel, split_epilogue
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
    batch, height, width = (_size(d) for d in x.shape[:3])
    channels, filters = _int(x.shape[3]), _int(red.shape[-1])
    out_size = (_size(height - 2), _size(width - 2))
    grid = [batch, *(_size(ceil_div(s, f.tile)) for s in out_size)]
    tiles = _size(math.prod(grid))
    # A block's buffers are on the stack, so their size is static; where the tile count
    # is symbolic, a block runs only the register tiles its tiles fill.
    per_block = min(MAX_TILES_PER_BLOCK,
                    max(1, V_BYTES // (4 * f.positions * channels * ROWS)) * ROWS)
    if isinstance(tiles, int):
        per_block = min(per_block, math.ceil(tiles / ROWS) * ROWS)
    chunk = next(c for c in CHUNKS if filters % c == 0)
    blocks, chunks = ceil_div(tiles, per_block), filters // chunk
    with FunctionBuilder(name) as fb:
        used = {n.buffer for n in walk(epilogue) if isinstance(n, Load)} | {x, u}
        for buffer in op.input_buffers:
            if buffer is not None and buffer in used:
                fb.add_param(buffer)
        fb.add_param(out.buffer)
        for var in sorted({v for p in fb.params for d in p.shape for v in free_vars(d)},
                          key=lambda v: v.name):
            fb.add_param(var)
        for item in fb.range(blocks * chunks, kind="parallel", name="item"):
            first = fb.let("first", item // chunks * per_block)
            k0 = fb.let("k0", item % chunks * chunk)
            v = fb.buffer("v", float32, [f.positions, per_block, channels])
            m = fb.buffer("m", float32, [f.positions, per_block, chunk])
            rows = per_block // ROWS if isinstance(tiles, int) else \
                fb.let("rows", ceil_div(minimum(tiles - first, per_block), ROWS))
            _input_transform(fb, f, x, v, first, grid, out_size, rows)
            _products(fb, f, u, v, m, k0, channels, rows,
                      RegisterTile(ROWS, PANEL, target.register_lanes(PANEL)))
            _output_transform(fb, f, m, first, grid, out_size, k0, (red, epilogue, out.buffer))
    return canonical_kernel(fb.function, op.input_buffers, 1)


def _int(d) -> int:
    d = _size(d)
    if isinstance(d, int):
        return d
    raise UnsupportedOpError(f"WinogradConv needs static channels, got {d}")


def _size(d):
    """A size as an int where it is static, else its simplified expression."""
    d = simplify_expr(as_expr(d))
    return d.value if isinstance(d, Const) else d


def _input_transform(fb: FunctionBuilder, f: Transform, x: Buffer, v: Buffer, first, grid,
                     out_size, rows) -> None:
    """v[e, t, c] = (BT d BT^T)[e] for the input tile d of block tile t, for the ``rows``
    register tiles' tiles of the block. Tiles past the last repeat it (their products
    are never stored); positions past the input's edge, where the output size is not a
    multiple of the tile, read as zero."""
    tiles = _size(math.prod(grid))
    for t in fb.range(rows * ROWS, name="t"):
        n, ty, tx = (fb.let(a, e) for a, e in
                     zip(("n", "ty", "tx"), unravel(minimum(first + t, tiles - 1), grid)))
        _by_edges(fb, f, (ty, tx), f.window, [s + 2 for s in out_size], out_size,
                  lambda edges: _transform_tile(fb, f, x, v, t, (n, ty, tx), out_size, edges))


def _by_edges(fb: FunctionBuilder, f: Transform, tile: tuple, side: int, bounds,
              out_size, body) -> None:
    """``body(edges)`` for the tile at ``tile`` (ty, tx) spanning ``side`` positions along
    each axis from its corner, ``edges`` the axes on which it may pass ``bounds``: none
    for a tile inside, so only the tiles on an edge check each element (with a symbolic
    size every tile might be on one: checking in every tile ran 1.2-2.2x slower)."""
    edges = [a for a, out in enumerate(out_size) if _ragged(out, f)]
    if not edges:
        body(())
        return
    with fb.if_(logical_and(*(tile[a] * f.tile + side <= bounds[a] for a in edges))):
        body(())
    with fb.else_():
        body(edges)


def _transform_tile(fb: FunctionBuilder, f: Transform, x: Buffer, v: Buffer, t,
                    tile: tuple, out_size, edges) -> None:
    """v[:, t, :] for the input tile at ``tile`` (n, ty, tx), every channel, reading zero
    past the input on the axes of ``edges``."""
    n, ty, tx = tile
    span = range(f.window)
    for c in fb.range(v.shape[2], name="c"):
        d = [[_tile_input(x, out_size, edges, (n, ty * f.tile + i, tx * f.tile + j, c))
              for j in span] for i in span]
        half = [[fb.let("r", _combine(f.bt[a], [d[i][j] for i in span])) for j in span]
                for a in span]
        for a in span:
            for b in span:
                v[a * f.window + b, t, c] = _combine(f.bt[b], half[a])


def _tile_input(x: Buffer, out_size, edges, index) -> Expr:
    """x at (n, row, col, c), zero past the input on the axes of ``edges``."""
    conds, index = [], list(index)
    for axis in edges:
        conds.append(index[axis + 1] < out_size[axis] + 2)
        index[axis + 1] = minimum(index[axis + 1], as_expr(out_size[axis] + 1))
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


def _ragged(out, f: Transform) -> bool:
    """Whether the tiles may overhang the output (a symbolic size may not divide)."""
    return not isinstance(out, int) or out % f.tile != 0


def _products(fb: FunctionBuilder, f: Transform, u: Buffer, v: Buffer, m: Buffer, k0,
              channels: int, rows, tile: RegisterTile) -> None:
    """m[e, t, j] = sum over c of v[e, t, c] * U[e, c, k0 + j], in ``rows`` register
    tiles."""
    lanes = tile.lanes
    chunk = m.shape[2]
    for e in fb.range(f.positions, name="e"):
        for q in fb.range(chunk // PANEL, name="q"):
            panel = fb.let("panel", k0 // PANEL + q)
            for p in fb.range(rows, name="p"):
                def step(kk, e=e, p=p, panel=panel):
                    return (lambda r: v[e, p * ROWS + r, kk],
                            lambda w: u.vload((e, panel, kk, w * lanes), lanes))
                register_tile(fb, tile, m, (e, p * ROWS, q * PANEL), as_expr(True), channels,
                              step)


def _output_transform(fb: FunctionBuilder, f: Transform, m: Buffer, first, grid, out_size,
                      k0, output) -> None:
    """Each tile's outputs (AT M AT^T) through the epilogue, inside the output."""
    tiles = _size(math.prod(grid))
    for t in fb.range(m.shape[1], name="t"):
        with fb.if_(first + t < tiles):
            n, ty, tx = (fb.let(a, e) for a, e in
                         zip(("n", "ty", "tx"), unravel(first + t, grid)))
            _by_edges(fb, f, (ty, tx), f.tile, out_size, out_size,
                      lambda edges: _untransform_tile(fb, f, m, t, (n, ty, tx), out_size, k0,
                                                      output, edges))


def _untransform_tile(fb: FunctionBuilder, f: Transform, m: Buffer, t, tile: tuple, out_size,
                      k0, output, edges) -> None:
    """The outputs of block tile t at ``tile`` (n, ty, tx), every channel of the chunk,
    stored where they fall inside the output on the axes of ``edges``."""
    n, ty, tx = tile
    span = range(f.window)
    # A simd loop: with a symbolic image size gcc cannot tell the stores to the tile's
    # rows apart at run time and left the loop scalar (2x slower).
    for j in fb.range(m.shape[2], kind="vectorize", name="j"):
        prods = [[m[a * f.window + b, t, j] for b in span] for a in span]
        rows = [[fb.let("s", _combine(f.at[a], [prods[i][b] for i in span]))
                 for b in span] for a in range(f.tile)]
        for a in range(f.tile):
            for b in range(f.tile):
                index = (n, ty * f.tile + a, tx * f.tile + b, k0 + j)
                _store(fb, output, out_size, edges, index, _combine(f.at[b], rows[a]))


def _store(fb: FunctionBuilder, output, out_size, edges, index, value: Expr) -> None:
    red, epilogue, out = output
    result = rewrite(substitute(epilogue, dict(zip(red.axes, index))),
                     lambda node: value if isinstance(node, Load)
                     and node.buffer == red.buffer else None)
    if edges:
        with fb.if_(logical_and(*(index[a + 1] < out_size[a] for a in edges))):
            fb.store(out, index, result)
    else:
        fb.store(out, index, result)
