"""Scatter operators: the data, with updates written (or combined) at positions that
indices read at run time name.

An update's position p in the updates tensor maps to one output position (``Layout``).
The compute definition states the meaning as a search, out[i] = data[i] replaced by the
last update aimed at i, or combined with all of them, which shape inference, compile-time
values and the IR interpreter read. Run that way it costs output size x updates (614k x
614k for a relative-position table), so the operator brings its own kernel that copies
the data, then applies each update once: O(data + updates).

Updates that differ in an ``outer`` or ``inner`` coordinate of p can never aim at one
element, so the kernel runs those in parallel; within one such line the ``serial``
coordinates are applied in index order, which is what makes the last update win and a
reduction over repeated indices exact.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from treadle.graph.operator import OpContext, Operator, register
from treadle.graph.ops.common import normalize_axis, same_dtype
from treadle.graph.ops.lines import Each, nest, over_lines
from treadle.graph.ops.transform import _dims, _fmt, _integer_input
from treadle.graph.tensor import Dim, normalize_dim, num_elements
from treadle.ir import dtypes
from treadle.ir.builder import FunctionBuilder
from treadle.ir.compute import Compute, combine, compute, identity_of, reduce
from treadle.ir.expr import Buffer, Expr, as_expr, cast, eq, logical_and, select
from treadle.ir.mapping import unravel
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import canonical_kernel

SCATTER_REDUCTIONS = {"none": None, "add": "sum", "mul": "prod", "max": "max", "min": "min"}


@dataclass(frozen=True)
class Layout:
    """The updates' coordinates split as (outer, serial, inner), and where each goes."""
    outer: tuple[Dim, ...]
    serial: tuple[Dim, ...]
    inner: tuple[Dim, ...]
    # p -> its output index, whose coordinates on the ``read`` axes come from ``indices``
    target: Callable[[tuple], tuple]
    read: tuple[int, ...]


def _wrapped(value: Expr, size: Dim) -> Expr:
    """ONNX's negative positions count from the end."""
    value = cast(value, dtypes.index_type)
    return select(value < 0, value + size, value)


def _elements_layout(axis: int, shape: Sequence[Dim], indices: Buffer) -> Layout:
    """ScatterElements: update p goes to p with its ``axis`` coordinate read from indices."""
    def target(p):
        return (*p[:axis], _wrapped(indices[p], shape[axis]), *p[axis + 1:])
    updates = indices.shape
    return Layout(tuple(updates[:axis]), (updates[axis],), tuple(updates[axis + 1:]), target,
                  (axis,))


def _nd_layout(shape: Sequence[Dim], indices: Buffer) -> Layout:
    """ScatterND: update p = (batch, slice) goes to the position the batch's index tuple
    names, followed by the slice coordinates."""
    depth, batch = normalize_dim(indices.shape[-1]), tuple(indices.shape[:-1])

    def target(p):
        return (*(_wrapped(indices[(*p[:len(batch)], as_expr(j))], shape[j])
                  for j in range(depth)), *p[len(batch):])
    return Layout((), batch, tuple(shape[depth:]), target, tuple(range(depth)))


def _layout(op_type: str, attrs: dict, shape: Sequence[Dim], indices: Buffer) -> Layout:
    if op_type == "ScatterND":
        return _nd_layout(shape, indices)
    return _elements_layout(attrs.get("axis", 0) % len(shape), shape, indices)


def _define(ctx: OpContext, count: Dim, position, inside=lambda i: ()) -> list[Compute]:
    """out[i] from a search of the ``count`` candidate updates ``position(i, r)``, which
    hit i where their target agrees with it on the axes read from indices (the others
    agree by construction) and ``inside(i)`` holds."""
    data, shape = ctx.input(0), _dims(ctx, 0)
    updates = ctx.input(2)
    same_dtype(ctx, data, updates)
    kind = ctx.attr("reduction", "none")
    if kind not in SCATTER_REDUCTIONS:
        raise ctx.unsupported(f"reduction {kind!r}")
    op, layout = SCATTER_REDUCTIONS[kind], _layout(ctx.op_type, ctx.attrs, shape, ctx.input(1))

    def hits(i, r):
        target = layout.target(position(i, r))
        return logical_and(*inside(i), *(eq(target[a], i[a]) for a in layout.read))
    if op is None:
        last = reduce("last", shape, [count], lambda *ir: select(hits(ir[:-1], ir[-1]), ir[-1],
                                                                 as_expr(-1)), "max")
        return [compute("y", shape, lambda *i: select(
            last[i] >= 0, updates[position(i, last[i])], data[i]))]
    combined = reduce("combined", shape, [count], lambda *ir: select(
        hits(ir[:-1], ir[-1]), updates[position(ir[:-1], ir[-1])],
        identity_of(op, data.dtype)), op)
    return [compute("y", shape, lambda *i: combine(op, data[i], combined[i]))]


