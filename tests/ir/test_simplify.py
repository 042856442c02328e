"""simplify_expr and bound: the rule tables, the index normal form, range analysis."""
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treadle.ir.dtypes import boolean, float32, int32, int64, uint32
from treadle.ir.expr import (Binary, Const, Var, cast, const, eq, logical_and, maximum, minimum,
                             ne, select)
from treadle.ir.functor import evaluate
from treadle.ir.simplify import Interval, bound, simplify_expr

i, j, k, w, n = (Var(name) for name in "ijkwn")
x, y = Var("x", float32), Var("y", float32)
RANGES = {i: Interval(0, None), j: Interval(0, 7), w: Interval(0, 127), n: Interval(0, None)}


def simplified(expr, ranges=RANGES) -> str:
    return str(simplify_expr(expr, ranges))


@pytest.mark.parametrize("expr, expected", [
    (w // 8 * 8 + w % 8, "w"),
    ((i * 8 + j) // 8, "i"),
    ((i * 8 + j) % 8, "j"),
    (w % 128, "w"),
    (w // 128, "0"),
    (w // 8 % 4 * 8 + w % 8, "w % 32"),
    (w // 32 * 32 + w // 8 % 4 * 8 + w % 8, "w"),
    ((w // 8) // 4, "w // 32"),
    (w % 32 // 8, "w // 8 % 4"),
    (w % 32 % 8, "w % 8"),
    (w % 8 % 8, "w % 8"),
    ((i * 8 + j) // 16, "i // 2"),
    ((i * 4 + 2) // 8, "i // 2"),
    ((i * 16 + j) % 64, "i % 4 * 16 + j"),  # a column of a head, columns split into heads
    ((i * 8 + j + 16) % 32, "(i + 2) % 4 * 8 + j"),
    ((k * 4 + 2) // 8, "(k * 2 + 1) // 4"),  # a common factor goes, whatever the sign
    ((i * 8 + 16) // 8, "i + 2"),
    ((i * 8 + j + 8) % 8, "j"),
    ((i * 6) // 6, "i"),
    ((k * 8) // 8, "k"),  # exact division needs no sign
    ((k * 8 + 3) % 8 * 0, "0"),
    ((j * 2 + 2) % 8 % 4, "(j + 1) % 2 * 2"),  # the digit a rule builds is simplified too
    ((i * 2 + 1) % 16 // 4, "i // 2 % 4"),
])
def test_index_algebra(expr, expected):
    assert simplified(expr) == expected
    assert simplified(simplify_expr(expr, RANGES)) == expected  # idempotent


@pytest.mark.parametrize("expr, expected", [
    (4 + i, "i + 4"),
    (i + 4 - 8, "i - 4"),
    (8 * i + 4 + j, "i * 8 + j + 4"),
    ((i + 1) * 8, "i * 8 + 8"),
    (i - i, "0"),
    (i + 0, "i"),
    (i * 1, "i"),
    (i * 0, "0"),
    (3 - i, "3 - i"),
    (j - i * 2, "j - i * 2"),
    (0 - i, "-i"),
    (i * 2 * 3, "i * 6"),
    ((i * 2) * (j * 3), "i * j * 6"),
    (-(-i), "i"),
])
def test_sums_are_normalised_with_the_constant_last(expr, expected):
    assert simplified(expr) == expected


@pytest.mark.parametrize("expr, expected", [
    (const(7) // 2, "3"),
    (const(-7) // 2, "-3"),  # C: rounds toward zero
    (const(-7) % 2, "-1"),  # C: the dividend's sign
    (const(7) // 0, "7 // 0"),
    (const(7) % 0, "7 % 0"),
    (minimum(3, 5) + maximum(3, 5), "8"),
    (cast(const(3.7, float32), int32), "3"),
    (cast(const(300), "int8"), "int8(300)"),  # would overflow: left alone
    (const(2, uint32) - const(3, uint32), "2 - 3"),  # would wrap: left alone
    (const(1.5, float32) * 2.0, "3.0"),
    (~const(True, "bool"), "False"),
    (const(0.1, float32) * 3.0, "0.30000001192092896"),  # float32 arithmetic, as in C
])
def test_constant_folding_follows_c(expr, expected):
    assert simplified(expr, {}) == expected


def test_division_rules_need_a_non_negative_dividend():
    signed = {k: Interval(-1, 3), j: Interval(0, 7)}
    assert simplified((k * 8 + j) // 8, signed) == "(k * 8 + j) // 8"
    assert simplified((k * 8 + j) % 8, signed) == "(k * 8 + j) % 8"
    assert simplified(k % 8, signed) == "k"  # |k| < 8: the remainder is k for either sign
    assert simplified((k * 8 + j) // 8, {**signed, k: Interval(0, 3)}) == "k"


@pytest.mark.parametrize("expr, expected", [
    (j < 8, "True"),
    (j >= 8, "False"),
    (i < i + 1, "True"),
    (eq(j, 9), "False"),
    (j < 4, "j < 4"),
    (i < n, "i < n"),
    (~(i < n), "i >= n"),
    (minimum(j, 8), "j"),
    (maximum(j, 8), "8"),
    (minimum(i, i + 2), "i"),
    (minimum(i, n), "min(i, n)"),
    (select(j < 8, i, n), "i"),
    (select(i < n, j, j), "j"),
    (logical_and(j < 8, i < n), "i < n"),
    (logical_and(j > 8, i < n), "False"),
    (Binary("or", j < 8, i < n), "True"),
    (~~(i < n), "i < n"),
    # a broadcast of two symbolic sizes, one of which may be 1: both branches agree at 1
    (select(eq(n, 1), minimum(n, 512), n), "n"),
    (select(eq(1, n), n * n, n), "n"),
    (select(eq(n, 2), minimum(n, 512), n), "n"),
    (select(eq(n, 1), minimum(n, 0), n), "select(n == 1, 0, n)"),
])
def test_conditions_decided_by_ranges(expr, expected):
    assert simplified(expr) == expected


@pytest.mark.parametrize("expr, expected", [
    (x * 1.0, "x"),
    (1.0 * x, "x"),
    (x / 1.0, "x"),
    (x - 0.0, "x"),
    (x + 0.0, "x + 0.0"),  # -0.0 + 0.0 is +0.0
    (x - (-0.0), "x - -0.0"),
    (x * 0.0, "x * 0.0"),  # NaN * 0 is NaN
    (x - x, "x - x"),
    ((x + 1.0) + 2.0, "x + 1.0 + 2.0"),  # float addition does not associate
    (x + (y + 1.0), "x + (y + 1.0)"),
    (2.0 * x, "2.0 * x"),
])
def test_float_arithmetic_is_not_reordered(expr, expected):
    assert simplified(expr) == expected


def test_rewrites_keep_the_type():
    small = Var("s", int32)
    widened = Binary("+", small, Const(0, int64))  # int64, while `small` is int32
    assert simplify_expr(widened).dtype == int64


@pytest.mark.parametrize("expr, expected", [
    (w * 2 + 1, Interval(1, 255)),
    (j - w, Interval(-127, 7)),
    (i * 8 + j, Interval(0, None)),
    (k + 1, Interval(None, None)),
    (w // 8, Interval(0, 15)),
    ((j - 7) // 2, Interval(-3, 0)),  # toward zero
    ((j - 7) % 4, Interval(-3, 0)),  # the dividend's sign
    (w % 8, Interval(0, 7)),
    (i % 8, Interval(0, 7)),
    (minimum(w, 50), Interval(0, 50)),
    (select(i < n, j, w), Interval(0, 127)),
    (-j, Interval(-7, 0)),
    (cast(j, int32), Interval(0, 7)),
    (x * 2.0, Interval()),
])
def test_bound(expr, expected):
    assert bound(expr, RANGES) == expected


# ---- equivalence on random index expressions -----------------------------------------------

VARS = (Var("a"), Var("b"), Var("c"))


@st.composite
def index_expr(draw, depth=3):
    if depth == 0 or draw(st.integers(0, 4)) == 0:
        return draw(st.sampled_from(VARS) | st.integers(-3, 9).map(const))
    op = draw(st.sampled_from(["+", "-", "*", "//", "%", "min", "max", "sum"]))
    a = draw(index_expr(depth - 1))
    if op in ("//", "%"):
        return Binary(op, a, const(draw(st.sampled_from([1, 2, 3, 4, 8, 16]))))
    if op == "sum":  # index-like: a * c1 + b * c2 + c3
        b = draw(index_expr(depth - 1))
        c1, c2 = draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from([1, 2, 4, 8, -1]))
        return a * c1 + b * c2 + draw(st.integers(-4, 9))
    return Binary(op, a, draw(index_expr(depth - 1)))


ranges_strategy = st.tuples(*[st.tuples(st.sampled_from([0, 0, 0, -3, 2]), st.integers(0, 9))
                              for _ in VARS]).map(
    lambda ends: {v: Interval(lo, lo + size) for v, (lo, size) in zip(VARS, ends)})


@settings(max_examples=300, deadline=None)
@given(index_expr(), ranges_strategy)
def test_simplified_index_expressions_keep_their_value(expr, ranges):
    result = simplify_expr(expr, ranges)
    assert simplify_expr(result, ranges) == result, "simplification is not idempotent"
    interval = bound(expr, ranges)
    for values in itertools.product(*(range(r.lo, r.hi + 1) for r in ranges.values())):
        env = dict(zip(ranges, values))
        expected = evaluate(expr, env)
        assert evaluate(result, env) == expected, f"{expr} -> {result} at {env}"
        assert (interval.lo is None or interval.lo <= expected) and \
               (interval.hi is None or expected <= interval.hi), f"bound {interval} of {expr}"


def test_symbolic_factor_cancels_wherever_division_is_defined():
    seq = Var("seq")
    clamped = minimum(seq, 512)
    assert simplify_expr(clamped * 768 // clamped) == Const(768, int64)
    assert simplify_expr(clamped * 768 % clamped) == Const(0, int64)
    assert str(simplify_expr(seq * 2 * seq // seq)) == "seq * 2"
    assert str(simplify_expr((seq + 1) // seq)) == "(seq + 1) // seq"


def test_a_symbolic_monomial_divides_out_of_every_term():
    """An exporter's batch recovered from an element count divided by the other sizes
    (DeBERTa's attention): left as a division, the broadcast sizes built on it nest
    selects that double with every layer."""
    batch, seq = Var("batch"), Var("seq")
    assert simplify_expr(batch * seq * seq * 4 // (seq * seq * 4)) == batch
    assert simplify_expr(batch * seq * seq * 4 % (seq * 4 * seq)) == Const(0, int64)
    assert str(simplify_expr((batch * seq * 8 - seq * 4) // (seq * 4))) == "batch * 2 - 1"
    assert simplify_expr(select(eq(batch, 1), batch * seq * 4 // (seq * 4), batch)) == batch
    # a factor missing from a term, or a coefficient that does not divide, stays
    assert "//" in str(simplify_expr((batch * seq + batch) // seq))
    assert "//" in str(simplify_expr(batch * seq * 6 // (seq * 4)))


def test_digits_of_a_symbolic_divisor_merge_back():
    """x // n * n + x % n is x wherever n != 0, in either order of the product and under
    a common factor: a flat row split by a run-time size and put back together (a
    softmax's statistics over [heads, seq] rows) must not cost two divisions a row."""
    i, seq = Var("i"), Var("seq")
    assert simplify_expr(i // seq * seq + i % seq) == i
    assert str(simplify_expr(seq * (i // seq) + i % seq + 3)) == "i + 3"
    assert str(simplify_expr(i // seq * seq * 4 + i % seq * 4)) == "i * 4"
    for values in itertools.product(range(-7, 8), range(1, 6)):
        env = dict(zip((i, seq), values))
        assert evaluate(simplify_expr(i // seq * seq * 2 + i % seq * 2 - 1), env) == \
            evaluate(i // seq * seq * 2 + i % seq * 2 - 1, env)
    # unequal coefficients are not one number's digits
    assert "%" in str(simplify_expr(i // seq * seq * 2 + i % seq))


def test_equal_polynomials_decide_equality():
    """Two sides that expand to one polynomial are equal (a reshape's element counts over
    sizes a pooling halved); sides that differ, or are equal only for some values, stay."""
    h, w = Var("h"), Var("w")
    x, y = (h - 2) // 2, (w - 2) // 2
    assert simplify_expr(eq((x * 2 + 2) * (y + 1) * 512, (x * 2 + 2) * (y * 2 + 2) * 256)) \
        == Const(True, boolean)
    assert simplify_expr(ne((x + 1) * (x - 1), x * x - 1)) == Const(False, boolean)
    for unequal in (eq((x + 1) * 512, (x * 2 + 2) * 255), eq(x + 1, (x - 1) // 2 * 2 + 2)):
        assert not isinstance(simplify_expr(unequal), Const)
