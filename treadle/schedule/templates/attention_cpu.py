"""The CPU template for attention as one kernel: both products and the softmax between
them, the scores never leaving the core's cache.

Greedy fusion runs attention as three kernels (Q Kᵀ with the scale and mask at its
stores, the softmax, P V), and the scores make three round trips through memory: 12 MB
per BERT layer at 512 tokens, 16 MB per head in Segformer's first stage. Here a thread
takes a block of query rows of one batch (one head) and

1. computes the block's scores with the register tile of the GEMM template
   (``micro_kernel``) against Kᵀ, packed once per batch in micro-panels of key columns;
2. applies the logits' element-wise work (scale, mask), then per row the maximum, the
   exponentials and their sum, in place;
3. multiplies the block by V, packed once per batch in micro-panels of value columns,
   with the same register tile, and stores each result divided by its row's sum.

A block's scores are a few rows by every key, so they stay in L1 between the steps.
Every step is read off the fused operator's computes (``AttentionParts``, made by the
orchestrator from the primitives it fuses), not from operator names: the logits' work,
the exponential and the final division are the primitives' own expressions. Loads of Q,
K and V are scalar, in the packing, and stores are scalar, so prologues and epilogues
fuse into it as into any kernel.
"""
from __future__ import annotations

import math

from treadle.graph.operator import Operator
from treadle.graph.ops.orchestrated import AttentionParts
from treadle.ir.builder import FunctionBuilder
from treadle.ir.compute import Compute, reachable
from treadle.ir.dtypes import boolean, float32
from treadle.ir.expr import Buffer, Const, Expr, Load, Var, as_expr, minimum
from treadle.ir.functor import rewrite, substitute, walk
from treadle.ir.mapping import unravel
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import Inliner, canonical_kernel
from treadle.schedule.templates.gemm.micro_kernel import RegisterTile, register_tile
from treadle.target.cpu import CpuTarget

# Rows of the register tile, and its vectors per row where the target has 32 vector
# registers (AVX-512) or 16: 6 x 4 accumulators + 4 operands + 1 broadcast fill 29 of 32.
MICRO_ROWS = 6
VECTORS = {32: 4, 16: 2}
MAX_BLOCKS = 4  # register tiles of rows in a block of query rows


def _sizes(parts: AttentionParts) -> tuple[list[int], int, int, int, int]:
    """(batch shape, queries, keys, depth, value columns): constants, as the orchestrator
    fuses attention only where every size is known."""
    dims = [*parts.scores.shape, *parts.scores.reduce_extents, parts.out.shape[-1]]
    *batch, queries, keys, depth, columns = (d.value for d in dims)
    return batch, queries, keys, depth, columns


def _value(c: Compute, index: tuple, given: dict[Buffer, Expr]) -> Expr:
    """``c`` at ``index`` with its joined computes inlined, and each load of a buffer in
    ``given`` (read at the same rows) replaced by the value given for it."""
    if c.buffer in given:  # the logits are the scores themselves
        return given[c.buffer]
    inline = Inliner(reachable([c]), keep=given)
    value = inline(substitute(c.value, dict(zip(c.axes, index))))
    return rewrite(value, lambda n: given[n.buffer]
                   if isinstance(n, Load) and n.buffer in given else None)


def _factor(product: Compute, index: tuple, reduce_index: Expr, which: int) -> Expr:
    """The left (0) or right (1) factor of a sum of products at ``index``."""
    value = substitute(product.value, {**dict(zip(product.axes, index)),
                                       product.reduce_axes[0]: reduce_index})
    return Inliner(reachable([product]))((value.a, value.b)[which])


