"""The numpy evaluator of IR expressions and compute definitions, against numpy and Python
references: float32 stays float32, integer division and casts follow C."""
import math

import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle.errors import KernelError, ShapeError
from treadle.ir.compute import compute, reduce
from treadle.ir.dtypes import boolean, float32, int8, int32, int64
from treadle.ir.evaluate import evaluate_computes, evaluate_expr, work
from treadle.ir.expr import Buffer, Var, call, cast, const, maximum, select

X = Var("x", float32)
Y = Var("y", float32)
I = Var("i", int64)
J = Var("j", int64)


def test_float32_arithmetic_stays_float32():
    xs, ys = random_array((50,), seed=1), random_array((50,), seed=2, low=0.5, high=2.0)
    for x, y in zip(xs, ys):
        got = evaluate_expr((X * Y + X) / Y - maximum(X, Y), {X: x, Y: y})
        assert got.dtype == np.float32
        # numpy float32 scalars round each step to float32, as C's float arithmetic does.
        assert got == (x * y + x) / y - np.maximum(x, y)


@pytest.mark.parametrize("a", [-17, -7, -1, 0, 1, 6, 7, 23])
@pytest.mark.parametrize("b", [-7, -3, 1, 2, 5])
def test_integer_division_and_remainder_follow_c(a, b):
    env = {I: np.int64(a), J: np.int64(b)}
    # C: the quotient truncates toward zero and the remainder takes the dividend's sign.
    assert evaluate_expr(I // J, env) == int(a / b)
    assert evaluate_expr(I % J, env) == math.fmod(a, b)


def test_integer_division_by_zero_raises():
    with pytest.raises(KernelError, match="division by zero"):
        evaluate_expr(I // J, {I: np.int64(3), J: np.int64(0)})


def test_select_evaluates_only_the_chosen_side():
    a = Buffer("a", float32, [5])
    data = random_array((5,), seed=3)
    picked = select(I < 5, a[I], 0.0)  # a[5] is out of range, only read when i < 5
    for i in range(7):
        got = evaluate_expr(picked, {a: data, I: np.int64(i)})
        assert got.dtype == np.float32
        assert got == (data[i] if i < 5 else 0.0)
    with pytest.raises(ShapeError, match="out of bounds"):
        evaluate_expr(a[I], {a: data, I: np.int64(5)})


@pytest.mark.parametrize("value, dtype, expected", [
    (-2.7, int32, -2), (2.7, int32, 2), (300, int8, 44), (-129, int8, 127),
    (0.0, boolean, False), (-0.5, boolean, True), (3, float32, 3.0)])
def test_casts_convert_as_c(value, dtype, expected):
    source = float32 if isinstance(value, float) else int64
    got = evaluate_expr(cast(const(value, source), dtype), {})
    assert got.dtype == dtype.numpy and got == expected


@pytest.mark.parametrize("func, reference", [("exp", np.exp), ("tanh", np.tanh),
                                             ("sqrt", np.sqrt), ("erf", math.erf)])
def test_calls_match_numpy_in_float32(func, reference):
    for x in random_array((13,), seed=4, low=0.0, high=3.0):
        got = evaluate_expr(call(func, X), {X: x})
        assert_close(got, np.float32(reference(np.float64(x))))


def test_a_float_sum_accumulates_in_float32():
    a = Buffer("a", float32, [7, 61])
    data = random_array((7, 61), seed=5)
    total = reduce("total", [7], [61], lambda i, r: a[i, r] * 2.0)
    got, = evaluate_computes([total], {a: data}, limit=7 * 61)
    assert_close(got, (data.astype(np.float64) * 2).sum(1).astype(np.float32), reduction=61)


def test_a_max_over_nothing_is_its_identity():
    a = Buffer("a", int32, [3, 0])
    top = reduce("top", [3], [0], lambda i, r: a[i, r], "max")
    got, = evaluate_computes([top], {a: np.zeros((3, 0), np.int32)}, limit=100)
    np.testing.assert_array_equal(got, np.full(3, np.iinfo(np.int32).min, np.int32))


def test_computes_read_are_evaluated_first():
    a = Buffer("a", float32, [13, 7])
    data = random_array((13, 7), seed=6)
    row_max = reduce("row_max", [13], [7], lambda i, r: a[i, r], "max")
    shifted = compute("shifted", [13, 7], lambda i, j: call("exp", a[i, j] - row_max[i]))
    got, = evaluate_computes([shifted], {a: data}, limit=work([shifted]))
    assert work([shifted]) == 13 * 7 + 13 * 7
    assert_close(got, np.exp(data - data.max(1, keepdims=True)))


def test_gives_up_beyond_the_limit_or_on_symbolic_sizes():
    a = Buffer("a", float32, [4, 5])
    doubled = compute("doubled", [4, 5], lambda i, j: a[i, j] * 2.0)
    assert evaluate_computes([doubled], {a: random_array((4, 5))}, limit=19) is None
    n = Var("n", int64)
    b = Buffer("b", float32, [n])
    assert work([compute("copy", [n], lambda i: b[i])]) is None
