"""Tabulating a compute over constants with numpy: the same elements as the kernels compute,
C's integer division included."""
import numpy as np
import pytest

from treadle.ir.compute import compute, reduce
from treadle.ir.dtypes import bfloat16, bfloat16_bits, bfloat16_values, float32, int64
from treadle.ir.expr import Buffer, call, cast, minimum
from treadle.ir.tabulate import tabulable, tabulate
from treadle.runtime.interpret import interpret
from treadle.schedule.rules import schedule_computes


def test_index_arithmetic_matches_the_interpreted_kernel():
    w = Buffer("w", float32, (5, 7))
    # Panels of 3 columns, the last repeated past the edge, as the GEMM template lays out.
    c = compute("panels", [3, 5, 3], lambda q, k, r: w[k, minimum(q * 3 + r, 6)] * 2.0)
    wv = np.arange(35, dtype=np.float32).reshape(5, 7)
    expected = np.full((3, 5, 3), np.nan, np.float32)
    interpret(schedule_computes("panels", [w], [c]).function, wv, expected)
    np.testing.assert_array_equal(tabulate(c, {w: wv}), expected)


def test_integer_division_truncates_toward_zero():
    values = Buffer("v", int64, (4,))
    c = compute("d", [4, 2], lambda i, j: cast(values[i] // (j * 2 - 3), int64) * 10
                + values[i] % (j * 2 - 3))
    v = np.array([-7, -1, 5, 8], np.int64)
    expected = np.zeros((4, 2), np.int64)
    interpret(schedule_computes("d", [values], [c]).function, v, expected)
    np.testing.assert_array_equal(tabulate(c, {values: v}), expected)


def test_bfloat16_casts_convert_values_not_bits():
    """bfloat16 is held as its bits: a cast to float32 reads them as the value they encode
    (0.5, not 16128), and one back rounds to nearest even (the conversions themselves are
    tested with the dtypes); NaN and infinities kept. A constant bfloat16 weight is laid
    out through such casts."""
    values = np.array([0.5, -3.25, 1e-3, 1.5e38, np.inf, -np.inf, 1 + 2 ** -8,
                       1 + 3 * 2 ** -8, -7.1e-39, np.nan], np.float32)
    bits = bfloat16_bits(values)
    w = Buffer("w", bfloat16, (10,))
    widened = compute("wide", [10], lambda i: cast(w[9 - i], float32) * 2.0)
    np.testing.assert_array_equal(tabulate(widened, {w: bits}), bfloat16_values(bits)[::-1] * 2)
    narrowed = compute("narrow", [10], lambda i: cast(cast(w[i], float32) * 2.0, bfloat16))
    np.testing.assert_array_equal(tabulate(narrowed, {w: bits}),
                                  bfloat16_bits(bfloat16_values(bits) * 2))


def test_refuses_what_it_cannot_evaluate():
    x = Buffer("x", float32, (4,))
    with pytest.raises(TypeError, match="reduction"):
        tabulate(reduce("s", [1], [4], lambda i, r: x[r]), {x: np.zeros(4, np.float32)})
    e = compute("exp", [4], lambda i: call("exp", x[i]))
    assert not tabulable(e.value) and tabulable(compute("c", [4], lambda i: x[3 - i]).value)
    with pytest.raises(TypeError, match="cannot tabulate"):
        tabulate(e, {x: np.zeros(4, np.float32)})
