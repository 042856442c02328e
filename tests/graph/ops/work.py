"""An upper bound on the iterations a kernel's loops run, from its IR alone: each loop's
extent bounded by range analysis given the bounds of the loops and lets around it. Tests
bound an operator's work with it without timing anything."""
from __future__ import annotations

from treadle.ir.expr import Var
from treadle.ir.functor import children
from treadle.ir.interval import Interval, bound
from treadle.ir.stmt import For, Let, Seq, Stmt


def iterations(stmt: Stmt, ranges: dict[Var, Interval] | None = None) -> int:
    """Loop-body executions, summed over every loop of ``stmt`` at every depth."""
    ranges = dict(ranges or {})
    if isinstance(stmt, Seq):
        total = 0
        for s in stmt.stmts:
            if isinstance(s, Let):
                ranges[s.var] = bound(s.value, ranges)
            total += iterations(s, ranges)
        return total
    if isinstance(stmt, For):
        trips = max(int(bound(stmt.extent, ranges).hi), 0)
        inner = {**ranges, stmt.var: Interval(0, max(trips - 1, 0))}
        return trips * (1 + iterations(stmt.body, inner))
    return sum(iterations(c, ranges) for c in children(stmt) if isinstance(c, Stmt))
