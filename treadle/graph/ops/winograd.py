"""Winograd convolution F(2x2, 3x3) (Lavin and Gray): a 3x3, stride-1 convolution computed
per 2x2 output tile from a 4x4 input tile, with 16 multiplications per tile and channel
pair instead of 36.

With d a 4x4 input tile (one channel), g a 3x3 filter and Y the 2x2 output tile:

    V = BT d BT^T,  U = G g G^T,  M = sum over channels of V * U (element-wise, 4x4),
    Y = AT M AT^T

The filter transform U happens once, on constant weights (``transform_weights``); the
``WinogradConv`` operator takes the input in channels-last order and U, stored for the
register tiles of its template as [16, K / PANEL, C, PANEL] (transform position, panel of
output channels, input channel, output channel in the panel). Its compute definition
below is the algorithm's arithmetic, written plainly (the coefficient tables as selects);
the CPU template ``schedule.templates.winograd_cpu`` is its schedule.
"""
from __future__ import annotations

import numpy as np

from treadle.graph.operator import OpContext, register
from treadle.graph.tensor import normalize_dim
from treadle.ir.compute import compute, reduce
from treadle.ir.dtypes import float32
from treadle.ir.expr import Const, Expr, as_expr, cast, eq, logical_and, minimum, select

TILE = 2      # output positions per tile side
WINDOW = 4    # input positions per tile side: TILE + 3 - 1
POSITIONS = WINDOW * WINDOW
PANEL = 16    # output channels per stored panel of U: the register tile's width

BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)


def transform_weights(weight: np.ndarray) -> np.ndarray:
    """A [3, 3, C, K] channels-last filter as U, [16, K / PANEL, C, PANEL] float32."""
    kh, kw, channels, filters = weight.shape
    if (kh, kw) != (3, 3) or filters % PANEL:
        raise ValueError(f"Winograd F(2x2, 3x3) needs a 3x3 filter and a multiple of {PANEL} "
                         f"output channels, got {list(weight.shape)}")
    u = np.einsum("ai,ijck,bj->abck", G, weight.astype(np.float64), G)
    u = u.reshape(POSITIONS, channels, filters // PANEL, PANEL).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(u, dtype=np.float32)


def table(matrix: np.ndarray, row: Expr, col: Expr) -> Expr:
    """matrix[row, col] for index expressions, as nested selects (the reference
    definition's coefficient lookup; the template unrolls the tables instead)."""
    value: Expr = Const(0.0, float32)
    for r in range(matrix.shape[0]):
        for c in range(matrix.shape[1]):
            if matrix[r, c] != 0:
                hit = logical_and(eq(row, r), eq(col, c))
                value = select(hit, Const(float(matrix[r, c]), float32), value)
    return value


@register("WinogradConv")
def winograd_conv(ctx: OpContext):
    """Inputs: x [N, H, W, C] float32 (channels last, unpadded), U from
    ``transform_weights``, an optional bias [K]. Output [N, H - 2, W - 2, K]."""
    x, u = ctx.input(0), ctx.input(1)
    if x.dtype != float32 or u.dtype != float32 or x.rank != 4 or u.rank != 4:
        raise ctx.error("needs a float32 N x H x W x C input and a float32 transformed filter")
    n, h, w, channels = (normalize_dim(d) for d in x.shape)
    dims = [normalize_dim(d) for d in u.shape]
    if dims[0] != POSITIONS or dims[2] != channels or dims[3] != PANEL:
        raise ctx.error(f"filter shape {dims} does not match {channels} input channels")
    filters = dims[1] * PANEL
    out_h, out_w = normalize_dim(as_expr(h) - 2), normalize_dim(as_expr(w) - 2)
    tiles_h = normalize_dim((as_expr(out_h) + 1) // TILE)
    tiles_w = normalize_dim((as_expr(out_w) + 1) // TILE)

    def tile_input(b, ty, tx, e, c, i, j):
        row, col = ty * TILE + i, tx * TILE + j
        inside = logical_and(row < h, col < w)
        value = select(inside, x[b, minimum(row, as_expr(h) - 1), minimum(col, as_expr(w) - 1), c],
                       Const(0.0, float32))
        return table(BT, e // WINDOW, i) * table(BT, e % WINDOW, j) * value
    v = reduce("winograd_v", [n, tiles_h, tiles_w, POSITIONS, channels], [WINDOW, WINDOW],
               tile_input)

    def output(b, y, xx, k, e, c):
        weight = u[e, k // PANEL, c, k % PANEL]
        coefficient = table(AT, y % TILE, e // WINDOW) * table(AT, xx % TILE, e % WINDOW)
        return coefficient * weight * v[b, y // TILE, xx // TILE, e, c]
    product = reduce("winograd", [n, out_h, out_w, filters], [POSITIONS, channels], output)
    if not ctx.has_input(2):
        return [product]
    bias = ctx.input(2)
    return [compute("winograd_conv", product.shape,
                    lambda *i: product[i] + cast(bias[i[3]], float32), float32)]
