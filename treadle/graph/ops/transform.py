"""Data-movement operators: reshapes, layout changes, joins and splits, slicing, indexing,
padding and resizing.

Nearly every output element is an input element read at an index computed from the
output index, or a choice between such reads, so these ops are injective (the ops whose
elements depend on others in order, CumSum and the scatters, are in ``scan`` and
``scatter``). The reshape-like ones (Reshape,
Flatten, Squeeze, Unsqueeze) are registered as views: the executor runs them as zero-copy
reinterpretations of contiguous memory, and their compute definitions serve shape
inference and compile-time values.

Sizes may be symbolic. Where ONNX wraps a negative position or clamps one against a
dimension, a concrete dimension is handled in Python and a symbolic one with select and
min/max expressions, simplified knowing that a symbol is a dimension, so non-negative.
Indices read from tensors at run time are wrapped when negative and clamped into range,
so a bad index can never read outside a buffer.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Sequence

import numpy as np

from treadle.errors import DTypeError
from treadle.graph.operator import OpContext, register
from treadle.graph.ops.common import (broadcast_load, broadcast_shape, normalize_axes,
                                      normalize_axis, same_dtype)
from treadle.graph.ops.reduce import accumulator
from treadle.graph.tensor import Dim, num_elements
from treadle.ir import dtypes
from treadle.ir.compute import compute, reduce
from treadle.ir.expr import (Binary, Const, Expr, as_expr, call, cast, eq, logical_and,
                             maximum, minimum, select)
from treadle.ir.functor import free_vars
from treadle.ir.mapping import ravel, unravel
from treadle.ir.simplify import Interval, simplify_expr

INT64_MAX = 2 ** 63 - 1
DIM_RANGE = Interval(0, INT64_MAX)


# ---- sizes that may be symbolic ---------------------------------------------------------
def simplify_dim(value) -> Dim:
    """An int, or an expression simplified knowing every symbol is a dimension (>= 0)."""
    if isinstance(value, (int, np.integer)):
        return int(value)
    expr = as_expr(value)
    expr = simplify_expr(expr, {v: DIM_RANGE for v in free_vars(expr)})
    return expr.value if isinstance(expr, Const) else expr


def _min(a: Dim, b: Dim) -> Dim:
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else simplify_dim(minimum(a, b))


def _max(a: Dim, b: Dim) -> Dim:
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else simplify_dim(maximum(a, b))


def _clamp(value: Dim, low: Dim, high: Dim) -> Dim:
    """numpy.clip's order, which gives ``high`` when low > high (an empty dimension)."""
    return _min(_max(value, low), high)


def _wrap(value: Dim, dim: Dim) -> Dim:
    """ONNX's negative positions count from the end."""
    if isinstance(value, int):
        return simplify_dim(value + dim) if value < 0 else value
    return simplify_dim(select(value < 0, value + dim, value))


def _factors(d: Dim) -> tuple[int, Counter]:
    """d as an integer coefficient times a multiset of symbolic factors."""
    if isinstance(d, int):
        return d, Counter()
    if isinstance(d, Const):
        return d.value, Counter()
    if isinstance(d, Binary) and d.op == "*":
        (ka, fa), (kb, fb) = _factors(d.a), _factors(d.b)
        return ka * kb, fa + fb
    return 1, Counter({d: 1})


def _require_equal(ctx: OpContext, a: Dim, b: Dim, what: str) -> None:
    """A shape error when two concrete sizes differ; a run-time check when either is
    symbolic and they are not the same product of factors."""
    a, b = simplify_dim(a), simplify_dim(b)
    if isinstance(a, int) and isinstance(b, int):
        if a != b:
            raise ctx.error(f"{what}: {a} vs {b}")
    elif _factors(a) != _factors(b):
        ctx.require(eq(a, b), f"{what}: {a} vs {b}")


