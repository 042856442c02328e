"""The kernel of ``CheckIndices`` (``graph.ops.transform``): a copy of the indices that fails
on the first one out of range, reporting its value.

A compute definition cannot fail per element, so this operator brings its own kernel: a
serial loop nest (indices are token ids and positions, small next to the data they select)
whose innermost level is unrolled over the index tuple's components when each component
indexes a different axis.
"""
from __future__ import annotations

from typing import Callable

from treadle.graph.operator import Operator
from treadle.graph.ops.transform import index_bounds, out_of_range
from treadle.ir import dtypes
from treadle.ir.builder import FunctionBuilder
from treadle.ir.expr import as_expr, cast, logical_and
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import canonical_kernel


def schedule_index_check(op: Operator, name: str) -> Kernel:
    x, data = op.input_buffers[0], op.input_buffers[1]
    y = op.definition[0].buffer
    sizes = index_bounds(x.shape, data.shape, op.attrs)
    tuples = bool(op.attrs.get("tuples"))
    with FunctionBuilder(name) as fb:
        fb.add_param(x)
        fb.add_param(y)

        def check(index: tuple) -> None:
            for j, size in enumerate(sizes):
                at = (*index, as_expr(j)) if tuples else index
                value = cast(x[at], dtypes.index_type)
                size = as_expr(size)
                fb.assert_(logical_and(value >= -size, value < size),
                           out_of_range(op.attrs, "{value}", j, size), value)
                fb.store(y, at, x[at])
        _nest(fb, x.shape[:-1] if tuples else x.shape, (), check)
        fb.add_size_symbols((*x.shape, *sizes))
    return canonical_kernel(fb.function, op.input_buffers, 1)


def _nest(fb: FunctionBuilder, extents, index: tuple, body: Callable[[tuple], None]) -> None:
    """Serial loops over ``extents``, outermost first, around ``body(index)``."""
    if not extents:
        body(index)
        return
    for i in fb.range(extents[0]):
        _nest(fb, extents[1:], (*index, i), body)
