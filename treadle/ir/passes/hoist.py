"""hoist: integer divisions by a run-time value, and costly expressions of the outer
indices, computed once before the loops they do not vary in, not at every iteration.

Indices into tensors of symbolic shape divide by the symbol (``i0 // seq`` unravels a
row over [batch, seq]). Such a division is a call of a helper that guards against zero,
and gcc neither vectorises a loop whose addresses call it nor moves the call out of the
loop itself: a LayerNorm over [1, seq, 768] ran 6x slower than over [1, 128, 768] until
the quotient was bound before the row's loops. Divisions by constants stay where they
are (the compiler turns them into multiplications it vectorises).

A resize channels-last computes each pixel's source positions and weights (floors, clamps,
conversions to indices) from the pixel alone, yet wrote them into the loop along its
channels, where gcc recomputed them per channel and did not vectorise: an expression of
the outer indices that calls a function or converts a float to an index is bound before
the loop too (Segformer's bilinear upsampling ran 3.5x faster). It reads no memory, so
evaluating it where a select would not have is harmless.
"""
from __future__ import annotations

import itertools

from treadle.ir.expr import Binary, Call, Cast, Const, Expr, Load, Var
from treadle.ir.functor import bound_vars, free_vars, rewrite, walk
from treadle.ir.interval import is_index_dtype
from treadle.ir.stmt import Accumulate, For, Function, Let, Seq, Stmt, Store

__all__ = ["hoist"]


def hoist(func: Function) -> Function:
    names = (f"h{k}" for k in itertools.count())
    taken = {v.name for v in free_vars(func.body)} | {p.name for p in func.params}
    fresh = (n for n in names if n not in taken)
    return func.with_body(rewrite(func.body, lambda s: _hoisted(s, fresh)))


def _hoisted(s, fresh) -> Stmt | None:
    """A serial loop with its invariant divisions bound by lets before it. Parallel loops
    keep theirs: their bodies run as functions of their own."""
    if not isinstance(s, For) or s.kind == "parallel":
        return None
    varying = bound_vars(s)
    written = {n.buffer for n in walk(s) if isinstance(n, (Store, Accumulate))}
    lets: dict[Expr, Var] = {}

    def bind(e) -> Expr | None:
        if not (_divides_by_value(e) or _costly(e)) or free_vars(e) & varying:
            return None
        # A mutable scalar (a run width doubling each pass) varies as much as a loop index.
        if any(isinstance(n, Load) and n.buffer in written for n in walk(e)):
            return None
        if e not in lets:
            lets[e] = Var(next(fresh), e.dtype)
        return lets[e]
    body = rewrite(s.body, bind)
    if not lets:
        return None
    return Seq((*(Let(v, e) for e, v in lets.items()), For(s.var, s.extent, body, s.kind)))


def _divides_by_value(e) -> bool:
    return (isinstance(e, Binary) and e.op in ("//", "%") and is_index_dtype(e.dtype)
            and not isinstance(e.b, Const))


def _costly(e) -> bool:
    """A scalar function call or float-to-index conversion of indices, reading no memory."""
    if not isinstance(e, (Call, Cast)) or e.dtype.lanes != 1 or not free_vars(e):
        return False
    if isinstance(e, Cast) and not (is_index_dtype(e.dtype) and e.value.dtype.is_float):
        return False
    if isinstance(e, Call) and any(a.dtype.lanes != 1 for a in e.args):
        return False
    return not any(isinstance(n, Load) for n in walk(e))