def _divide(ctx: OpContext, total: Dim, part: Dim, what: str) -> Dim:
    """total / part, exact: common symbolic factors cancel (batch*seq*768 / (batch*seq) is
    768); otherwise the quotient is an expression and the remainder is checked at run time."""
    if isinstance(total, int) and isinstance(part, int):
        if part == 0 or total % part:
            raise ctx.error(f"{what}: {total} elements do not divide by {part}")
        return total // part
    (kt, ft), (kp, fp) = _factors(total), _factors(part)
    if kp and kt % kp == 0 and not fp - ft:
        quotient: Expr = as_expr(kt // kp)
        for factor in (ft - fp).elements():
            quotient = quotient * factor
        return simplify_dim(quotient)
    ctx.require(eq(as_expr(total) % part, 0), f"{what}: {total} must divide by {part}")
    return simplify_dim(as_expr(total) // part)


def _dims(ctx: OpContext, i: int) -> list[Dim]:
    ctx.input(i)
    return list(ctx.tensors[i].shape)


def known_ints(ctx: OpContext, i: int, what: str) -> list[int]:
    """The contents of input i, which must be known and concrete when compiling."""
    values = ctx.known(i, what)
    if not all(isinstance(v, int) for v in values):
        raise ctx.unsupported(f"{what} must be concrete, got {[str(v) for v in values]}")
    return values


def known_scalar(ctx: OpContext, i: int, what: str) -> Dim:
    values = ctx.known(i, what)
    if len(values) != 1:
        raise ctx.error(f"{what} must be a single value, got {len(values)}")
    return values[0]


def _axes(ctx: OpContext, i: int, rank: int) -> Optional[list[int]]:
    """Axes from input i (opset 13 on) or the older ``axes`` attribute; None if neither."""
    if ctx.has_input(i):
        return normalize_axes(ctx, known_ints(ctx, i, "axes"), rank)
    if ctx.attr("axes") is not None:
        return normalize_axes(ctx, ctx.attr("axes"), rank)
    return None


def _index(value: Expr, dim) -> Expr:
    """A position read at run time as an index: negative counts from the end, and it is
    clamped into [0, dim) so that no bad value can read outside the buffer."""
    value = cast(value, dtypes.index_type)
    value = select(value < 0, value + dim, value)
    return minimum(maximum(value, 0), as_expr(dim) - 1)


# ---- views: contiguous reinterpretations ----------------------------------------------
def _reinterpret(x, shape: Sequence[Dim]):
    """x's elements in row-major order, read as a tensor of ``shape``."""
    def element(*i):
        if not x.shape:
            return x[()]
        return x[unravel(ravel(i, shape), x.shape)]
    return compute("y", shape, element)


@register("Reshape", view=True)
def reshape(ctx: OpContext):
    x, in_shape = ctx.input(0), _dims(ctx, 0)
    target = ctx.known(1, "the target shape")
    dims = []
    for k, d in enumerate(target):
        if isinstance(d, int) and d == 0 and not ctx.attr("allowzero", 0):
            if k >= len(in_shape):
                raise ctx.error(f"target {target} copies dimension {k} of a rank-"
                                f"{len(in_shape)} input")
            d = in_shape[k]
        elif isinstance(d, int) and d < -1:
            raise ctx.error(f"invalid target dimension {d}")
        dims.append(d)
    unknown = [k for k, d in enumerate(dims) if isinstance(d, int) and d == -1]
    if len(unknown) > 1:
        raise ctx.error(f"target {target} has more than one -1")
    total = num_elements(in_shape)
    if unknown:
        rest = num_elements([d for k, d in enumerate(dims) if k != unknown[0]])
        dims[unknown[0]] = _divide(ctx, total, rest,
                                   f"reshape of {_fmt(in_shape)} to {_fmt(target)}")
    else:
        _require_equal(ctx, total, num_elements(dims),
                       f"reshape of {_fmt(in_shape)} to {_fmt(target)} changes the element count")
    return [_reinterpret(x, dims)]


@register("Flatten", view=True)
def flatten(ctx: OpContext):
    x, shape = ctx.input(0), _dims(ctx, 0)
    axis = ctx.attr("axis", 1)
    if not -len(shape) <= axis <= len(shape):
        raise ctx.error(f"axis {axis} is out of range for rank {len(shape)}")
    axis += len(shape) if axis < 0 else 0
    return [_reinterpret(x, (num_elements(shape[:axis]), num_elements(shape[axis:])))]


@register("Squeeze", view=True)
def squeeze(ctx: OpContext):
    x, shape = ctx.input(0), _dims(ctx, 0)
    axes = _axes(ctx, 1, len(shape))
    if axes is None:
        symbolic = [str(d) for d in shape if not isinstance(d, int)]
        if symbolic:
            raise ctx.unsupported(f"Squeeze without axes of symbolic dimensions {symbolic}: "
                                  "whether they are 1 is known only at run time")
        axes = [k for k, d in enumerate(shape) if d == 1]
    for a in axes:
        _require_equal(ctx, shape[a], 1, f"squeezed dimension {a} is not 1")

    def element(*i):
        it = iter(i)
        return x[tuple(as_expr(0) if k in axes else next(it) for k in range(len(shape)))]
    return [compute("y", [d for k, d in enumerate(shape) if k not in axes], element)]


@register("Unsqueeze", view=True)
def unsqueeze(ctx: OpContext):
    x, shape = ctx.input(0), _dims(ctx, 0)
    given = known_ints(ctx, 1, "axes") if ctx.has_input(1) else ctx.attr("axes")
    if given is None:
        raise ctx.error("axes are required")
    rank = len(shape) + len(given)
    axes = normalize_axes(ctx, given, rank)
    it = iter(shape)
    out = [1 if k in axes else next(it) for k in range(rank)]
    return [compute("y", out, lambda *i: x[tuple(v for k, v in enumerate(i) if k not in axes)])]


# ---- layout -----------------------------------------------------------------------------
def transpose_perm(attrs: dict, rank: int) -> list[int]:
    """A Transpose's permutation: its ``perm``, or by default the axes reversed."""
    return list(attrs.get("perm") or reversed(range(rank)))


@register("Transpose")
def transpose(ctx: OpContext):
    x, shape = ctx.input(0), _dims(ctx, 0)
    perm = transpose_perm(ctx.attrs, len(shape))
    if sorted(perm) != list(range(len(shape))):
        raise ctx.error(f"perm {perm} is not a permutation of the {len(shape)} axes")

    def element(*i):
        index = [None] * len(perm)
        for k, p in enumerate(perm):
            index[p] = i[k]
        return x[tuple(index)]
    return [compute("y", [shape[p] for p in perm], element)]


def _image(ctx: OpContext) -> tuple:
    x, shape = ctx.input(0), _dims(ctx, 0)
    if len(shape) != 4:
        raise ctx.error(f"needs a 4-D NCHW input, got rank {len(shape)}")
    b = ctx.required_attr("blocksize")
    if b < 1:
        raise ctx.error(f"blocksize {b} must be positive")
    return x, shape, b


@register("DepthToSpace")
def depth_to_space(ctx: OpContext):
    x, (n, c, h, w), b = _image(ctx)
    mode = ctx.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise ctx.error(f"unknown mode {mode!r}")
    channels = _divide(ctx, c, b * b, "channels by blocksize squared")

    def element(i, k, y, z):
        block = (y % b) * b + z % b
        depth = block * channels + k if mode == "DCR" else k * (b * b) + block
        return x[i, depth, y // b, z // b]
    out = [n, channels, simplify_dim(as_expr(h) * b), simplify_dim(as_expr(w) * b)]
    return [compute("y", out, element)]


@register("SpaceToDepth")
def space_to_depth(ctx: OpContext):
    x, (n, c, h, w), b = _image(ctx)
    height = _divide(ctx, h, b, "height by blocksize")
    width = _divide(ctx, w, b, "width by blocksize")
    mode = ctx.attr("mode", "DCR")  # an attribute from opset 28; DepthToSpace's inverse
    if mode not in ("DCR", "CRD"):
        raise ctx.error(f"unknown mode {mode!r}")

    def element(i, k, y, z):
        block, channel = (k // c, k % c) if mode == "DCR" else (k % (b * b), k // (b * b))
        return x[i, channel, y * b + block // b, z * b + block % b]
    return [compute("y", [n, simplify_dim(as_expr(c) * (b * b)), height, width], element)]


# ---- joins, splits, slices --------------------------------------------------------------
@register("Concat")
def concat(ctx: OpContext):
    ids = [k for k in range(ctx.num_inputs) if ctx.has_input(k)]
    xs = [ctx.input(k) for k in ids]
    same_dtype(ctx, *xs)
    shapes = [_dims(ctx, k) for k in ids]
    rank = len(shapes[0])
    axis = normalize_axis(ctx, ctx.required_attr("axis"), rank)
    offsets: list[Dim] = [0]
    for k, s in zip(ids, shapes):
        if len(s) != rank:
            raise ctx.error(f"input {k} has rank {len(s)}, input {ids[0]} has rank {rank}")
        for a in range(rank):
            if a != axis:
                _require_equal(ctx, s[a], shapes[0][a],
                               f"dimension {a} of input {k} differs from input {ids[0]}'s")
        offsets.append(simplify_dim(as_expr(offsets[-1]) + s[axis]))

    def element(*i):
        def parts(first: int, last: int):
            """Inputs first..last by halves: a chain of selects, one per input, cost
            every element of the last input as many comparisons as there are inputs
            (an unrolled recurrence concatenating 256 steps)."""
            if first == last:
                return xs[first][(*i[:axis], i[axis] - offsets[first], *i[axis + 1:])]
            middle = (first + last) // 2
            return select(i[axis] < offsets[middle + 1], parts(first, middle),
                          parts(middle + 1, last))
        return parts(0, len(xs) - 1)
    shape = list(shapes[0])
    shape[axis] = offsets[-1]
    return [compute("y", shape, element)]


@register("Split")
def split(ctx: OpContext):
    x, shape = ctx.input(0), _dims(ctx, 0)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(shape))
    dim = shape[axis]
    if ctx.has_input(1) or ctx.attr("split") is not None:
        sizes = ctx.known(1, "split sizes") if ctx.has_input(1) else list(ctx.attr("split"))
        _require_equal(ctx, _sum(sizes), dim, "the split sizes' sum differs from the dimension")
    else:
        count = ctx.attr("num_outputs", ctx.num_outputs)
        if count < 1:
            raise ctx.error(f"num_outputs {count} must be positive")
        chunk = simplify_dim((as_expr(dim) + (count - 1)) // count)
        sizes = [chunk] * (count - 1) + [simplify_dim(as_expr(dim) - as_expr(chunk) * (count - 1))]
        if isinstance(sizes[-1], int) and sizes[-1] < 0:
            raise ctx.error(f"dimension {dim} cannot be split into {count} outputs")
    outputs, offset = [], 0
    for size in sizes:
        outputs.append(_window(x, shape, axis, offset, size))
        offset = simplify_dim(as_expr(offset) + size)
    return outputs


def _sum(values: Sequence[Dim]) -> Dim:
    total: Dim = 0
    for v in values:
        total = simplify_dim(as_expr(total) + v)
    return total


def _window(x, shape, axis: int, offset: Dim, size: Dim):
    out = list(shape)
    out[axis] = size
    return compute("y", out, lambda *i: x[(*i[:axis], i[axis] + offset, *i[axis + 1:])])


@register("Slice")
def slice_op(ctx: OpContext):
    x, shape = ctx.input(0), _dims(ctx, 0)
    starts, ends = ctx.known(1, "starts"), ctx.known(2, "ends")
    axes = (normalize_axes(ctx, known_ints(ctx, 3, "axes"), len(shape)) if ctx.has_input(3)
            else list(range(len(starts))))
    steps = known_ints(ctx, 4, "steps") if ctx.has_input(4) else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.error(f"starts, ends, axes and steps have lengths {len(starts)}, "
                        f"{len(ends)}, {len(axes)} and {len(steps)}")
    begin: list[Dim] = [0] * len(shape)
    stride = [1] * len(shape)
    out = list(shape)
    for a, start, end, step in zip(axes, starts, ends, steps):
        if step == 0:
            raise ctx.error(f"step of axis {a} is 0")
        d = shape[a]
        start, end = _wrap(start, d), _wrap(end, d)
        if step > 0:
            start, end = _clamp(start, 0, d), _clamp(end, 0, d)
            count = (as_expr(end) - start + (step - 1)) // step
        else:
            last = simplify_dim(as_expr(d) - 1)
            start, end = _clamp(start, 0, last), _clamp(end, -1, last)
            count = (as_expr(start) - end + (-step - 1)) // -step
        begin[a], stride[a] = start, step
        # C's division rounds toward zero, so an empty range gives 0 or less: clamp at 0.
        out[a] = _max(simplify_dim(count), 0)

    def element(*i):
        return x[tuple(as_expr(b) + v * s for b, v, s in zip(begin, i, stride))]
    return [compute("y", out, element)]


@register("Tile")
def tile(ctx: OpContext):
    x, shape = ctx.input(0), _dims(ctx, 0)
    repeats = ctx.known(1, "repeats")
    if len(repeats) != len(shape):
        raise ctx.error(f"{len(repeats)} repeats for a rank-{len(shape)} input")
    out = [simplify_dim(as_expr(d) * r) for d, r in zip(shape, repeats)]
    return [compute("y", out, lambda *i: x[tuple(
        as_expr(0) if d == 1 else v % d for v, d in zip(i, shape))])]


@register("Expand")
def expand(ctx: OpContext):
    x = ctx.input(0)
    shape = broadcast_shape(ctx, x.shape, ctx.known(1, "the target shape"))
    return [compute("y", shape, lambda *i: broadcast_load(x, i, shape))]


# Pad: mode -> the input position read for an output position j (relative to the input,
# possibly outside it) along a dimension d. A negative pad crops the input first, and the
# mode then pads what is left, as ONNX Runtime does: d and j are those of the cropped input.
PAD_MODES = {
    "edge": lambda j, d: minimum(maximum(j, 0), as_expr(d) - 1),
    "reflect": lambda j, d: select(j < 0, -j, select(j >= d, (as_expr(d) - 1) * 2 - j, j)),
    "wrap": lambda j, d: (j % d + d) % d,
}


@register("Pad")
def pad(ctx: OpContext):
    x, shape = ctx.input(0), _dims(ctx, 0)
    mode = ctx.attr("mode", "constant")
    if mode != "constant" and mode not in PAD_MODES:
        raise ctx.unsupported(f"mode {mode!r}")
    pads = known_ints(ctx, 1, "pads")
    axes = _axes(ctx, 3, len(shape))
    axes = list(range(len(shape))) if axes is None else axes
    if len(pads) != 2 * len(axes):
        raise ctx.error(f"{len(pads)} pads for {len(axes)} axes")
    before, after = [0] * len(shape), [0] * len(shape)
    for k, a in enumerate(axes):
        before[a], after[a] = pads[k], pads[k + len(axes)]
    out = [simplify_dim(as_expr(d) + b + e) for d, b, e in zip(shape, before, after)]
    if any(isinstance(d, int) and d < 0 for d in out):
        raise ctx.error(f"pads {pads} crop {_fmt(shape)} below zero")
    cropped = [max(-b, 0) for b in before]
    kept = [simplify_dim(as_expr(d) - c - max(-e, 0)) for d, c, e in zip(shape, cropped, after)]
    grown = [max(b, 0) for b in before]
    padded = [a for a in range(len(shape)) if before[a] > 0 or after[a] > 0]
    _check_pad_extents(ctx, mode, padded, kept, grown, after)

    def element(*i):
        source = [v - b for v, b in zip(i, before)]
        j = [v - g for v, g in zip(i, grown)]  # in the cropped input
        if mode != "constant":
            return x[tuple(PAD_MODES[mode](j[a], kept[a]) + cropped[a] if a in padded
                           else source[a] for a in range(len(shape)))]
        inside = [c for a in padded for c in (j[a] >= 0, j[a] < kept[a])]
        if not inside:
            return x[tuple(source)]
        return select(logical_and(*inside), x[tuple(source)], _pad_value(ctx, x.dtype))
    return [compute("y", out, element)]


def _check_pad_extents(ctx: OpContext, mode: str, padded: list[int], kept: list[Dim],
                       grown: list[int], after: list[int]) -> None:
    """Reflection needs more elements left after cropping than it pads on either side;
    edge and wrap need one."""
    for a in padded:
        if mode == "reflect":
            _require_at_most(ctx, max(grown[a], after[a]), simplify_dim(as_expr(kept[a]) - 1),
                             f"reflect padding of dimension {a}")
        elif mode != "constant":
            _require_at_most(ctx, 1, kept[a], f"{mode} padding of dimension {a}")


def _pad_value(ctx: OpContext, dtype) -> Expr:
    """The fill, a constant where the input is one (so that a kernel storing the padded
    tensor fills its border itself, see graph.partition.padding_of)."""
    if not ctx.has_input(2):
        return Const(0, dtype)
    known = ctx.data(2)
    if known is not None and known.size == 1 and dtype != dtypes.bfloat16:  # held as bits
        return Const(known.reshape(()).astype(dtype.numpy).item(), dtype)
    value = ctx.input(2)
    return cast(value[(0,) * value.rank], dtype)


def _require_at_most(ctx: OpContext, a: Dim, b: Dim, what: str) -> None:
    if isinstance(a, int) and isinstance(b, int):
        if a > b:
            raise ctx.error(f"{what}: {a} exceeds {b}")
    else:
        ctx.require(as_expr(a) <= b, f"{what}: {a} must not exceed {b}")


# ---- indexing ---------------------------------------------------------------------------
def _integer_input(ctx: OpContext, i: int, what: str):
    buffer = ctx.input(i)
    if not buffer.dtype.is_integer:
        raise DTypeError(f"{ctx.where}: {what} must be integers, got {buffer.dtype}")
    return buffer


@register("Gather")
def gather(ctx: OpContext):
    data, shape = ctx.input(0), _dims(ctx, 0)
    indices = _integer_input(ctx, 1, "indices")
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(shape))
    q = indices.rank

    def element(*i):
        k = _index(indices[i[axis:axis + q]], shape[axis])
        return data[(*i[:axis], k, *i[axis + q:])]
    out = shape[:axis] + _dims(ctx, 1) + shape[axis + 1:]
    return [compute("y", out, element)]


@register("GatherElements")
def gather_elements(ctx: OpContext):
    data, shape = ctx.input(0), _dims(ctx, 0)
    indices, index_shape = _integer_input(ctx, 1, "indices"), _dims(ctx, 1)
    if len(index_shape) != len(shape):
        raise ctx.error(f"indices have rank {len(index_shape)}, data rank {len(shape)}")
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(shape))
    for a in range(len(shape)):
        if a != axis:
            _require_at_most(ctx, index_shape[a], shape[a], f"indices' dimension {a}")

    def element(*i):
        return data[(*i[:axis], _index(indices[i], shape[axis]), *i[axis + 1:])]
    return [compute("y", index_shape, element)]


@register("GatherND")
def gather_nd(ctx: OpContext):
    """Slices of ``data`` at the index tuples in the last dimension of ``indices``, after
    ``batch_dims`` leading dimensions the two share (torch's dynamo exporter writes it for
    advanced indexing, such as position ids)."""
    data, shape = ctx.input(0), _dims(ctx, 0)
    indices, index_shape = _integer_input(ctx, 1, "indices"), _dims(ctx, 1)
    batch = int(ctx.attr("batch_dims", 0))
    if not index_shape or not isinstance(index_shape[-1], int):
        raise ctx.unsupported("the last dimension of indices must be known when compiling")
    depth, q = index_shape[-1], len(index_shape)
    if not 0 <= batch < min(q, len(shape) + 1) or batch + depth > len(shape):
        raise ctx.error(f"indices of shape {[str(d) for d in index_shape]} with batch_dims "
                        f"{batch} do not index data of rank {len(shape)}")
    for a in range(batch):
        _require_at_most(ctx, index_shape[a], shape[a], f"indices' batch dimension {a}")
        _require_at_most(ctx, shape[a], index_shape[a], f"data's batch dimension {a}")

    def element(*i):
        tuple_at = i[:q - 1]
        position = [_index(indices[(*tuple_at, as_expr(j))], shape[batch + j])
                    for j in range(depth)]
        return data[(*i[:batch], *position, *i[q - 1:])]
    out = [*index_shape[:q - 1], *shape[batch + depth:]]
    return [compute("y", out, element)]


@register("CheckIndices", internal=True)
def check_indices(ctx: OpContext):
    """Input 0 (indices) unchanged, once each element is known to lie in [-size, size) for
    the axis of ``data`` (input 1, read for its shape) that it indexes: ``axes[0]`` for
    every element, or with ``tuples`` set, ``axes[j]`` for position j of the last axis (the
    index tuples of GatherND). The gathers clamp every index they read, which keeps memory
    safe; this makes an index out of range an error naming ``node``, as in ONNX Runtime.
    Its kernel is ``schedule.templates.index_check``."""
    indices, shape = _integer_input(ctx, 0, "indices"), _dims(ctx, 0)
    ctx.input(1)
    return [compute("y", shape, lambda *i: indices[i])]


def index_bounds(indices: Sequence[Dim], data: Sequence[Dim], attrs: dict) -> list[Dim]:
    """The size of the data axis each position of CheckIndices' last axis indexes (one
    size for all when ``tuples`` is unset)."""
    if not attrs.get("tuples"):
        return [data[attrs["axes"][0]]]
    return [data[a] for a in attrs["axes"]]


def out_of_range(attrs: dict, value, j: int, size: Dim) -> str:
    """The error for CheckIndices' index ``value`` at tuple position ``j``."""
    return (f"node {attrs['node']!r} ({attrs['op']}): index {value} is out of range for axis "
            f"{attrs['axes'][j]} of its data, of size {size}")


@register("OneHot")
def one_hot(ctx: OpContext):
    indices, shape = ctx.input(0), _dims(ctx, 0)
    if ctx.tensors[1].dtype.is_integer:
        depth = known_scalar(ctx, 1, "depth")
    elif ctx.data(1) is not None and ctx.data(1).size == 1:
        depth = int(ctx.data(1).reshape(-1)[0])
    else:
        raise ctx.needs_value(1, "depth")
    values = ctx.input(2)
    if tuple(_dims(ctx, 2)) != (2,):
        raise ctx.error(f"values must hold [off, on], got shape {_fmt(_dims(ctx, 2))}")
    axis = normalize_axis(ctx, ctx.attr("axis", -1), len(shape) + 1)

    def element(*i):
        # ONNX casts indices of any type to int64 (a float index truncates toward zero).
        k = cast(indices[i[:axis] + i[axis + 1:]], dtypes.index_type)
        k = select(k < 0, k + depth, k)
        return select(eq(k, i[axis]), values[1], values[0])
    return [compute("y", shape[:axis] + [depth] + shape[axis:], element)]


@register("ReverseSequence")
def reverse_sequence(ctx: OpContext):
    """Each batch entry's first ``sequence_lens[b]`` steps along the time axis reversed,
    the rest copied."""
    x, shape = ctx.input(0), _dims(ctx, 0)
    if len(shape) < 2:
        raise ctx.error(f"needs rank 2 or more, got {len(shape)}")
    lengths = _integer_input(ctx, 1, "sequence_lens")
    batch = normalize_axis(ctx, ctx.attr("batch_axis", 1), len(shape))
    time = normalize_axis(ctx, ctx.attr("time_axis", 0), len(shape))
    if {batch, time} != {0, 1}:
        raise ctx.error(f"batch_axis {batch} and time_axis {time} must be 0 and 1")
    if _dims(ctx, 1) != [shape[batch]]:
        raise ctx.error(f"sequence_lens has shape {_fmt(_dims(ctx, 1))}, expected "
                        f"[{shape[batch]}]")

    def element(*i):
        # A length past the axis reverses all of it, as ONNX Runtime's check would refuse.
        n = minimum(cast(lengths[(i[batch],)], dtypes.index_type), as_expr(shape[time]))
        t = i[time]
        source = select(t < n, n - 1 - t, t)
        return x[tuple(source if a == time else v for a, v in enumerate(i))]
    return [compute("y", shape, element)]


@register("Trilu")
def trilu(ctx: OpContext):
    x, shape = ctx.input(0), _dims(ctx, 0)
    if len(shape) < 2:
        raise ctx.error(f"needs rank 2 or more, got {len(shape)}")
    k = known_scalar(ctx, 1, "k") if ctx.has_input(1) else 0
    upper = ctx.attr("upper", 1)

    def element(*i):
        diagonal = i[-1] - i[-2]
        keep = diagonal >= k if upper else diagonal <= k
        return select(keep, x[i], Const(0, x.dtype))
    return [compute("y", shape, element)]


# ---- Resize -----------------------------------------------------------------------------
# Position in the input of output position x along an axis (ONNX's coordinate
# transformation modes), in float32 as ONNX Runtime computes it: scale is out/in as given
# or implied by the sizes, n_in and n_out the lengths.
COORDINATES = {
    "half_pixel": lambda x, scale, n_in, n_out: (x + 0.5) / scale - 0.5,
    # half_pixel, shifted so that the output (floor(n_in * scale) long, not n_in * scale)
    # stays centred on the input.
    "half_pixel_symmetric": lambda x, scale, n_in, n_out: (
        n_in * 0.5 * (1.0 - n_out / (scale * n_in)) + (x + 0.5) / scale - 0.5),
    "pytorch_half_pixel": lambda x, scale, n_in, n_out: select(
        n_out > 1.0, (x + 0.5) / scale - 0.5, Const(0.0, dtypes.float32)),
    "asymmetric": lambda x, scale, n_in, n_out: x / scale,
    "align_corners": lambda x, scale, n_in, n_out: select(
        eq(n_out, 1.0), Const(0.0, dtypes.float32), x * (n_in - 1.0) / (n_out - 1.0)),
}

# The mode that resizes a crop of the input (a region of interest, input 1) and reads
# ``extrapolation_value`` outside the input: ``_source_position`` computes its positions.
CROP = "tf_crop_and_resize"

# Nearest mode: rounding of a float32 position to an index.
NEAREST = {
    "round_prefer_floor": lambda x: call("ceil", x - 0.5),
    "round_prefer_ceil": lambda x: call("floor", x + 0.5),
    "floor": lambda x: call("floor", x),
    "ceil": lambda x: call("ceil", x),
}

# Antialiasing (opset 18) on an axis scaled down by s < 1: each output position blends
# the input under the interpolation kernel stretched by 1/s, its weights normalised to
# sum to 1, as ONNX Runtime (after Pillow) computes it. Scaled up, the kernel is as
# without antialiasing. The kernel's radius at scale 1, in input elements:
KERNEL_RADIUS = {"linear": 1.0, "cubic": 2.0}


@dataclass(frozen=True)
class Stretched:
    """An axis resampled with the stretched kernel: ``taps`` input positions per output
    position p, from floor(p - support) + 1 on, weighted by the kernel at (j - p) * shrink.
    ``shrink`` is min(scale, 1) and ``support`` the kernel's radius over it (float32
    expressions); ``taps`` is an int, or an expression where the scale is known only at
    run time."""
    taps: Dim
    shrink: Expr
    support: Expr


@register("Resize")
def resize(ctx: OpContext):
    x, shape = ctx.input(0), _dims(ctx, 0)
    mode = _resize_mode(ctx, x.dtype)
    out, scales = _resize_sizes(ctx, shape)
    roi = _crop(ctx, len(shape))
    # An axis that keeps its length at scale 1 (and is not cropped) maps each position
    # to itself.
    moved = [a for a in range(len(shape))
             if not (out[a] == shape[a] and scales[a] in (1, None) and roi[a] == (0.0, 1.0))]
    source = _source_position(ctx, shape, out, scales, roi)
    stretched = {a: s for a in moved if (s := _stretched(ctx, mode, shape[a], out[a], scales[a]))}
    if stretched:
        element = _antialiased(ctx, x, mode, shape, out, moved, stretched, source)
    else:
        element = _resample(ctx, x, mode, shape, moved, source)
    if ctx.attr("coordinate_transformation_mode") != CROP:
        return [compute("y", out, element)]
    fill = cast(Const(float(ctx.attr("extrapolation_value", 0.0)), dtypes.float32), x.dtype)

    def extrapolated(*i):
        # A position outside the input along some axis gives extrapolation_value.
        inside = []
        for a in moved:
            p = source(a, i[a])
            inside += [p >= 0.0, p <= cast(as_expr(shape[a]) - 1, dtypes.float32)]
        return select(logical_and(*inside), element(*i), fill) if inside else element(*i)
    return [compute("y", out, extrapolated)]


def _resample(ctx: OpContext, x, mode: str, shape: list[Dim], moved: list[int], source):
    """The function from an output index to its value: the input element nearest the
    source position, or a blend of those around it."""
    if mode == "nearest":
        rounding = NEAREST[ctx.attr("nearest_mode", "round_prefer_floor")]

        def nearest_element(*i):
            index = list(i)
            for a in moved:
                k = cast(rounding(source(a, i[a])), dtypes.index_type)
                index[a] = minimum(maximum(k, 0), as_expr(shape[a]) - 1)
            return x[tuple(index)]
        return nearest_element
    taps = _linear_taps if mode == "linear" else _cubic_taps(ctx)

    def blend(*i):
        return _blend(x, i, {a: taps(source(a, i[a]), shape[a]) for a in moved}, x.dtype)
    return blend


def _blend(x, i: Sequence[Expr], taps: dict[int, list[tuple[Expr, Expr]]],
           dtype: dtypes.DataType) -> Expr:
    """The sum, in ``dtype``, of x at every combination of one tap per axis (an index
    along it and its weight) times the product of the taps' weights; other axes read i."""
    terms = [(list(i), None)]
    for a, pairs in taps.items():
        terms = [(index[:a] + [k] + index[a + 1:], _times(weight, cast(w, dtype)))
                 for index, weight in terms for k, w in pairs]
    return _pairwise_sum([_times(weight, cast(x[tuple(index)], dtype))
                          for index, weight in terms])


def _antialiased(ctx: OpContext, x, mode: str, shape: list[Dim], out: list[Dim],
                 moved: list[int], stretched: dict[int, Stretched], source):
    """The function from an output index to its value where some axes use the stretched
    kernel: a sum over the taps of the stretched axes (each term blending the plain taps
    of the other moved axes), divided by the product of the stretched axes' weight totals,
    one small table per axis."""
    work = accumulator(x.dtype)
    plain = _linear_taps if mode == "linear" else _cubic_taps(ctx)
    window = _stretched_taps(ctx, mode, shape, stretched, source)
    axes = list(stretched)
    totals = {a: reduce(f"weights{a}", [out[a]], [stretched[a].taps],
                        lambda v, r, a=a: window(a, v, r)[1]) for a in axes}

    def element(*ir):
        i, r = ir[:len(out)], ir[len(out):]
        taps = {a: plain(source(a, i[a]), shape[a]) for a in moved if a not in stretched}
        taps.update({a: [window(a, i[a], r[k])] for k, a in enumerate(axes)})
        return _blend(x, i, taps, work)
    total = reduce("resize_sum", out, [stretched[a].taps for a in axes], element)

    def normalised(*i):
        divisor = totals[axes[0]][(i[axes[0]],)]
        for a in axes[1:]:
            divisor = divisor * totals[a][(i[a],)]
        return cast(total[i] / cast(divisor, work), x.dtype)
    return normalised


def _stretched_taps(ctx: OpContext, mode: str, shape: list[Dim],
                    stretched: dict[int, Stretched], source):
    """(axis, output position, tap) -> the tap's input index, clamped into the input
    (the edge element stands for those outside), and its weight before normalising; with
    ``exclude_outside`` a tap outside the input weighs 0."""
    kernel = _kernel(ctx, mode)
    exclude = bool(ctx.attr("exclude_outside", 0))

    def tap(a: int, v: Expr, r: Expr) -> tuple[Expr, Expr]:
        axis, pos = stretched[a], source(a, v)
        j = cast(call("floor", pos - axis.support), dtypes.index_type) + 1 + r
        weight = kernel((cast(j, dtypes.float32) - pos) * axis.shrink)
        if exclude:
            weight = select(logical_and(j >= 0, j < shape[a]), weight,
                            Const(0.0, dtypes.float32))
        return minimum(maximum(j, 0), as_expr(shape[a]) - 1), weight
    return tap


def _kernel(ctx: OpContext, mode: str):
    """The interpolation kernel at a float32 distance in input elements: the triangle, or
    Keys' cubic with ``cubic_coeff_a``; 0 from its radius on."""
    zero = Const(0.0, dtypes.float32)
    if mode == "linear":
        return lambda d: maximum(1.0 - call("abs", d), zero)
    a = float(ctx.attr("cubic_coeff_a", -0.75))

    def cubic(d: Expr) -> Expr:
        d = call("abs", d)
        return select(d < 1.0, _keys_near(d, a), select(d < 2.0, _keys_far(d, a), zero))
    return cubic


def _stretched(ctx: OpContext, mode: str, n_in: Dim, n_out: Dim,
               scale: Optional[float]) -> Optional[Stretched]:
    """How an axis resized from n_in to n_out (by ``scale`` where given, else by
    n_out / n_in) is antialiased; None where it is not: no antialiasing, or the axis does
    not shrink. In float32 as ONNX Runtime computes the stretch 1/s and the support."""
    if not ctx.attr("antialias", 0):
        return None
    radius, f32 = KERNEL_RADIUS[mode], np.float32
    if scale is None and isinstance(n_in, int) and isinstance(n_out, int):
        scale = float(f32(n_out) / f32(n_in)) if n_in else float("inf")
    if scale is not None:
        if not 0 < scale < 1:
            return None
        stretch = f32(1) / f32(scale)
        shrink, support = f32(1) / stretch, f32(radius) * stretch
        return Stretched(int(np.floor(2 * support)) + 1, Const(float(shrink), dtypes.float32),
                         Const(float(support), dtypes.float32))
    # The scale is known at run time. floor(2 * support) + 1 taps cover the integers in
    # (p - support, p + support), support being radius * max(n_in, n_out) / n_out.
    ratio = cast(as_expr(n_out), dtypes.float32) / cast(as_expr(n_in), dtypes.float32)
    stretch = maximum(1.0 / ratio, 1.0)
    taps = simplify_dim(int(2 * radius) * as_expr(_max(n_in, n_out)) // _max(n_out, 1) + 1)
    return Stretched(taps, 1.0 / stretch, radius * stretch)


def _pairwise_sum(terms: list[Expr]) -> Expr:
    """The sum as a balanced tree: cubic taps over four axes are 256 terms, too deep a
    chain for the printers' recursion."""
    if len(terms) == 1:
        return terms[0]
    half = len(terms) // 2
    return _pairwise_sum(terms[:half]) + _pairwise_sum(terms[half:])


def _resize_mode(ctx: OpContext, dtype: dtypes.DataType) -> str:
    mode = ctx.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        raise ctx.unsupported(f"mode {mode!r}")
    transform = ctx.attr("coordinate_transformation_mode", "half_pixel")
    if transform not in COORDINATES and transform != CROP:
        raise ctx.unsupported(f"coordinate_transformation_mode {transform!r}")
    if mode == "nearest" and ctx.attr("nearest_mode", "round_prefer_floor") not in NEAREST:
        raise ctx.unsupported(f"nearest_mode {ctx.attr('nearest_mode')!r}")
    if mode != "nearest" and not dtype.is_float:
        raise ctx.unsupported(f"{mode} resizing of {dtype}")
    if mode == "nearest" and ctx.attr("antialias", 0):
        raise ctx.unsupported("antialias in nearest mode (ONNX applies it to linear and "
                              "cubic modes)")
    policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise ctx.error(f"unknown keep_aspect_ratio_policy {policy!r}")
    return mode


def _source_position(ctx: OpContext, shape: list[Dim], out: list[Dim],
                     scales: list[Optional[float]], roi: list[tuple[float, float]]):
    """(axis, output position) -> the float32 position in the input it samples."""
    transform = ctx.attr("coordinate_transformation_mode", "half_pixel")
    f32 = dtypes.float32

    def source(a: int, v: Expr) -> Expr:
        n_in, n_out = cast(as_expr(shape[a]), f32), cast(as_expr(out[a]), f32)
        if transform == CROP:
            # The output spans the crop [start, end] of the input (in fractions of its
            # last position), or samples the crop's middle when one element long.
            start, end = (Const(r, f32) for r in roi[a])
            return select(n_out > 1.0, start * (n_in - 1.0) + cast(v, f32) * (end - start) *
                          (n_in - 1.0) / (n_out - 1.0), 0.5 * (start + end) * (n_in - 1.0))
        if scales[a] is None and transform == "asymmetric":
            # i * n_in / n_out rounds once, so a tie (7 -> 8 wide: 3.5 at 4) stays a tie
            # for round_prefer_ceil, as in ONNX Runtime; i / (n_out / n_in) gave 3.4999998.
            return cast(v * as_expr(shape[a]), f32) / n_out
        # Given scales, align_corners divides by the rounded output length, as ONNX
        # Runtime and PyTorch do (ONNX's reference takes the unrounded one).
        scale = n_out / n_in if scales[a] is None else Const(scales[a], f32)
        return COORDINATES[transform](cast(v, f32), scale, n_in, n_out)
    return source


def _crop(ctx: OpContext, rank: int) -> list[tuple[float, float]]:
    """tf_crop_and_resize's region of interest (input 1) per axis, as (start, end) in
    fractions of the axis; the whole axis, (0, 1), elsewhere."""
    crop = [(0.0, 1.0)] * rank
    if ctx.attr("coordinate_transformation_mode") != CROP:
        return crop
    if not ctx.has_input(3):
        raise ctx.unsupported("tf_crop_and_resize with scales (the output length then "
                              "depends on the region of interest)")
    roi = ctx.data(1) if ctx.has_input(1) else None
    if roi is None:
        raise ctx.needs_value(1, "roi") if ctx.has_input(1) else ctx.error("roi is required")
    axes = normalize_axes(ctx, ctx.attr("axes"), rank) if ctx.attr("axes") else list(range(rank))
    values = [float(v) for v in roi.astype(np.float32).reshape(-1)]
    if len(values) != 2 * len(axes):
        raise ctx.error(f"roi has {len(values)} values for {len(axes)} axes")
    for k, a in enumerate(axes):
        crop[a] = (values[k], values[k + len(axes)])
    return crop


def _linear_taps(pos: Expr, n: Dim) -> list[tuple[Expr, Expr]]:
    """The two neighbours of the position, clamped into the input, and their weights."""
    last = as_expr(n) - 1
    pos = minimum(maximum(pos, 0.0), cast(last, dtypes.float32))
    low = cast(call("floor", pos), dtypes.index_type)
    r = pos - call("floor", pos)
    return [(low, 1.0 - r), (minimum(low + 1, last), r)]


def cubic_weights(s: Expr, a: float) -> list[Expr]:
    """Keys' cubic convolution: the weights of the four neighbours floor(p) - 1 ..
    floor(p) + 2 of a position p = floor(p) + s, for the kernel's parameter ``a``."""
    return [_keys_far(s + 1.0, a), _keys_near(s, a), _keys_near(1.0 - s, a),
            _keys_far(2.0 - s, a)]


def _keys_near(d: Expr, a: float) -> Expr:
    """Keys' kernel at distance |d| <= 1."""
    return ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0


def _keys_far(d: Expr, a: float) -> Expr:
    """Keys' kernel at distance 1 < |d| < 2."""
    return ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a


def _cubic_taps(ctx: OpContext):
    """The four cubic neighbours with ONNX's ``cubic_coeff_a``. A neighbour outside the
    input reads the nearest edge element, or with ``exclude_outside`` gets weight 0 and
    the others are scaled to sum to 1. The position itself is not clamped, unlike linear
    mode's (ONNX Runtime's)."""
    a = float(ctx.attr("cubic_coeff_a", -0.75))
    exclude = bool(ctx.attr("exclude_outside", 0))

    def taps(pos: Expr, n: Dim) -> list[tuple[Expr, Expr]]:
        base = call("floor", pos)
        weights = cubic_weights(pos - base, a)
        positions = [cast(base, dtypes.index_type) + (k - 1) for k in range(4)]
        if exclude:
            weights = [select(logical_and(p >= 0, p < n), w, 0.0)
                       for p, w in zip(positions, weights)]
            total = weights[0] + weights[1] + weights[2] + weights[3]
            weights = [w / total for w in weights]
        last = as_expr(n) - 1
        return [(minimum(maximum(p, 0), last), w) for p, w in zip(positions, weights)]
    return taps


def _times(a: Optional[Expr], b: Expr) -> Expr:
    return b if a is None else a * b


def _resize_sizes(ctx: OpContext, shape: list[Dim]) -> tuple[list[Dim], list[Optional[float]]]:
    """Output sizes, and the float32 scale of each axis where scales were given (None
    where the scale follows from sizes)."""
    rank = len(shape)
    axes = normalize_axes(ctx, ctx.attr("axes"), rank) if ctx.attr("axes") else list(range(rank))
    out, scales = list(shape), [1.0] * rank
    if ctx.has_input(3):
        sizes = ctx.known(3, "sizes")
        if len(sizes) != len(axes):
            raise ctx.error(f"{len(sizes)} sizes for {len(axes)} axes")
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            return _keep_aspect_ratio(ctx, shape, axes, sizes, policy)
        for a, size in zip(axes, sizes):
            out[a], scales[a] = size, None
        return out, scales
    given = ctx.data(2) if ctx.has_input(2) else None
    if ctx.has_input(2) and given is None:
        raise ctx.needs_value(2, "scales")
    if given is None or given.size == 0:
        raise ctx.error("needs scales or sizes")
    if given.size != len(axes):
        raise ctx.error(f"{given.size} scales for {len(axes)} axes")
    for a, scale in zip(axes, given.astype(np.float32).reshape(-1)):
        if scale <= 0:
            raise ctx.error(f"scale {scale} of axis {a} must be positive")
        # floor(d * scale) exactly: the float32 scale is a binary fraction.
        ratio = Fraction(float(scale))
        out[a] = simplify_dim(as_expr(shape[a]) * ratio.numerator // ratio.denominator)
        scales[a] = float(scale)
    return out, scales


def _keep_aspect_ratio(ctx: OpContext, shape: list[Dim], axes: list[int], sizes: list[Dim],
                       policy: str) -> tuple[list[Dim], list[Optional[float]]]:
    """One scale for every resized axis: the largest that keeps them within ``sizes``
    (not_larger) or the smallest that covers them (not_smaller), in float32; each length
    is its input length times it, rounded half away from zero, as in ONNX Runtime."""
    lengths = [shape[a] for a in axes]
    if not all(isinstance(v, int) and v > 0 for v in [*sizes, *lengths]):
        raise ctx.unsupported(f"keep_aspect_ratio_policy {policy!r} needs positive sizes "
                              "known when compiling")
    ratios = [np.float32(size) / np.float32(n) for size, n in zip(sizes, lengths)]
    scale = min(ratios) if policy == "not_larger" else max(ratios)
    out, scales = list(shape), [1.0] * len(shape)
    for a in axes:
        out[a] = int(np.floor(np.float64(scale * np.float32(shape[a])) + 0.5))
        scales[a] = float(scale)
    return out, scales


def _fmt(shape: Sequence) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"