def schedule_attention(op: Operator, name: str, target: CpuTarget) -> Kernel:
    parts: AttentionParts = op.attrs["parts"]
    batch_shape, queries, keys, depth, columns = _sizes(parts)
    lanes = target.widest_simd_bytes // 4
    vectors = VECTORS[32 if target.vector_registers >= 32 else 16]
    key_tile = RegisterTile(MICRO_ROWS, min(vectors, -(-keys // lanes)) * lanes, lanes)
    value_tile = RegisterTile(MICRO_ROWS, min(vectors, -(-columns // lanes)) * lanes, lanes)
    padded_keys = -(-keys // key_tile.cols) * key_tile.cols
    padded_columns = -(-columns // value_tile.cols) * value_tile.cols
    # The block's scores fill at most half of L1.
    tiles = max(1, min(MAX_BLOCKS, target.l1d_bytes // 2 // (MICRO_ROWS * padded_keys * 4)))
    rows = MICRO_ROWS * tiles
    batches, blocks = math.prod(batch_shape), -(-queries // rows)
    with FunctionBuilder(name) as fb:
        used = {n.buffer for c in reachable([parts.out]).values() for n in walk(c.value)
                if isinstance(n, Load)}
        for buffer in op.input_buffers:
            if buffer is not None and buffer in used:
                fb.add_param(buffer)
        out = fb.add_param(parts.out.buffer)
        k_panels = fb.add_param(Buffer("k_panels", float32, (
            batches, padded_keys // key_tile.cols, depth, key_tile.cols), "global"))
        v_panels = fb.add_param(Buffer("v_panels", float32, (
            batches, padded_columns // value_tile.cols, keys, value_tile.cols), "global"))
        for b in fb.range(batches, kind="parallel", name="b"):
            index = unravel(b, batch_shape)
            _pack(fb, k_panels, b, key_tile.cols, padded_keys, keys, depth, True,
                  lambda j, d: _factor(parts.scores, (*index, 0, j), d, 1))
            _pack(fb, v_panels, b, value_tile.cols, padded_columns, columns, keys, False,
                  lambda c, j: _factor(parts.product, (*index, 0, c), j, 1))
        for task in fb.range(batches * blocks, kind="parallel", name="task"):
            b = fb.let("b", task // blocks)
            first = fb.let("first", task % blocks * rows)
            count = fb.let("count", minimum(as_expr(rows), queries - first))
            index = unravel(b, batch_shape)
            q = _query_block(fb, parts, index, first, count, rows, depth)
            scores = fb.buffer("scores", float32, [rows, padded_keys])
            _block_product(fb, key_tile, tiles, q, k_panels, b, depth, scores)
            totals = fb.buffer("totals", float32, [rows])
            _softmax_rows(fb, parts, index, first, count, rows, keys, padded_keys, scores,
                          totals)
            result = fb.buffer("result", float32, [rows, padded_columns])
            _block_product(fb, value_tile, tiles, scores, v_panels, b, keys, result)
            for r in fb.range(count, name="r"):
                for c in fb.range(columns, kind="vectorize", name="c"):
                    at = (*index, first + r, c)
                    out[at] = _value(parts.out, at, {parts.product.buffer: result[r, c],
                                                     parts.total.buffer: totals[r]})
    return canonical_kernel(fb.function, op.input_buffers, 1)


def _query_block(fb: FunctionBuilder, parts: AttentionParts, index: tuple, first: Var,
                 count: Var, rows: int, depth: int) -> Buffer:
    """The block's rows of Q (zeros past the last query)."""
    q = fb.buffer("q", float32, [rows, depth])
    for r in fb.range(rows, name="r"):
        with fb.if_(r < count):
            for d in fb.range(depth, kind="vectorize", name="d"):
                q[r, d] = _factor(parts.scores, (*index, first + r, 0), d, 0)
        with fb.else_():
            for d in fb.range(depth, kind="vectorize", name="d"):
                q[r, d] = 0.0
    return q


def _block_product(fb: FunctionBuilder, tile: RegisterTile, tiles: int, left: Buffer,
                   panels: Buffer, b: Var, depth: int, into: Buffer) -> None:
    """into = left (tiles x tile.rows rows) times batch ``b``'s packed right factor,
    one register tile at a time, each micro-panel of the right factor kept in L1 while
    every row tile passes over it."""
    lanes = tile.lanes
    for ct in fb.range(panels.shape[1], name="ct"):
        for rt in fb.range(tiles, name="rt"):
            register_tile(fb, tile, into, (rt * tile.rows, ct * tile.cols),
                          Const(True, boolean), depth,
                          lambda kk, rt=rt, ct=ct: (
                              lambda r: left[rt * tile.rows + r, kk],
                              lambda v: panels.vload((b, ct, kk, v * lanes), lanes)))


def _pack(fb: FunctionBuilder, panels: Buffer, b: Var, width: int, padded: int, extent: int,
          depth: int, by_depth: bool, value) -> None:
    """Batch ``b``'s factor in micro-panels of ``width`` columns: ``panels[b, tile, k, c]``
    is ``value(column, k)`` for column ``tile * width + c`` below ``extent``, else zero.
    Columns are the outer loop where the factor's rows run along depth (Kᵀ read from
    K's rows), so both reads and writes stay close together."""
    def put(tile: Var, c: Var, k: Var) -> None:
        column = tile * width + c
        with fb.if_(column < extent):
            panels[b, tile, k, c] = value(column, k)
        with fb.else_():
            panels[b, tile, k, c] = 0.0
    for tile in fb.range(padded // width, name="tile"):
        if by_depth:
            for c in fb.range(width, name="c"):
                for k in fb.range(depth, name="k"):
                    put(tile, c, k)
        else:
            for k in fb.range(depth, name="k"):
                for c in fb.range(width, kind="vectorize", name="c"):
                    put(tile, c, k)


def _softmax_rows(fb: FunctionBuilder, parts: AttentionParts, index: tuple, first: Var,
                  count: Var, rows: int, keys: int, padded_keys: int, scores: Buffer,
                  totals: Buffer) -> None:
    """Each row of the block's scores becomes its weights (zero in the padding columns)
    and ``totals`` their sums; rows past the queries become zeros."""
    for r in fb.range(rows, name="r"):
        with fb.if_(r < count):
            i = first + r
            top = fb.scalar("top", float32, -math.inf)
            for j in fb.range(keys, kind="vectorize", name="j"):
                at = (*index, i, j)
                x = fb.let("x", _value(parts.logits, at, {parts.scores.buffer: scores[r, j]}))
                scores[r, j] = x
                fb.accumulate(top, "max", x)
            total = fb.scalar("total", float32, 0.0)
            for j in fb.range(keys, kind="vectorize", name="j"):
                at = (*index, i, j)
                e = fb.let("e", _value(parts.weights, at, {parts.logits.buffer: scores[r, j],
                                                           parts.maximum.buffer: top[()]}))
                scores[r, j] = e
                fb.accumulate(total, "sum", e)
            totals[r] = total[()]
            for j in fb.range(padded_keys - keys, name="j"):
                scores[r, keys + j] = 0.0
        with fb.else_():
            for j in fb.range(padded_keys, kind="vectorize", name="j"):
                scores[r, j] = 0.0
