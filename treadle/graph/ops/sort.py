"""TopK: the k largest (or smallest) elements along an axis, best first, and their indices.

Selecting is no compute definition (an output element depends on the ranks of all the
others), so the operator brings its own kernel, each line along the axis one parallel
iteration:
* for a small k, the best k seen so far are kept sorted in the outputs themselves: a new
  element better than the k-th is inserted by shifting the worse ones down one place,
  which costs one comparison for most elements of a long line;
* otherwise (a sort, a top-p sampler's ranking of a vocabulary), the line is merge sorted
  bottom-up between two workspaces, O(length log length), and its first k are copied out.

Order, as ONNX Runtime and PyTorch give it: equal elements keep their order along the
axis (the lower index first), and NaN ranks above every number, so it comes first among
the largest and last among the smallest.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from treadle.graph.operator import OpContext, Operator, register
from treadle.graph.ops.common import normalize_axis
from treadle.graph.ops.transform import _dims, known_scalar
from treadle.graph.tensor import normalize_dim
from treadle.ir import dtypes
from treadle.ir.builder import FunctionBuilder
from treadle.ir.compute import Compute, compute
from treadle.ir.expr import Buffer, Expr, Load, as_expr, cast, minimum, ne, select
from treadle.ir.mapping import unravel
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import canonical_kernel


# Insertion into the outputs takes about k * k * log(length / k) steps a line on data in
# no order (k * length at worst), a merge sort 2 * length * log2(length): insertion up to
# this k, or further where k * k stays within INSERTION_RATIO lengths; merging above.
MAX_INSERTION_K, INSERTION_RATIO = 64, 64
# Merge passes double the run width each time: enough for any line that fits in memory.
MAX_PASSES = 64


def _kernel(op: Operator, name: str) -> Kernel:
    x = op.input_buffers[0]
    values, indices = (c.buffer for c in op.definition)
    axis = op.attrs.get("axis", -1) % x.rank
    length, k = normalize_dim(x.shape[axis]), normalize_dim(values.shape[axis])
    outer, inner = x.shape[:axis], x.shape[axis + 1:]
    better = ranking(bool(op.attrs.get("largest", 1)), x.dtype)
    inserting = isinstance(k, int) and (k <= MAX_INSERTION_K or (
        isinstance(length, int) and k * k <= INSERTION_RATIO * length))
    with FunctionBuilder(name) as fb:
        for b in (x, values, indices):
            fb.add_param(b)
        for cond, message in op.checks:  # k within a symbolic length
            fb.assert_(cond, message)
        lines = math.prod(as_expr(d) for d in (*outer, *inner)) if outer or inner else 1
        runs = () if inserting else tuple(
            fb.param(f"{what}{r}", dtype, [lines, length])
            for r in "ab" for what, dtype in (("values", x.dtype), ("indices", dtypes.int64)))
        for line in fb.range(lines, kind="parallel", name="line"):
            coords = unravel(line, [*outer, *inner])

            def at(j):
                return (*coords[:len(outer)], as_expr(j), *coords[len(outer):])
            with fb.if_(as_expr(k) > 0):
                if inserting:
                    _insert_line(fb, x, values, indices, at, length, k, better)
                else:
                    _sort_line(fb, x, (values, indices), runs, line, at, length, k, better)
        fb.add_size_symbols((*x.shape, *values.shape))
    return canonical_kernel(fb.function, op.input_buffers, 2)


def _insert_line(fb: FunctionBuilder, x: Buffer, values: Buffer, indices: Buffer, at,
                 length, k, better) -> None:
    """The best ``k`` of one line of ``x``, inserted one by one into the same line of the
    outputs: a binary search for the place, then the worse ones shifted down."""
    kept = fb.scalar("kept", dtypes.index_type, 0)
    steps = k.bit_length() if isinstance(k, int) else MAX_PASSES
    for j in fb.range(length, name="j"):
        v = fb.let("v", x[at(j)])
        with fb.if_((kept[()] < k) | better(v, values[at(as_expr(k) - 1)])):
            slot = fb.let("slot", minimum(kept[()], as_expr(k) - 1))
            # The first kept element v is better than; equal ones stay above it.
            low = fb.scalar("low", dtypes.index_type, 0)
            high = fb.scalar("high", dtypes.index_type, slot)
            for _ in fb.range(steps, name="step"):
                with fb.if_(low[()] < high[()]):
                    middle = fb.let("middle", (low[()] + high[()]) // 2)
                    with fb.if_(better(v, values[at(middle)])):
                        fb.store(high, (), middle)
                    with fb.else_():
                        fb.store(low, (), middle + 1)
            for t in fb.range(slot - low[()], name="t"):
                q = slot - t
                fb.store(values, at(q), values[at(q - 1)])
                fb.store(indices, at(q), indices[at(q - 1)])
            fb.store(values, at(low[()]), v)
            fb.store(indices, at(low[()]), cast(j, dtypes.int64))
            fb.store(kept, (), minimum(kept[()] + 1, k))


def _sort_line(fb: FunctionBuilder, x: Buffer, outputs: tuple[Buffer, Buffer], runs,
               line, at, length, k, better) -> None:
    """The best ``k`` of one line of ``x`` by merging ever longer sorted runs, from the
    workspace pair a to b and back, two passes a round so that the line ends in a."""
    a, b = runs[:2], runs[2:]
    for j in fb.range(length, name="j"):
        fb.store(a[0], (line, j), x[at(j)])
        fb.store(a[1], (line, j), cast(j, dtypes.int64))
    merge_sort(fb, a, b, line, length, better)
    for j in fb.range(k, name="j"):
        for out, run in zip(outputs, a):
            fb.store(out, at(j), run[line, j])


def merge_sort(fb: FunctionBuilder, a: Sequence[Buffer], b: Sequence[Buffer], line, length,
               better: Callable[[Expr, Expr], Expr]) -> None:
    """Sorts row ``line`` of the runs ``a`` (the first holds the keys ``better`` ranks,
    the others travel with them) over its first ``length`` elements, stably, by merging
    ever longer sorted runs from ``a`` to the workspaces ``b`` and back, two passes a
    round so that the result ends in ``a``: O(length log length)."""
    width = fb.scalar("width", dtypes.index_type, 1)
    for _ in fb.range(MAX_PASSES // 2, name="round"):
        with fb.if_(width[()] < length):
            _merge_pass(fb, a, b, line, width[()], length, better)
            _merge_pass(fb, b, a, line, width[()] * 2, length, better)
            fb.store(width, (), width[()] * 4)


def _merge_pass(fb: FunctionBuilder, source, target, line, width, length, better) -> None:
    """Each pair of neighbouring sorted runs of ``width`` in ``source`` merged into one run
    of ``target``; a left element goes first unless the right one is strictly better, so
    equal elements keep their order."""
    for pair in fb.range((as_expr(length) + 2 * width - 1) // (2 * width), name="pair"):
        start = fb.let("start", pair * 2 * width)
        middle = fb.let("middle", minimum(start + width, length))
        end = fb.let("end", minimum(start + 2 * width, length))
        left = fb.scalar("left", dtypes.index_type, start)
        right = fb.scalar("right", dtypes.index_type, middle)
        for o in fb.range(end - start, name="o"):
            # Clamped, an exhausted side's position still reads inside the line.
            i, j = minimum(left[()], as_expr(length) - 1), minimum(right[()], as_expr(length) - 1)
            take_left = fb.let("take_left", (left[()] < middle) & (
                (right[()] >= end) | ~better(source[0][line, j], source[0][line, i])))
            for s_run, t_run in zip(source, target):
                fb.store(t_run, (line, start + o), select(take_left, s_run[line, i],
                                                          s_run[line, j]))
            fb.store(left, (), left[()] + cast(take_left, dtypes.index_type))
            fb.store(right, (), right[()] + 1 - cast(take_left, dtypes.index_type))


def ranking(largest: bool, dtype: dtypes.DataType) -> Callable[[Expr, Expr], Expr]:
    """Whether a ranks strictly before b."""
    def better(a: Expr, b: Expr) -> Expr:
        first = a > b if largest else a < b
        if not dtype.is_float:
            return first
        nan_a, nan_b = ne(a, a), ne(b, b)
        return first | ((nan_a & ~nan_b) if largest else (nan_b & ~nan_a))
    return better


@register("TopK", kernel=_kernel)
def top_k(ctx: OpContext) -> list[Compute]:
    x, shape = ctx.input(0), _dims(ctx, 0)
    if not shape:
        raise ctx.error("needs rank 1 or more, got a scalar")
    if x.dtype.is_bool:
        raise ctx.unsupported("bool input")
    axis = normalize_axis(ctx, ctx.attr("axis", -1), len(shape))
    k, length = known_scalar(ctx, 1, "k"), shape[axis]
    if isinstance(k, int) and k < 0:
        raise ctx.error(f"k must not be negative, got {k}")
    if isinstance(k, int) and isinstance(length, int):
        if k > length:
            raise ctx.error(f"k = {k} exceeds the length {length} of axis {axis}")
    elif k != length:
        ctx.require(as_expr(k) <= as_expr(length),
                    f"k = {k} exceeds the length {length} of axis {axis}")
    out = [*shape[:axis], k, *shape[axis + 1:]]
    results = (Buffer("TopK:values", x.dtype, tuple(out)),
               Buffer("TopK:indices", dtypes.int64, tuple(out)))
    return [compute(n, out, lambda *i, b=b: Load(b, i))
            for n, b in zip(("values", "indices"), results)]