def _kernel(op: Operator, name: str) -> Kernel:
    data, indices, updates = op.input_buffers
    y = op.definition[0].buffer
    layout = _layout(op.op_type, op.attrs, data.shape, indices)
    reduction = SCATTER_REDUCTIONS[op.attrs.get("reduction", "none")]
    with FunctionBuilder(name) as fb:
        for b in (data, indices, updates, y):
            fb.add_param(b)
        for cond, message in op.checks:
            fb.assert_(cond, message)
        over_lines(fb, (), data.shape, lambda _, each: each(
            lambda i: fb.store(y, i, data[i])))
        _apply(fb, layout, y, updates, reduction)
        fb.add_size_symbols((*data.shape, *indices.shape, *updates.shape))
    return canonical_kernel(fb.function, op.input_buffers, 1)


def _apply(fb: FunctionBuilder, layout: Layout, y: Buffer, updates: Buffer,
           reduction: str | None) -> None:
    """Each update applied once, serially over the coordinates that may collide."""
    def line(outer: tuple, each: Each) -> None:
        nest(fb, layout.serial, lambda serial: each(
            lambda inner: _update(fb, layout, y, updates, (*outer, *serial, *inner), reduction)))
    over_lines(fb, layout.outer, layout.inner, line)


def _update(fb: FunctionBuilder, layout: Layout, y: Buffer, updates: Buffer, p: tuple,
            reduction: str | None) -> None:
    """y at update p's target takes (or combines with) its value, if the target is inside
    y: indices are checked before the kernel, which this guard only keeps in bounds."""
    target = list(layout.target(p))
    for a in layout.read:
        target[a] = fb.let("t", target[a])
    target = tuple(target)
    with fb.if_(logical_and(*(logical_and(target[a] >= 0, target[a] < as_expr(y.shape[a]))
                              for a in layout.read))):
        value = updates[p]
        if reduction is not None:
            value = combine(reduction, y[target], value)
        fb.store(y, target, value)


@register("ScatterElements", kernel=_kernel)
def scatter_elements(ctx: OpContext) -> list[Compute]:
    shape = _dims(ctx, 0)
    _integer_input(ctx, 1, "indices")
    index_shape = _dims(ctx, 1)
    if len(index_shape) != len(shape) or _dims(ctx, 2) != index_shape:
        raise ctx.error(f"indices {_fmt(index_shape)} and updates {_fmt(_dims(ctx, 2))} must "
                        f"have one shape of the data's rank {len(shape)}")
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(shape))

    def position(i, r):
        return (*i[:axis], r, *i[axis + 1:])

    def inside(i):
        return [i[a] < index_shape[a] for a in range(len(shape)) if a != axis]
    return _define(ctx, index_shape[axis], position, inside)


@register("ScatterND", kernel=_kernel)
def scatter_nd(ctx: OpContext) -> list[Compute]:
    shape = _dims(ctx, 0)
    _integer_input(ctx, 1, "indices")
    index_shape = _dims(ctx, 1)
    depth = index_shape[-1] if index_shape else None
    if not isinstance(depth, int) or not 1 <= depth <= len(shape):
        raise ctx.error(f"indices' last dimension {depth} must be a constant from 1 to "
                        f"the data's rank {len(shape)}")
    batch = index_shape[:-1]
    if _dims(ctx, 2) != batch + shape[depth:]:
        raise ctx.error(f"updates have shape {_fmt(_dims(ctx, 2))}, expected "
                        f"{_fmt(batch + shape[depth:])}")

    def position(i, r):
        return (*(unravel(r, batch) if batch else ()), *i[depth:])
    return _define(ctx, num_elements(batch), position)


# Opsets 9 and 10 named ScatterElements without reductions Scatter.
register("Scatter", kernel=_kernel)(scatter_elements)
