"""GridSample (opsets 16 and 20) over images [N, C, H, W] and volumes [N, C, D, H, W]:
output element (n, c, *point) reads X at the position grid[n, *point] = (x, y[, z]) (the
last spatial axis first), where -1 is an axis's first edge (with ``align_corners``, the
centre of its first element) and 1 its last one.

Each spatial axis contributes taps, (position, weight) pairs, and the output is the sum
over every combination of one tap per axis of the product of their weights times the
element there, as for Resize: linear mode weighs the two elements around the position
by their distances, nearest mode reads the closest (ties to even, as ONNX Runtime and
PyTorch round), cubic mode (images only) weighs four with Keys' kernel (a = -0.75).
Padding says what lies outside: zeros reads zero; border moves a position onto the
nearest edge, reflection mirrors it at the edges (then moves it onto them). Linear and
nearest modes move the sampled position itself, cubic mode each of its taps, as PyTorch
and ONNX Runtime do. The reads are loads at computed positions, clamped into the input
so no load leaves it, and a select zeroes those outside.
"""
from __future__ import annotations

from typing import Callable

from treadle.graph.operator import OpContext, register
from treadle.graph.ops.common import same_dtype
from treadle.graph.ops.transform import _dims, cubic_weights
from treadle.graph.tensor import Dim
from treadle.ir import dtypes
from treadle.ir.compute import compute
from treadle.ir.expr import (Buffer, Expr, as_expr, call, cast, eq, logical_and, maximum,
                             minimum, select)

MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest", "bicubic": "cubic",
         "cubic": "cubic"}
CUBIC_A = -0.75  # PyTorch's bicubic kernel, which ONNX's GridSample follows

Taps = Callable[[Expr], list[tuple[Expr, Expr]]]
# mode -> the taps around a position (in elements): whole float positions and weights.
TAPS: dict[str, Taps] = {
    "nearest": lambda p: [(call("round", p), as_expr(1.0, p.dtype))],
    "linear": lambda p: [(call("floor", p), 1.0 - (p - call("floor", p))),
                         (call("floor", p) + 1.0, p - call("floor", p))],
    "cubic": lambda p: [(call("floor", p) + float(k - 1), w) for k, w in
                        enumerate(cubic_weights(p - call("floor", p), CUBIC_A))],
}


def _border(p: Expr, size: Dim, corners: bool) -> Expr:
    return minimum(maximum(p, 0.0), cast(as_expr(size), p.dtype) - 1.0)


def _reflection(p: Expr, size: Dim, corners: bool) -> Expr:
    """p mirrored at the edges (the centres of the end elements with ``align_corners``,
    else their outer edges) until it lies between them, then moved onto the elements."""
    length = cast(as_expr(size), p.dtype)
    low, span = (0.0, length - 1.0) if corners else (-0.5, length)
    distance = call("abs", p - low)
    extra = call("fmod", distance, span)
    flips = call("floor", distance / span)
    even = eq(call("fmod", flips, as_expr(2.0, p.dtype)), 0.0)
    mirrored = select(even, extra + low, span - extra + low)
    # A single element with align_corners: both edges are its centre.
    mirrored = select(eq(span, 0.0), as_expr(0.0, p.dtype), mirrored)
    return _border(mirrored, size, corners)


PADDINGS: dict[str, Callable[[Expr, Dim, bool], Expr]] = {
    "zeros": lambda p, size, corners: p,
    "border": _border,
    "reflection": _reflection,
}


@register("GridSample")
def grid_sample(ctx: OpContext):
    x, shape = ctx.input(0), _dims(ctx, 0)
    grid, grid_shape = ctx.input(1), _dims(ctx, 1)
    same_dtype(ctx, x, grid)
    if not x.dtype.is_float:
        raise ctx.unsupported(f"{x.dtype} input")
    mode, padding = ctx.attr("mode", "bilinear"), ctx.attr("padding_mode", "zeros")
    if mode not in MODES or padding not in PADDINGS:
        raise ctx.unsupported(f"mode {mode!r} with padding {padding!r} (linear, nearest or "
                              "cubic, zeros, border or reflection padding are supported)")
    rank = len(shape) - 2
    if rank not in (2, 3) or len(grid_shape) != rank + 2 or grid_shape[-1] != rank:
        grid_text = ", ".join(map(str, grid_shape))
        raise ctx.unsupported(f"input of rank {len(shape)} and grid [{grid_text}] (images "
                              "[N, C, H, W] with grids [N, H_out, W_out, 2], or volumes "
                              "[N, C, D, H, W] with grids [N, D_out, H_out, W_out, 3])")
    if MODES[mode] == "cubic" and rank != 2:
        raise ctx.unsupported("cubic mode of a volume (ONNX defines it for images)")
    corners, sizes = bool(ctx.attr("align_corners", 0)), shape[2:]
    mode = MODES[mode]
    # Linear and nearest modes move the sampled position, cubic mode each of its taps.
    pad, keep = PADDINGS[padding], PADDINGS["zeros"]
    pad_position, pad_tap = (keep, pad) if mode == "cubic" else (pad, keep)

    def element(n, c, *point) -> Expr:
        terms: list[tuple[list[Expr], Expr | None]] = [([], None)]
        for d, size in enumerate(sizes):
            g = grid[(n, *point, as_expr(rank - 1 - d))]
            position = pad_position(_position(g, size, corners), size, corners)
            terms = [(index + [pad_tap(tap, size, corners)], w if weight is None else weight * w)
                     for index, weight in terms for tap, w in TAPS[mode](position)]
        total = None
        for index, weight in terms:
            term = weight * _element(x, n, c, index, sizes)
            total = term if total is None else total + term
        return total
    return [compute("y", [shape[0], shape[1], *grid_shape[1:-1]], element)]


def _position(g: Expr, size: Dim, corners: bool) -> Expr:
    """Grid coordinate ``g`` in [-1, 1] as a position in elements along an axis."""
    length = cast(as_expr(size), g.dtype)
    if corners:  # -1 and 1 are the centres of the first and last elements
        return (g + 1.0) * ((length - 1.0) * 0.5)
    return ((g + 1.0) * length - 1.0) * 0.5  # they are the outer edges of those elements


def _element(x: Buffer, n: Expr, c: Expr, index: list[Expr], sizes: list[Dim]) -> Expr:
    """X's element at whole float positions ``index``, zero outside the input."""
    inside = logical_and(*(cond for p, size in zip(index, sizes)
                           for cond in (p >= 0.0, p <= cast(as_expr(size), p.dtype) - 1.0)))
    clamped = [minimum(maximum(cast(p, dtypes.index_type), 0), as_expr(size) - 1)
               for p, size in zip(index, sizes)]
    return select(inside, x[(n, c, *clamped)], 0.0)
