"""Winograd convolution F(m x m, 3x3) (Lavin and Gray): a 3x3, stride-1 convolution computed
per m x m output tile from an (m + 2) x (m + 2) input tile, with (m + 2)^2 multiplications
per tile and channel pair instead of 9 m^2: F(2x2, 3x3) saves 2.25x, F(4x4, 3x3) 4x at
larger transforms and rounding errors (about 1e-5 relative against 1e-6).

With d an input tile (one channel), g a 3x3 filter and Y the output tile:

    V = BT d BT^T,  U = G g G^T,  M = sum over channels of V * U (element-wise over the tile),
    Y = AT M AT^T

The filter transform U happens once, on constant weights (``transform_weights``); the
``WinogradConv`` operator takes the input in channels-last order and U, stored for the
register tiles of its template as [positions, K / PANEL, C, PANEL] (transform position,
panel of output channels, input channel, output channel in the panel). Its compute
definition below is the algorithm's arithmetic, written plainly (the coefficient tables as
selects); the CPU template ``schedule.templates.winograd_cpu`` is its schedule.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from treadle.graph.operator import OpContext, register
from treadle.graph.tensor import normalize_dim
from treadle.ir.compute import compute, reduce
from treadle.ir.dtypes import float32
from treadle.ir.expr import Const, Expr, as_expr, cast, eq, logical_and, minimum, select

PANEL = 16    # output channels per stored panel of U: the register tile's width


@dataclass(frozen=True)
class Transform:
    """F(tile x tile, 3x3): the input, filter and output transform matrices."""
    tile: int
    bt: np.ndarray
    g: np.ndarray
    at: np.ndarray

    @property
    def window(self) -> int:
        """Input positions per tile side."""
        return self.tile + 2

    @property
    def positions(self) -> int:
        return self.window * self.window


TRANSFORMS = {t.tile: t for t in (
    Transform(2, np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], float),
              np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], float),
              np.array([[1, 1, 1, 0], [0, 1, -1, -1]], float)),
    Transform(4, np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                           [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
                          float),
              np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                        [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], float),
              np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                        [0, 1, -1, 8, -8, 1]], float)),
)}


def transform_weights(weight: np.ndarray, tile: int) -> np.ndarray:
    """A [3, 3, C, K] channels-last filter as U for F(tile x tile, 3x3),
    [positions, K / PANEL, C, PANEL] float32."""
    kh, kw, channels, filters = weight.shape
    if (kh, kw) != (3, 3) or filters % PANEL:
        raise ValueError(f"Winograd convolution needs a 3x3 filter and a multiple of {PANEL} "
                         f"output channels, got {list(weight.shape)}")
    f = TRANSFORMS[tile]
    u = np.einsum("ai,ijck,bj->abck", f.g, weight.astype(np.float64), f.g)
    u = u.reshape(f.positions, channels, filters // PANEL, PANEL).transpose(0, 2, 1, 3)
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


@register("WinogradConv", internal=True)
def winograd_conv(ctx: OpContext):
    """Inputs: x [N, H, W, C] float32 (channels last, unpadded), U from
    ``transform_weights`` for the ``tile`` attribute (2 or 4), an optional bias [K].
    Output [N, H - 2, W - 2, K]."""
    x, u = ctx.input(0), ctx.input(1)
    tile = int(ctx.attr("tile", 2))
    if tile not in TRANSFORMS:
        raise ctx.error(f"tile {tile} is not one of {sorted(TRANSFORMS)}")
    f = TRANSFORMS[tile]
    if x.dtype != float32 or u.dtype != float32 or x.rank != 4 or u.rank != 4:
        raise ctx.error("needs a float32 N x H x W x C input and a float32 transformed filter")
    n, h, w, channels = (normalize_dim(d) for d in x.shape)
    dims = [normalize_dim(d) for d in u.shape]
    if dims[0] != f.positions or dims[2] != channels or dims[3] != PANEL:
        raise ctx.error(f"filter shape {dims} does not match {channels} input channels and "
                        f"tile {tile}")
    filters = dims[1] * PANEL
    out_h, out_w = normalize_dim(as_expr(h) - 2), normalize_dim(as_expr(w) - 2)
    tiles_h = normalize_dim((as_expr(out_h) + tile - 1) // tile)
    tiles_w = normalize_dim((as_expr(out_w) + tile - 1) // tile)

    def tile_input(b, ty, tx, e, c, i, j):
        row, col = ty * tile + i, tx * tile + j
        inside = logical_and(row < h, col < w)
        value = select(inside, x[b, minimum(row, as_expr(h) - 1), minimum(col, as_expr(w) - 1), c],
                       Const(0.0, float32))
        return table(f.bt, e // f.window, i) * table(f.bt, e % f.window, j) * value
    v = reduce("winograd_v", [n, tiles_h, tiles_w, f.positions, channels],
               [f.window, f.window], tile_input)

    def output(b, y, xx, k, e, c):
        weight = u[e, k // PANEL, c, k % PANEL]
        coefficient = (table(f.at, y % tile, e // f.window)
                       * table(f.at, xx % tile, e % f.window))
        return coefficient * weight * v[b, y // tile, xx // tile, e, c]
    product = reduce("winograd", [n, out_h, out_w, filters], [f.positions, channels], output)
    if not ctx.has_input(2):
        return [product]
    bias = ctx.input(2)
    return [compute("winograd_conv", product.shape,
                    lambda *i: product[i] + cast(bias[i[3]], float32), float32)]
