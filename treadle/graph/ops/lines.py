"""The loop nest of operator kernels that work along lines (``scan``, ``scatter``): the
lines are independent, so they run in parallel, and the last line axis goes in blocks of
contiguous elements, so a line of a few elements costs no thread-pool iteration of its
own; along the line the caller's loops run serially, in index order."""
from __future__ import annotations

from typing import Callable, Sequence

from treadle.graph.tensor import Dim, num_elements
from treadle.ir.builder import FunctionBuilder
from treadle.ir.expr import as_expr, minimum
from treadle.ir.mapping import unravel

# Elements of the last line axis one parallel iteration takes.
BLOCK = 64

# Emits the per-element work at the last axes' coordinates (``()`` where there are none).
Each = Callable[[Callable[[tuple], None]], None]


def over_lines(fb: FunctionBuilder, outer: Sequence[Dim], inner: Sequence[Dim],
               body: Callable[[tuple, Each], None]) -> None:
    """A parallel loop over every (outer, inner) position, calling ``body(outer_index,
    each)`` once per block: ``body`` emits its serial loops, and inside them ``each(f)``
    emits ``f(inner_index)`` for the block's positions."""
    lines = (*outer, *inner[:-1])
    last = inner[-1] if inner else 1
    blocks = (as_expr(last) + BLOCK - 1) // BLOCK
    for work in fb.range(as_expr(num_elements(lines) if lines else 1) * blocks,
                         kind="parallel", name="work"):
        line = unravel(work // blocks, lines) if lines else ()
        lead = line[len(outer):]
        start = fb.let("start", (work % blocks) * BLOCK)

        def each(f: Callable[[tuple], None]) -> None:
            if not inner:
                f(())
                return
            for q in fb.range(minimum(as_expr(last) - start, BLOCK), name="q"):
                f((*lead, start + q))
        body(line[:len(outer)], each)


def nest(fb: FunctionBuilder, extents: Sequence[Dim], body: Callable[[tuple], None],
         index: tuple = ()) -> None:
    """Serial loops over ``extents``, outermost first, around ``body(index)``."""
    if not extents:
        body(index)
        return
    for i in fb.range(extents[0], name="s"):
        nest(fb, extents[1:], body, (*index, i))
