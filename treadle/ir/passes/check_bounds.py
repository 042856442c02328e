"""check_bounds: every load from and store to a parameter buffer first checks its indices.

A kernel is C: an index outside its buffer reads or overwrites whatever memory lies there.
In checked mode (``TREADLE_CHECK_BOUNDS=1``, or ``checked=True`` on a ``treadle.lang``
kernel) each access gets, before the statement making it, one ``Assert`` per axis that
``0 <= index < size`` (for a vector of n lanes, the last of its elements too), failing
the call with a KernelError that names the buffer, the index and the size. A load that
only some evaluations reach (a branch of a select, the right operand of ``and`` / ``or``)
is checked only where it is reached. Local and shared buffers are the kernel's own and
are not checked. The pass runs only in checked mode, so unchecked kernels are unchanged.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator, Optional

from treadle.ir.expr import Binary, Buffer, Expr, Load, Select, Unary, as_expr
from treadle.ir.functor import children
from treadle.ir.stmt import Assert, Function, Seq, Stmt, Store

__all__ = ["check_bounds"]


def check_bounds(func: Function) -> Function:
    """``func`` with each access to one of its buffer parameters checked first."""
    return func.with_body(_block(func.body, frozenset(func.buffers)))


def _block(s: Stmt, params: frozenset[Buffer]) -> Stmt:
    items = _statement(s, params)
    return items[0] if len(items) == 1 else Seq(tuple(items))


def _statement(s: Stmt, params: frozenset[Buffer]) -> list[Stmt]:
    """The checks of what ``s`` evaluates itself, then ``s`` with the statements inside
    it checked."""
    if isinstance(s, Seq):  # a nested Seq keeps its own scope for the lets it holds
        return [Seq(tuple(t for item in s.stmts for t in _statement(item, params)))]
    checks = [check for e in children(s) if isinstance(e, Expr)
              for check in _checks(e, None, params)]
    if isinstance(s, Store) and s.buffer in params:
        checks += _inside(s.buffer, s.indices, s.lanes, None, "store to")
    inner = {f.name: _block(getattr(s, f.name), params) for f in dataclasses.fields(s)
             if isinstance(getattr(s, f.name), Stmt)}
    return [*checks, dataclasses.replace(s, **inner) if inner else s]


def _checks(e: Expr, guard: Optional[Expr], params: frozenset[Buffer]) -> Iterator[Assert]:
    """The checks of the loads in ``e``, inner ones first, each holding where ``guard``
    (the condition under which it is evaluated; None: always) does."""
    if isinstance(e, Select) and e.cond.dtype.is_bool:
        yield from _checks(e.cond, guard, params)
        yield from _checks(e.then, _both(guard, e.cond), params)
        yield from _checks(e.otherwise, _both(guard, Unary("not", e.cond)), params)
        return
    if isinstance(e, Binary) and e.op in ("and", "or") and e.dtype.is_bool:
        yield from _checks(e.a, guard, params)
        reached = e.a if e.op == "and" else Unary("not", e.a)  # C stops early otherwise
        yield from _checks(e.b, _both(guard, reached), params)
        return
    for child in children(e):
        if isinstance(child, Expr):
            yield from _checks(child, guard, params)
    if isinstance(e, Load) and e.buffer in params:
        yield from _inside(e.buffer, e.indices, e.lanes, guard, "load from")


def _inside(buffer: Buffer, indices: tuple[Expr, ...], lanes: int, guard: Optional[Expr],
            what: str) -> list[Assert]:
    """One check per axis that the access stays inside ``buffer``; a vector of ``lanes``
    elements runs along the last axis."""
    access = f"{what} {buffer.name}[{', '.join(map(str, indices))}]"
    found = []
    for axis, (index, size) in enumerate(zip(indices, buffer.shape)):
        last = index + (lanes - 1) if lanes > 1 and axis == buffer.rank - 1 else index
        inside = Binary("and", Binary(">=", index, as_expr(0, index.dtype)),
                        Binary("<", last, size))
        span = f" (a vector of {lanes} elements)" if last is not index else ""
        found.append(Assert(inside if guard is None else
                            Binary("or", Unary("not", guard), inside),
                            f"{access}: index {{value}}{span} on axis {axis} is outside "
                            f"its size {size}", index))
    return found


def _both(guard: Optional[Expr], cond: Expr) -> Expr:
    return cond if guard is None else Binary("and", guard, cond)
