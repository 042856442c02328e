"""GridSample (opsets 16 and 20) over images [N, C, H, W]: output pixel (n, c, i, j) reads
X at the point grid[n, i, j] = (x, y), where (-1, -1) is the image's top-left corner (with
``align_corners``, the centre of its top-left pixel) and (1, 1) its bottom-right one.

Linear mode weighs the four pixels around the point by their distances (1 - |p - pixel|
along each side), nearest mode reads the closest (ties to even, as ONNX Runtime and
PyTorch round). Zeros padding reads zero outside the image; border padding first moves
the point onto the nearest edge. One compute definition: the reads are loads at computed
positions, clamped into the image so no load leaves it, and a select zeroes those outside.
"""
from __future__ import annotations

from treadle.graph.operator import OpContext, register
from treadle.graph.ops.common import same_dtype
from treadle.graph.ops.transform import _dims
from treadle.ir import dtypes
from treadle.ir.compute import compute
from treadle.ir.expr import Expr, as_expr, call, cast, logical_and, maximum, minimum, select

MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest"}
PADDINGS = ("zeros", "border")


@register("GridSample")
def grid_sample(ctx: OpContext):
    x, shape = ctx.input(0), _dims(ctx, 0)
    grid, grid_shape = ctx.input(1), _dims(ctx, 1)
    same_dtype(ctx, x, grid)
    if not x.dtype.is_float:
        raise ctx.unsupported(f"{x.dtype} input")
    mode, padding = ctx.attr("mode", "bilinear"), ctx.attr("padding_mode", "zeros")
    if mode not in MODES or padding not in PADDINGS:
        raise ctx.unsupported(f"mode {mode!r} with padding {padding!r} (linear or nearest, "
                              f"zeros or border padding are supported)")
    if len(shape) != 4 or len(grid_shape) != 4 or grid_shape[3] != 2:
        grid_text = ", ".join(map(str, grid_shape))
        raise ctx.unsupported(f"input of rank {len(shape)} and grid [{grid_text}] (images "
                              f"[N, C, H, W] and grids [N, H_out, W_out, 2])")
    corners, border = bool(ctx.attr("align_corners", 0)), padding == "border"
    height, width = shape[2], shape[3]

    def element(n, c, i, j) -> Expr:
        px = _position(grid[n, i, j, 0], width, corners, border)
        py = _position(grid[n, i, j, 1], height, corners, border)
        if MODES[mode] == "nearest":
            return _pixel(x, n, c, call("round", py), call("round", px), height, width)
        x0, y0 = call("floor", px), call("floor", py)
        total = None
        for xa in (x0, x0 + 1.0):
            for ya in (y0, y0 + 1.0):
                weight = (1.0 - call("abs", px - xa)) * (1.0 - call("abs", py - ya))
                term = weight * _pixel(x, n, c, ya, xa, height, width)
                total = term if total is None else total + term
        return total
    out = [shape[0], shape[1], grid_shape[1], grid_shape[2]]
    return [compute("y", out, element)]


def _position(g: Expr, side, corners: bool, border: bool) -> Expr:
    """Grid coordinate ``g`` in [-1, 1] as a position in pixels along ``side``."""
    length = cast(as_expr(side), g.dtype)
    if corners:  # -1 and 1 are the centres of the first and last pixels
        p = (g + 1.0) * ((length - 1.0) * 0.5)
    else:  # they are the outer edges of those pixels
        p = ((g + 1.0) * length - 1.0) * 0.5
    return minimum(maximum(p, 0.0), length - 1.0) if border else p


def _pixel(x, n, c, row: Expr, column: Expr, height, width) -> Expr:
    """X's pixel at whole float positions ``row``, ``column``, zero outside the image."""
    inside = logical_and(row >= 0.0, row <= cast(as_expr(height), row.dtype) - 1.0,
                         column >= 0.0, column <= cast(as_expr(width), column.dtype) - 1.0)
    r, q = (minimum(maximum(cast(p, dtypes.index_type), 0), as_expr(side) - 1)
            for p, side in ((row, height), (column, width)))
    return select(inside, x[n, c, r, q], 0.0)
