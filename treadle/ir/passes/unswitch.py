"""unswitch: a loop storing a select whose condition does not vary in the loop becomes a
test before two loops, one per branch.

A concatenation's element is a select among its inputs on the index along its axis (a
tree of them, by halves). Where that axis is outside the innermost loop, every element of
a row evaluated the same comparisons, and gcc neither moves them out nor vectorises the
loop around them: an exporter's unrolled recurrence concatenating its 64 steps along the
outer axis spent most of its time comparing. Tested once per row, each branch is a copy
loop of its own.
"""
from __future__ import annotations

from dataclasses import replace

from treadle.ir.expr import Load, Select
from treadle.ir.functor import free_vars, rewrite, walk
from treadle.ir.stmt import For, Function, If, Stmt, Store

__all__ = ["unswitch"]


def unswitch(func: Function) -> Function:
    return func.with_body(rewrite(func.body, _unswitched))


def _unswitched(s: Stmt) -> Stmt | None:
    """A serial loop over one scalar store of a select whose condition reads no memory
    and does not involve the loop's variable, as an if choosing between two loops (each
    unswitched in turn); None for any other statement."""
    if not (isinstance(s, For) and s.kind == "serial" and isinstance(s.body, Store)):
        return None
    store = s.body
    value = store.value
    if not isinstance(value, Select) or store.lanes != 1 or value.cond.dtype.lanes != 1:
        return None
    cond = value.cond
    if s.var in free_vars(cond) or any(isinstance(n, Load) for n in walk(cond)):
        return None

    def branch(chosen) -> Stmt:
        loop = replace(s, body=replace(store, value=chosen))
        return _unswitched(loop) or loop
    return If(cond, branch(value.then), branch(value.otherwise))
