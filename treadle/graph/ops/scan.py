"""CumSum and CumProd: each element combines those before it along an axis (after it with
``reverse``, itself left out with ``exclusive``).

The definition says so as a reduction over the whole axis, selecting the elements that
count, which is what shape inference, compile-time values and the IR interpreter read.
Run that way a line of n costs n * n, so the operator brings its own kernel: one pass along
each line, each element the previous result combined with one input element.
"""
from __future__ import annotations

from treadle.graph.operator import OpContext, Operator, register
from treadle.graph.ops.common import normalize_axis
from treadle.graph.ops.lines import Each, over_lines
from treadle.graph.ops.transform import _dims, known_scalar
from treadle.ir.builder import FunctionBuilder
from treadle.ir.compute import Compute, combine, identity_of, reduce
from treadle.ir.expr import as_expr, select
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import canonical_kernel

OPS = {"CumSum": "sum", "CumProd": "prod"}


def _kernel(op: Operator, name: str) -> Kernel:
    x, y = op.input_buffers[0], op.definition[0].buffer
    axis = int(op.inputs[1].value[0]) % x.rank
    n, reduction = x.shape[axis], OPS[op.op_type]
    exclusive, backward = bool(op.attrs.get("exclusive", 0)), bool(op.attrs.get("reverse", 0))

    def position(step):
        return as_expr(n) - 1 - step if backward else as_expr(step)

    def line(outer: tuple, each: Each) -> None:
        """The first element, then each next one from the one before."""
        def at(step, inner: tuple) -> tuple:
            return (*outer, position(step), *inner)
        with fb.if_(as_expr(n) > 0):
            each(lambda i: fb.store(y, at(0, i), identity_of(reduction, x.dtype)
                                    if exclusive else x[at(0, i)]))
        for s in fb.range(as_expr(n) - 1, name="step"):
            each(lambda i: fb.store(y, at(s + 1, i), combine(
                reduction, y[at(s, i)], x[at(s if exclusive else s + 1, i)])))
    with FunctionBuilder(name) as fb:
        for b in (x, y):
            fb.add_param(b)
        over_lines(fb, x.shape[:axis], x.shape[axis + 1:], line)
        fb.add_size_symbols(x.shape)
    return canonical_kernel(fb.function, op.input_buffers, 1)


def _running(ctx: OpContext) -> list[Compute]:
    x, shape = ctx.input(0), _dims(ctx, 0)
    axis = normalize_axis(ctx, known_scalar(ctx, 1, "axis"), len(shape))
    exclusive, backward = ctx.attr("exclusive", 0), ctx.attr("reverse", 0)
    op = OPS[ctx.op_type]

    def element(*index):
        i, r = index[:-1], index[-1]
        if backward:
            included = r > i[axis] if exclusive else r >= i[axis]
        else:
            included = r < i[axis] if exclusive else r <= i[axis]
        return select(included, x[(*i[:axis], r, *i[axis + 1:])], identity_of(op, x.dtype))
    return [reduce("y", shape, [shape[axis]], element, op)]


register("CumSum", kernel=_kernel)(_running)
register("CumProd", kernel=_kernel)(_running)
