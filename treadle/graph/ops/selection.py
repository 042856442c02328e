"""Operators whose output size depends on the data: the coordinates of the non-zero
elements (ONNX's NonZero, torch's ``nonzero``) and what is built on them.

Their outputs' sizes are symbols of their own (``OpContext.size_from_data``) that no
input gives. The operator's kernel writes the elements it selects compactly, into memory
planned for the largest size the inputs allow, and stores the size it found in an extra
int64 output; the executor reads it after the kernel has run and binds the symbol for
the kernels after it (``runtime.executor``). The kernel writes rows, a selected
element's coordinates each: a row's place does not depend on how many follow, so one
pass writes them. ONNX's NonZero is their transpose (``nonzero``).

The compute definition states the meaning as a search (the k-th selected element is the
one with k selected before it), which shape inference reads; run that way it would cost
n^2, so the kernel makes one pass.
"""
from __future__ import annotations

from treadle.graph.operator import OpContext, Operator, apply, register
from treadle.graph.tensor import Tensor, constant, num_elements
from treadle.ir import dtypes
from treadle.ir.builder import FunctionBuilder
from treadle.ir.compute import Compute, compute, reduce
from treadle.ir.expr import Buffer, Expr, as_expr, cast, eq, logical_and, ne, select
from treadle.ir.mapping import unravel
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import canonical_kernel


def _selected(x: Buffer, index: tuple) -> Expr:
    return x[index] if x.dtype.is_bool else ne(x[index], as_expr(0, x.dtype))


def _element(x: Buffer, flat) -> tuple:
    """The index of element ``flat`` in row-major order (a scalar's is ``()``)."""
    return unravel(flat, x.shape) if x.shape else ()


def _nonzero_rows_kernel(op: Operator, name: str) -> Kernel:
    """One pass in row-major order: each selected element's coordinates go to the next
    row; the count of rows is the second output."""
    (x,) = op.input_buffers
    rows, total = (c.buffer for c in op.definition)
    with FunctionBuilder(name) as fb:
        for b in (x, rows, total):
            fb.add_param(b)
        k = fb.scalar("k", dtypes.int64, 0)
        for f in fb.range(num_elements(x.shape), name="f"):
            index = _element(x, f)
            with fb.if_(_selected(x, index)):
                for axis, c in enumerate(index or (0,)):
                    fb.store(rows, [k[()], axis], cast(c, dtypes.int64))
                fb.store(k, [], k[()] + 1)
        fb.store(total, [], k[()])
        fb.add_size_symbols((*x.shape, *rows.shape))
    return canonical_kernel(fb.function, op.input_buffers, 2)


@register("NonZeroRows", internal=True, kernel=_nonzero_rows_kernel)
def nonzero_rows(ctx: OpContext) -> list[Compute]:
    """[count, rank]: the coordinates of the non-zero (true) elements, a row each, in
    row-major order (a scalar reads as a vector of one element, as numpy and ONNX
    Runtime have it); and the count."""
    x = ctx.input(0)
    n = num_elements(x.shape)
    size = ctx.size_from_data(1, n)

    def hit(f):
        return _selected(x, _element(x, f))
    before = reduce("before", [n], [n], lambda f, g: cast(
        logical_and(g <= f, hit(g)), dtypes.int64), "sum")
    position = reduce("position", [size], [n], lambda k, f: select(
        logical_and(hit(f), eq(before[f], cast(k, dtypes.int64) + 1)), f, as_expr(-1)), "max")

    def coordinate(k, d):
        coords = _element(x, position[k]) or (as_expr(0),)
        value = as_expr(coords[-1])
        for axis in reversed(range(len(coords) - 1)):
            value = select(eq(d, axis), coords[axis], value)
        return cast(value, dtypes.int64)
    count = reduce("count", [], [n], lambda f: cast(hit(f), dtypes.int64), "sum")
    return [compute("y", [size, max(len(x.shape), 1)], coordinate), count]


def _found_sum_kernel(op: Operator, name: str) -> Kernel:
    """One pass: the sum, or -1 once an element is negative."""
    (x,) = op.input_buffers
    total = op.definition[-1].buffer
    with FunctionBuilder(name) as fb:
        for b in (x, total):
            fb.add_param(b)
        s = fb.scalar("s", dtypes.int64, 0)
        for f in fb.range(num_elements(x.shape), name="f"):
            v = cast(x[_element(x, f)], dtypes.int64)
            fb.store(s, [], select((v < 0) | (s[()] < 0), as_expr(-1, dtypes.int64),
                                   s[()] + v))
        fb.store(total, [], s[()])
        fb.add_size_symbols(x.shape)
    return canonical_kernel(fb.function, op.input_buffers, 1)


@register("FoundSum", internal=True, kernel=_found_sum_kernel)
def found_sum(ctx: OpContext) -> list[Compute]:
    """The sum of an integer tensor's elements (int64) as a size found in the data, which
    no expression of the inputs' sizes bounds: the length of ``repeat_interleave`` with
    tensor repeats. A negative element makes it -1, which the executor refuses naming
    the node."""
    x = ctx.input(0)
    if not x.dtype.is_integer:
        raise ctx.error(f"input 0 must be an integer tensor, not {x.dtype}")
    ctx.size_from_data(0, None)
    n = num_elements(x.shape)

    def element(f):
        return cast(x[_element(x, f)], dtypes.int64)
    low = reduce("low", [], [n], element, "min")
    total = reduce("sum", [], [n], element, "sum")
    return [compute("total", [], lambda: select(low[()] < 0, as_expr(-1, dtypes.int64),
                                                total[()]))]


def nonzero(x: Tensor, name: str, output: str | None = None) -> Tensor:
    """ONNX's NonZero: [rank, count], the transpose of the rows; the node ``name``, its
    result the tensor ``output``."""
    rows = apply("NonZeroRows", [x], name=f"{name}/rows")[0]
    return apply("Transpose", [rows], {"perm": [1, 0]}, name=name, output_names=[output])[0]


def compress(x: Tensor, condition: Tensor, axis: int | None, name: str,
             output: str | None = None) -> Tensor:
    """ONNX's Compress: the slices of ``x`` along ``axis`` (of its flattened elements
    where None) whose condition is true; slices past the condition's end are dropped."""
    if axis is None:
        flat = constant([-1], f"{name}/flat", dtypes.int64)
        x, axis = apply("Reshape", [x, flat], name=f"{name}/flatten")[0], 0
    rows = apply("NonZeroRows", [condition], name=f"{name}/rows")[0]
    first = constant(0, f"{name}/first", dtypes.int64)
    chosen = apply("Gather", [rows, first], {"axis": 1}, name=f"{name}/chosen")[0]
    return apply("Gather", [x, chosen], {"axis": axis}, name=name, output_names=[output])[0]
