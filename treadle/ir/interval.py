"""Range analysis of integer expressions: the interval of values an expression can take.

An ``Interval`` holds integers ``lo..hi`` with either end possibly unbounded; ``bound``
computes one bottom-up from the intervals of the variables. Integer ``//`` and ``%`` are
C's (the quotient rounds toward zero), and signed arithmetic is assumed not to overflow.
Only signed scalar integers are tracked: unsigned arithmetic wraps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional

from treadle.ir.dtypes import DataType
from treadle.ir.expr import Binary, Cast, Const, Expr, Select, Unary, Var
from treadle.ir.functor import SCALAR_BINARY

Ranges = Mapping[Var, "Interval"]

_c_div = SCALAR_BINARY["//"]


def is_index_dtype(dtype: DataType) -> bool:
    """Signed scalar integers: the types whose ranges are tracked."""
    return dtype.kind == "int" and not dtype.is_vector


def int_limits(dtype: DataType) -> tuple[int, int]:
    """The smallest and largest value of an integer type."""
    bits = dtype.scalar.bits
    return (0, 2 ** bits - 1) if dtype.kind == "uint" else (-2 ** (bits - 1), 2 ** (bits - 1) - 1)


@dataclass(frozen=True)
class Interval:
    """The integers ``lo..hi``, both included; None leaves that end unbounded."""
    lo: Optional[int] = None
    hi: Optional[int] = None

    @staticmethod
    def point(value: int) -> Interval:
        return Interval(value, value)

    def ends(self) -> tuple[float, float]:
        """The ends with infinities for the unbounded ones, for arithmetic."""
        return (-math.inf if self.lo is None else self.lo, math.inf if self.hi is None else self.hi)

    def signs(self) -> set[int]:
        """Which of negative (-1), zero (0) and positive (1) values the interval holds."""
        lo, hi = self.ends()
        return {s for s, held in ((-1, lo < 0), (0, lo <= 0 <= hi), (1, hi > 0)) if held}

    def __add__(self, other: Interval) -> Interval:
        (a, b), (c, d) = self.ends(), other.ends()
        return _interval(a + c, b + d)

    def __sub__(self, other: Interval) -> Interval:
        (a, b), (c, d) = self.ends(), other.ends()
        return _interval(a - d, b - c)

    def __neg__(self) -> Interval:
        lo, hi = self.ends()
        return _interval(-hi, -lo)

    def __mul__(self, other: Interval) -> Interval:
        corners = [_times(x, y) for x in self.ends() for y in other.ends()]
        return _interval(min(corners), max(corners))

    def div(self, other: Interval) -> Interval:
        """C division (rounding toward zero) by a positive divisor, or by a size that may
        be 0 (division by zero gives 0 in generated code); unbounded otherwise."""
        (lo, hi), (dlo, dhi) = self.ends(), other.ends()
        if dlo == 0 and dhi >= 1:
            return self.div(Interval(1, other.hi)).union(Interval.point(0))
        if dlo <= 0:
            return Interval()
        # The quotient grows with the dividend; a larger divisor pulls it toward zero.
        return _interval(_trunc_div(lo, dhi if lo >= 0 else dlo),
                         _trunc_div(hi, dlo if hi >= 0 else dhi))

    def mod(self, other: Interval) -> Interval:
        """C remainder by a positive divisor: the dividend's sign, magnitude below it; by a
        size that may be 0, also 0."""
        (lo, hi), (dlo, dhi) = self.ends(), other.ends()
        if dlo == 0 and dhi >= 1:
            return self.mod(Interval(1, other.hi)).union(Interval.point(0))
        if dlo <= 0:
            return Interval()
        largest = dhi - 1
        return _interval(0 if lo >= 0 else max(lo, -largest), 0 if hi <= 0 else min(hi, largest))

    def min(self, other: Interval) -> Interval:
        (a, b), (c, d) = self.ends(), other.ends()
        return _interval(min(a, c), min(b, d))

    def max(self, other: Interval) -> Interval:
        (a, b), (c, d) = self.ends(), other.ends()
        return _interval(max(a, c), max(b, d))

    def union(self, other: Interval) -> Interval:
        (a, b), (c, d) = self.ends(), other.ends()
        return _interval(min(a, c), max(b, d))


def _interval(lo: float, hi: float) -> Interval:
    return Interval(None if math.isinf(lo) else lo, None if math.isinf(hi) else hi)


def _times(x: float, y: float) -> float:
    return 0 if x == 0 or y == 0 else x * y  # an empty side times infinity is still 0


def _trunc_div(x: float, y: float) -> float:
    if math.isinf(x):
        return x
    return 0 if math.isinf(y) else _c_div(x, y)


def _bound_cast(e: Cast, ranges: Ranges) -> Interval:
    if not is_index_dtype(e.value.dtype):
        return Interval()
    inner = bound(e.value, ranges)
    lo, hi = inner.ends()
    low, high = int_limits(e.dtype)
    return inner if low <= lo and hi <= high else Interval()  # a narrowing cast may wrap


# Range of a binary op from its operands' ranges; other ops (bitwise) are not tracked.
BOUND_BINARY = {"+": Interval.__add__, "-": Interval.__sub__, "*": Interval.__mul__,
                "//": Interval.div, "%": Interval.mod, "min": Interval.min, "max": Interval.max}

# Range of each node type; loads and calls are unbounded.
BOUND = {
    Const: lambda e, r: Interval.point(e.value),
    Var: lambda e, r: r.get(e, Interval()),
    Binary: lambda e, r: (BOUND_BINARY[e.op](bound(e.a, r), bound(e.b, r))
                          if e.op in BOUND_BINARY else Interval()),
    Unary: lambda e, r: -bound(e.a, r) if e.op == "neg" else Interval(),
    Select: lambda e, r: bound(e.then, r).union(bound(e.otherwise, r)),
    Cast: _bound_cast,
}


def bound(expr: Expr, ranges: Ranges | None = None) -> Interval:
    """The values a signed integer expression can take while its variables stay in
    ``ranges`` (a variable missing there is unbounded); unbounded for other types."""
    if not is_index_dtype(expr.dtype) or type(expr) not in BOUND:
        return Interval()
    return BOUND[type(expr)](expr, ranges or {})
