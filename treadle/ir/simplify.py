"""Algebraic simplification of IR expressions, driven by tables of rewrite rules.

``RULES`` maps each operator to a list of small rules; a rule returns a replacement or
None, and states its algebra in a comment. Expressions are simplified bottom-up and a
node's rules run until none fires, so every rule may assume its operands are simple.

Signed integer arithmetic (index arithmetic) is put in a normal form: a sum of terms,
each a coefficient times a non-constant factor, plus a constant, written with the
constant last (``i * 8 + j + 4``). On that form ``//`` and ``%`` by a constant take out
the multiples of the divisor. The IR divides like C (the quotient rounds toward zero and
the remainder takes the dividend's sign), so most of those rules need a dividend known
to be non-negative: ``bound`` (from ``treadle.ir.interval``, re-exported here) gives
the range of an expression from the ranges of its variables.

Assumptions: signed integer arithmetic does not overflow (undefined behaviour in C, and
indices are int64); unsigned arithmetic wraps, so it gets constant folding only; float
arithmetic is never reordered, and only rewrites exact in IEEE arithmetic apply.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from treadle.ir.dtypes import DataType
from treadle.ir.expr import Binary, Broadcast, Call, Cast, Const, Expr, Load, Select, Unary, Var
from treadle.ir.functor import children, evaluate, rewrite, substitute
from treadle.ir.interval import Interval, Ranges, bound, int_limits, is_index_dtype

__all__ = ["Interval", "bound", "simplify_expr"]

Rule = Callable[[Expr, Ranges], Optional[Expr]]


def _op(e: Expr) -> str | None:
    return e.op if isinstance(e, (Binary, Unary)) else None


@dataclass(frozen=True)
class _Sum:
    """``sum(coefficient * term) + const``, terms kept in order of first appearance."""
    terms: dict
    const: int = 0

    def plus(self, other: _Sum, scale: int = 1) -> _Sum:
        terms = dict(self.terms)
        for t, k in other.terms.items():
            terms[t] = terms.get(t, 0) + k * scale
        return _Sum({t: k for t, k in terms.items() if k}, self.const + other.const * scale)

    def times(self, k: int) -> _Sum:
        return _Sum({t: c * k for t, c in self.terms.items() if c * k}, self.const * k)


def _linear(e: Expr, dtype: DataType) -> _Sum:
    """e as a sum, looking through + - * neg of ``dtype``; anything else is one term."""
    if e.dtype != dtype:
        return _Sum({e: 1})
    if isinstance(e, Const):
        return _Sum({}, e.value)
    split = LINEAR.get(_op(e))
    return split(e, dtype) if split else _Sum({e: 1})


def _linear_product(e: Binary, dtype: DataType) -> _Sum:
    a, b = _linear(e.a, dtype), _linear(e.b, dtype)
    if not a.terms:
        return b.times(a.const)
    if not b.terms:
        return a.times(b.const)
    if len(a.terms) == len(b.terms) == 1 and a.const == b.const == 0:
        # (x * 2) * (y * 3) -> (x * y) * 6: the factor is the product of the bare terms
        [(x, ka)], [(y, kb)] = a.terms.items(), b.terms.items()
        return _Sum({Binary("*", x, y): ka * kb})
    return _Sum({e: 1})


LINEAR = {
    "+": lambda e, t: _linear(e.a, t).plus(_linear(e.b, t)),
    "-": lambda e, t: _linear(e.a, t).plus(_linear(e.b, t), -1),
    "neg": lambda e, t: _linear(e.a, t).times(-1),
    "*": _linear_product,
}


def _scaled(term: Expr, k: int, dtype: DataType) -> Expr:
    if k == 1:
        return term
    return Unary("neg", term) if k == -1 else Binary("*", term, Const(k, dtype))


def _build(form: _Sum, dtype: DataType) -> Expr:
    """The sum written readably: added terms, then subtracted ones, the constant last
    (``c - x`` when nothing is added)."""
    items = sorted(form.terms.items(), key=lambda item: item[1] < 0)  # stable
    const = form.const
    if not items or (items[0][1] < 0 and const):
        result, const = Const(const, dtype), 0
    else:
        term, k = items.pop(0)
        result = _scaled(term, k, dtype)
    for term, k in items:
        result = Binary("+" if k > 0 else "-", result, _scaled(term, abs(k), dtype))
    if const:
        result = Binary("+" if const > 0 else "-", result, Const(abs(const), dtype))
    return result


def _merge_div_mod(form: _Sum, dtype: DataType, ranges: Ranges) -> _Sum:
    """Puts the digits of x back together, for either sign of x since C's division keeps
    x == x // a * a + x % a (for a symbolic a, wherever a != 0, as for x * a // a):
        x // a * (k*a) + x % a * k -> x * k
        (x // a) % b * (k*a) + x % a * k -> x % (a*b) * k"""
    for term, k in form.terms.items():
        if _op(term) != "%" or not is_index_dtype(term.dtype):
            continue
        a = _divisor(term)
        quotient = _apply(Binary("//", term.a, term.b), ranges)
        for other, m in form.terms.items():
            if a is None:  # a symbolic divisor: x // n * n + x % n -> x, where n != 0
                if m != k or _factor_out(other, term.b) != quotient:
                    continue
                whole = term.a
            elif m != k * a:
                continue
            elif other == quotient:
                whole = term.a
            elif _op(other) == "%" and other.a == quotient and _divisor(other):
                whole = _apply(Binary("%", term.a, Const(a * other.b.value, term.dtype)), ranges)
            else:
                continue
            rest = form.plus(_Sum({term: k, other: m}), -1)
            return _merge_div_mod(rest.plus(_linear(whole, dtype), k), dtype, ranges)
    return form


def _divisor(e: Expr) -> int | None:
    """c of an integer ``x // c`` or ``x % c`` with a constant c > 0, else None."""
    if is_index_dtype(e.dtype) and isinstance(e.b, Const) and e.b.value > 0:
        return e.b.value
    return None


def _make_const(value, dtype: DataType) -> Const | None:
    """value as a constant of dtype, rounded to its precision; None where C would
    overflow an integer or numpy cannot round (bfloat16)."""
    if dtype.is_integer:
        low, high = int_limits(dtype)
        return Const(value, dtype) if low <= value <= high else None
    if dtype.is_float:
        if dtype.name == "bfloat16":
            return None
        with np.errstate(over="ignore"):  # overflow to infinity is the IEEE result
            return Const(float(dtype.numpy.type(value)), dtype)
    return Const(value, dtype)


def _fold(e: Expr, ranges: Ranges) -> Expr | None:
    # op(c1, c2) -> c, by C's rules; x // 0, NaN -> int and friends are left to run time
    operands = list(children(e))
    if e.dtype.is_vector or not all(isinstance(c, Const) for c in operands):
        return None
    # A float32 constant written 0.1 means the float32 nearest to 0.1, as in C.
    if any(_make_const(c.value, c.dtype) is None for c in operands):
        return None
    rounded = rewrite(e, lambda c: _make_const(c.value, c.dtype) if isinstance(c, Const) else None)
    try:
        return _make_const(evaluate(rounded), e.dtype)
    except (ArithmeticError, ValueError):
        return None


def _normal_form(e: Expr, ranges: Ranges) -> Expr | None:
    # integer + - * neg -> sum of terms, constant last: 8 * i + 4 + j -> i * 8 + j + 4,
    # x + 0 -> x, x * 1 -> x, x * 0 -> 0, x - x -> 0, (i + 1) * 8 -> i * 8 + 8
    if not is_index_dtype(e.dtype):
        return None
    return _build(_merge_div_mod(_linear(e, e.dtype), e.dtype, ranges), e.dtype)


def _is_unit(e: Expr, value: float) -> bool:
    return (isinstance(e, Const) and e.value == value
            and math.copysign(1, e.value) == math.copysign(1, value))


# The float constant u with x OP u == x exactly, for every x including NaN, inf and -0.0.
# (x + 0.0 is not exact: -0.0 + 0.0 is +0.0; so float sums stay as written.)
FLOAT_UNIT = {"*": 1.0, "/": 1.0, "-": 0.0}


def _float_unit(e: Binary, ranges: Ranges) -> Expr | None:
    # x * 1.0 -> x, 1.0 * x -> x, x / 1.0 -> x, x - 0.0 -> x
    if not e.dtype.scalar.is_float:
        return None
    if _is_unit(e.b, FLOAT_UNIT[e.op]):
        return e.a
    return e.b if e.op == "*" and _is_unit(e.a, 1.0) else None


def _div_exact(e: Binary, ranges: Ranges) -> Expr | None:
    # (q * c) // c -> q and (q * c) % c -> 0, for either sign: nothing is rounded
    c = _divisor(e)
    if c is None:
        return None
    form = _linear(e.a, e.dtype)
    if form.const % c or any(k % c for k in form.terms.values()):
        return None
    if e.op == "%":
        return Const(0, e.dtype)
    return _build(_Sum({t: k // c for t, k in form.terms.items()}, form.const // c), e.dtype)


def _div_symbolic_factor(e: Binary, ranges: Ranges) -> Expr | None:
    # (m * q) // m -> q and (m * q) % m -> 0 for a monomial m with a symbolic factor,
    # whatever terms q has: wherever the division is defined (m != 0) it is exact. Shape
    # arithmetic produces these (768 * n // n; an exporter's batch recovered from an
    # element count, batch * seq * seq * 4 // (seq * seq * 4), which left DeBERTa's
    # broadcast sizes nesting selects that doubled with every layer).
    if not e.dtype.is_integer:
        return None
    dividend, divisor = _polynomial(e.a), _polynomial(e.b)
    if dividend is None or divisor is None or len(divisor) != 1:
        return None
    (factor, k), = divisor.items()
    if not factor:  # a constant divisor: _div_exact's case
        return None
    quotient = {}
    for monomial, c in dividend.items():
        rest = _without(monomial, factor)
        if rest is None or c % k:
            return None
        quotient[rest] = c // k
    if e.op == "%":
        return Const(0, e.dtype)
    return _build(_Sum({_product(m): c for m, c in quotient.items() if m},
                       quotient.get((), 0)), e.dtype)


def _without(monomial: tuple, factor: tuple) -> tuple | None:
    """The terms of ``monomial`` left once those of ``factor`` are taken out, or None when
    ``factor`` does not divide it."""
    rest = list(monomial)
    for term in factor:
        if term not in rest:
            return None
        rest.remove(term)
    return tuple(rest)


def _product(terms: tuple) -> Expr:
    product = terms[0]
    for term in terms[1:]:
        product = Binary("*", product, term)
    return product


def _factor_out(term: Expr, factor: Expr) -> Expr | None:
    """term / factor when ``factor`` is one operand of the product ``term``."""
    if term == factor:
        return Const(1, term.dtype)
    if isinstance(term, Binary) and term.op == "*":
        if term.a == factor:
            return term.b
        if term.b == factor:
            return term.a
    return None


def _div_common_factor(e: Binary, ranges: Ranges) -> Expr | None:
    # (g * x) // (g * c) -> x // c: the exact quotient, hence its truncation, is the same
    c = _divisor(e)
    if c is None:
        return None
    form = _linear(e.a, e.dtype)
    g = math.gcd(c, form.const, *form.terms.values())
    if g == 1:
        return None
    reduced = _Sum({t: k // g for t, k in form.terms.items()}, form.const // g)
    return Binary("//", _build(reduced, e.dtype), Const(c // g, e.dtype))


def _small_quotient(e: Binary, ranges: Ranges) -> int | None:
    """n where every value of x in ``x // c`` lies in [n*c, n*c + c), or in (-c, c) for 0."""
    c = _divisor(e)
    if c is None:
        return None
    lo, hi = bound(e.a, ranges).ends()
    if -c < lo and hi < c:
        return 0
    return lo // c if 0 <= lo and hi < math.inf and lo // c == hi // c else None


def _div_small(e: Binary, ranges: Ranges) -> Expr | None:
    # x // c -> n when n*c <= x < n*c + c (or -c < x < c, n = 0): w // 128 -> 0, w < 128
    n = _small_quotient(e, ranges)
    return None if n is None else Const(n, e.dtype)


def _mod_small(e: Binary, ranges: Ranges) -> Expr | None:
    # x % c -> x - n*c when n*c <= x < n*c + c (or -c < x < c, n = 0): w % 128 -> w, w < 128
    n = _small_quotient(e, ranges)
    return None if n is None else Binary("-", e.a, Const(n * e.b.value, e.dtype))


def _split(e: Binary, ranges: Ranges) -> tuple[Expr, Expr] | None:
    """(q, r) with x == q*c + r for ``x // c`` or ``x % c``, where r holds the terms whose
    coefficient is not a multiple of c and the constant's remainder; only when q is not 0
    and x >= 0 and r >= 0, where C's division floors and q can be taken out."""
    c = _divisor(e)
    if c is None:
        return None
    form = _linear(e.a, e.dtype)
    q = _Sum({t: k // c for t, k in form.terms.items() if k % c == 0}, form.const // c)
    r = _Sum({t: k for t, k in form.terms.items() if k % c}, form.const % c)
    if not (q.terms or q.const):
        return None
    rest = _build(r, e.dtype)
    if bound(e.a, ranges).signs() <= {0, 1} and bound(rest, ranges).signs() <= {0, 1}:
        return _build(q, e.dtype), rest
    return None


def _div_split(e: Binary, ranges: Ranges) -> Expr | None:
    # (q*c + r) // c -> q + r // c when q*c + r >= 0 and r >= 0: (i*8 + j) // 8 -> i, j < 8
    parts = _split(e, ranges)
    if parts is None:
        return None
    q, r = parts
    return Binary("+", q, _apply(Binary("//", r, e.b), ranges))


def _mod_split(e: Binary, ranges: Ranges) -> Expr | None:
    # (q*c + r) % c -> r % c when q*c + r >= 0 and r >= 0: (i*8 + j) % 8 -> j, j < 8
    parts = _split(e, ranges)
    return None if parts is None else Binary("%", parts[1], e.b)


def _coarse(e: Binary, ranges: Ranges) -> tuple[Expr, Expr, int] | None:
    """(x, r, a) with the dividend of ``e`` == x*a + r, x*a + r >= 0, 0 <= r < a and a a
    proper divisor of e's constant divisor c."""
    c = _divisor(e)
    if c is None or not bound(e.a, ranges).signs() <= {0, 1}:
        return None
    form = _linear(e.a, e.dtype)
    for a in sorted({math.gcd(k, c) for k in form.terms.values()} - {1, c}):
        x = _Sum({t: k // a for t, k in form.terms.items() if k % a == 0}, form.const // a)
        r = _build(_Sum({t: k for t, k in form.terms.items() if k % a}, form.const % a),
                   e.dtype)
        lo, hi = bound(r, ranges).ends()
        if x.terms and 0 <= lo and hi < a:
            return _build(x, e.dtype), r, a
    return None


def _div_coarse(e: Binary, ranges: Ranges) -> Expr | None:
    # (x*a + r) // (a*b) -> x // b when x*a + r >= 0 and 0 <= r < a: (i*8 + j) // 16 -> i // 2
    parts = _coarse(e, ranges)
    if parts is None:
        return None
    x, _, a = parts
    return _apply(Binary("//", x, Const(e.b.value // a, e.dtype)), ranges)


def _mod_coarse(e: Binary, ranges: Ranges) -> Expr | None:
    # (x*a + r) % (a*b) -> x % b * a + r when x*a + r >= 0 and 0 <= r < a:
    # (i*16 + j) % 64 -> i % 4 * 16 + j, j < 16
    parts = _coarse(e, ranges)
    if parts is None:
        return None
    x, r, a = parts
    # x may be a remainder itself, which the digit's own rules fold: (c % 4) % 2 -> c % 2.
    digit = _apply(Binary("%", x, Const(e.b.value // a, e.dtype)), ranges)
    return Binary("+", Binary("*", digit, Const(a, e.dtype)), r)


def _div_div(e: Binary, ranges: Ranges) -> Expr | None:
    # (x // a) // b -> x // (a*b) for a, b > 0; truncation nests like floor, for either sign
    b = _divisor(e)
    if b is None or _op(e.a) != "//" or _divisor(e.a) is None:
        return None
    return Binary("//", e.a.a, Const(e.a.b.value * b, e.dtype))


def _mod_div(e: Binary, ranges: Ranges) -> Expr | None:
    # (x % (a*b)) // a -> (x // a) % b: both are digit b of x in base a, with x's sign
    a = _divisor(e)
    m = _divisor(e.a) if a and _op(e.a) == "%" else None
    if m is None or m % a or m == a:
        return None
    quotient = _apply(Binary("//", e.a.a, e.b), ranges)
    return Binary("%", quotient, Const(m // a, e.dtype))


def _mod_mod(e: Binary, ranges: Ranges) -> Expr | None:
    # (x % a) % b -> x % b when b divides a: x % a is x less a multiple of b, same sign
    b = _divisor(e)
    a = _divisor(e.a) if b and _op(e.a) == "%" else None
    return Binary("%", e.a.a, e.b) if a and a % b == 0 else None


def _difference_signs(e: Binary, ranges: Ranges) -> set[int] | None:
    """The possible signs of a - b for integer operands, else None."""
    if not (is_index_dtype(e.a.dtype) and is_index_dtype(e.b.dtype)):
        return None
    return bound(_apply(Binary("-", e.a, e.b), ranges), ranges).signs()


# The signs of a - b for which `a OP b` holds.
TRUE_SIGNS = {"<": {-1}, "<=": {-1, 0}, ">": {1}, ">=": {0, 1}, "==": {0}, "!=": {-1, 1}}


def _compare_by_range(e: Binary, ranges: Ranges) -> Expr | None:
    # a < b -> true when a - b < 0 over the ranges, false when a - b >= 0; likewise the rest
    signs = _difference_signs(e, ranges)
    if signs is None:
        return None
    if signs <= TRUE_SIGNS[e.op]:
        return Const(True, e.dtype)
    return Const(False, e.dtype) if not signs & TRUE_SIGNS[e.op] else None


def _equal_polynomials(e: Binary, ranges: Ranges) -> Expr | None:
    # a == b -> true (a != b -> false) when both expand to one polynomial in the same
    # terms: a reshape's element counts, (2x + 2) * (y + 1) * 512 == (2x + 2) * (2y + 2) * 256
    if not (is_index_dtype(e.a.dtype) and is_index_dtype(e.b.dtype)):
        return None
    a, b = _polynomial(e.a), _polynomial(e.b)
    if a is None or b is None or a != b:
        return None
    return Const(e.op == "==", e.dtype)


MAX_MONOMIALS = 64  # expanding products of sums grows fast; shape arithmetic stays small


def _polynomial(e: Expr) -> dict[tuple, int] | None:
    """e expanded through + - * neg as {sorted terms of a monomial: coefficient}, every
    other node a term; None where that takes more than MAX_MONOMIALS monomials."""
    if isinstance(e, Const):
        return {(): e.value} if e.value else {}
    op = _op(e)
    if op == "neg":
        inner = _polynomial(e.a)
        return None if inner is None else {m: -k for m, k in inner.items()}
    if op not in ("+", "-", "*"):
        return {(e,): 1}
    a, b = _polynomial(e.a), _polynomial(e.b)
    if a is None or b is None:
        return None
    result: dict[tuple, int] = {} if op == "*" else dict(a)
    if op == "*":
        for (ma, ka), (mb, kb) in itertools.product(a.items(), b.items()):
            m = tuple(sorted(ma + mb, key=repr))
            result[m] = result.get(m, 0) + ka * kb
    else:
        for m, k in b.items():
            result[m] = result.get(m, 0) + (k if op == "+" else -k)
    result = {m: k for m, k in result.items() if k}
    return result if len(result) <= MAX_MONOMIALS else None


def _minmax_by_range(e: Binary, ranges: Ranges) -> Expr | None:
    # min(a, b) -> a when a <= b over the ranges, b when b <= a; max the other way round
    signs = _difference_signs(e, ranges)
    if signs is None:
        return None
    smaller = e.a if signs <= {-1, 0} else e.b if signs <= {0, 1} else None
    if smaller is None:
        return None
    return smaller if e.op == "min" else (e.b if smaller is e.a else e.a)


def _same_operands(e: Binary, ranges: Ranges) -> Expr | None:
    # min(x, x) -> x, max(x, x) -> x, x and x -> x, x or x -> x
    return e.a if e.a == e.b else None


def _logic_const(e: Binary, ranges: Ranges) -> Expr | None:
    # false and x -> false, true and x -> x, true or x -> true, false or x -> x (and mirrored)
    deciding = e.op == "or"
    for known, other in ((e.a, e.b), (e.b, e.a)):
        if isinstance(known, Const):
            return known if known.value == deciding else other
    return None


def _involution(e: Unary, ranges: Ranges) -> Expr | None:
    # -(-x) -> x, not not x -> x, ~~x -> x
    return e.a.a if _op(e.a) == e.op else None


NEGATED_COMPARE = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


def _not_compare(e: Unary, ranges: Ranges) -> Expr | None:
    # not (a < b) -> a >= b for integers (for floats a NaN makes both false)
    if _op(e.a) not in NEGATED_COMPARE or not e.a.a.dtype.is_integer:
        return None
    return Binary(NEGATED_COMPARE[e.a.op], e.a.a, e.a.b)


def _select_const(e: Select, ranges: Ranges) -> Expr | None:
    # select(true, a, b) -> a, select(false, a, b) -> b, select(c, a, a) -> a
    if isinstance(e.cond, Const):
        return e.then if e.cond.value else e.otherwise
    return e.then if e.then == e.otherwise else None


def _select_equal_at_case(e: Select, ranges: Ranges) -> Expr | None:
    # select(v == c, a, b) -> b when a and b agree at v = c: a broadcast size that is 1
    # (select(seq == 1, min(seq, 512), seq) is seq), which would otherwise keep every
    # index of a symbolic shape from simplifying
    cond = e.cond
    if _op(cond) != "==":
        return None
    for var, value in ((cond.a, cond.b), (cond.b, cond.a)):
        if isinstance(var, Var) and isinstance(value, Const):
            at = {var: value}
            if simplify_expr(substitute(e.then, at), ranges) == \
                    simplify_expr(substitute(e.otherwise, at), ranges):
                return e.otherwise
    return None


def _cast_noop(e: Cast, ranges: Ranges) -> Expr | None:
    # cast(x, t) -> x when x already has type t
    return e.value if e.value.dtype == e.dtype else None


# The rules of each operator, tried in order; the first that fires restarts the list.
RULES: dict[str, list[Rule]] = {
    "+": [_fold, _normal_form],
    "-": [_fold, _normal_form, _float_unit],
    "*": [_fold, _normal_form, _float_unit],
    "/": [_fold, _float_unit],
    "//": [_fold, _div_exact, _div_symbolic_factor, _div_small, _div_common_factor, _div_split,
           _div_coarse, _div_div, _mod_div],
    "%": [_fold, _div_exact, _div_symbolic_factor, _mod_small, _mod_split, _mod_coarse,
          _mod_mod],
    "min": [_fold, _same_operands, _minmax_by_range],
    "max": [_fold, _same_operands, _minmax_by_range],
    **{op: [_fold, _compare_by_range] for op in TRUE_SIGNS},
    "==": [_fold, _compare_by_range, _equal_polynomials],
    "!=": [_fold, _compare_by_range, _equal_polynomials],
    "and": [_fold, _logic_const, _same_operands],
    "or": [_fold, _logic_const, _same_operands],
    **{op: [_fold] for op in ("&", "|", "^", "<<", ">>")},
    "neg": [_fold, _normal_form, _involution],
    "not": [_fold, _involution, _not_compare],
    "~": [_fold, _involution],
    "select": [_fold, _select_const, _select_equal_at_case],
    "cast": [_fold, _cast_noop],
}

# Which entry of RULES a node uses; leaves, loads, calls and broadcasts have none.
RULE_KEY: dict[type, Callable[[Expr], str | None]] = {
    Binary: lambda e: e.op, Unary: lambda e: e.op,
    Select: lambda e: "select", Cast: lambda e: "cast",
    Var: lambda e: None, Const: lambda e: None, Load: lambda e: None,
    Call: lambda e: None, Broadcast: lambda e: None,
}


def _rules(e: Expr) -> list[Rule]:
    if type(e) not in RULE_KEY:
        raise TypeError(f"simplifier: expression node {type(e).__name__} has no entry in RULE_KEY")
    key = RULE_KEY[type(e)](e)
    if key is not None and key not in RULES:
        raise KeyError(f"simplifier: op {key!r} has no entry in RULES")
    return RULES[key] if key is not None else []


def _apply(e: Expr, ranges: Ranges) -> Expr:
    """Rewrites e, whose operands are already simple, until none of its rules fires."""
    while True:
        for rule in _rules(e):
            new = rule(e, ranges)
            # A rewrite keeps the node's type: `x * 1` is int64 for x int32 and 1 int64.
            if new is not None and new != e and new.dtype == e.dtype:
                e = new
                break
        else:
            return e


def simplify_expr(expr: Expr, ranges: Ranges | None = None) -> Expr:
    """expr simplified, knowing that each variable in ``ranges`` lies in its interval."""
    ranges = ranges or {}
    return rewrite(expr, lambda node: _apply(node, ranges))
