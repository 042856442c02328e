"""Rule-based schedules: loop structure of reductions, checked without a C compiler, and
their meaning through the IR interpreter."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from treadle.ir import dtypes
from treadle.ir.compute import compute, reduce
from treadle.ir.expr import Binary, Buffer, Call, Load, Var, call
from treadle.ir.functor import walk
from treadle.ir.stmt import Accumulate, For, Store
from treadle.ir.verify import verify
from treadle.runtime.interpret import interpret
from treadle.schedule.rules import schedule_computes


def _row_reduce(op: str, cols, dtype="float32"):
    m = Var("M")
    x = Buffer("x", dtypes.dtype_of(dtype), (m, cols))
    out = reduce("r", [m], [cols], lambda i, k: x[i, k], op)
    return x, schedule_computes("row", [x], [out]).function


def _reduce_loop(func) -> For:
    (loop,) = [n for n in walk(func.body) if isinstance(n, For)
               and any(isinstance(a, Accumulate) for a in walk(n.body))
               and not any(isinstance(s, For) for s in walk(n.body))]
    return loop


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_float_reduction_accumulates_in_a_vectorize_loop(op):
    _, func = _row_reduce(op, Var("K"))
    verify(func)
    assert _reduce_loop(func).kind == "vectorize"
    assert f"{'+=' if op == 'sum' else op + '='} x0[" in str(func)
    # The output is stored once per row, from the accumulator, and never read back.
    assert all(s.value.dtype.lanes == 1 for s in walk(func.body) if isinstance(s, Store))


@pytest.mark.parametrize("cols, dtype, kind", [
    (3, "float32", "serial"), (8, "float32", "vectorize"), (Var("K"), "int32", "serial")])
def test_short_or_integer_reductions_stay_serial(cols, dtype, kind):
    _, func = _row_reduce("sum", cols, dtype)
    assert _reduce_loop(func).kind == kind


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_vector_reduction_means_the_sequential_one(op):
    _, func = _row_reduce(op, Var("K"))
    x = np.random.default_rng(0).standard_normal((3, 13)).astype(np.float32)
    y = np.empty(3, np.float32)
    interpret(func, x, y)
    expected = getattr(x.astype(np.float64), op)(axis=1)
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)


def test_softmax_rows_share_one_parallel_loop_with_row_values_hoisted():
    n, k = Var("N"), Var("K")
    x = Buffer("x", dtypes.float32, (n, k))
    high = reduce("max", [n, 1], [k], lambda i, _, r: x[i, r], "max")
    total = reduce("sum", [n, 1], [k], lambda i, _, r: call("exp", x[i, r] - high[i, 0]))
    out = compute("softmax", [n, k], lambda i, j: call("exp", x[i, j] - high[i, 0]) / total[i, 0])
    func = schedule_computes("softmax", [x], [out]).function
    verify(func)
    assert [n.kind for n in walk(func.body) if isinstance(n, For)].count("parallel") == 1
    # Inside the loops along a row, the row's maximum and sum are variables, not loads.
    inner = [n for n in walk(func.body) if isinstance(n, For) and n.kind != "parallel"]
    assert not any(isinstance(e, Load) and e.buffer.name.startswith("w")
                   for loop in inner for e in walk(loop.body))
    xs = np.random.default_rng(1).standard_normal((4, 9)).astype(np.float32)
    y = np.empty_like(xs)
    interpret(func, xs, y, np.empty((4, 1), np.float32), np.empty((4, 1), np.float32))
    e = np.exp(xs - xs.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-6, atol=1e-7)


def _shared_row_value(value):
    """max, ``value`` of the row-shifted input (an injective compute), its row sum, and
    ``value`` over the sum: the shape of softmax."""
    n, k = Var("N"), Var("K")
    x = Buffer("x", dtypes.float32, (n, k))
    high = reduce("max", [n, 1], [k], lambda i, _, r: x[i, r], "max")
    shared = compute("e", [n, k], lambda i, j: value(x[i, j] - high[i, 0]))
    total = reduce("sum", [n, 1], [k], lambda i, _, r: shared[i, r])
    out = compute("out", [n, k], lambda i, j: shared[i, j] / total[i, 0])
    return schedule_computes("softmax", [x], [out])


@pytest.mark.parametrize("rows, cols", [(4, 9), (3, 1), (7, 131)])
def test_costly_value_read_by_the_sum_and_the_output_is_computed_once(rows, cols):
    kernel = _shared_row_value(lambda v: call("exp", v))
    func = kernel.function
    verify(func)
    # exp once per element, in the same parallel loop over rows, into the output itself:
    # each element is divided by the sum in place, so no workspace of the output's size.
    assert sum(isinstance(n, Call) and n.func == "exp" for n in walk(func.body)) == 1
    assert [str(w.shape[1]) for w in kernel.workspaces] == ["1", "1"]  # maximum, sum
    assert [n.kind for n in walk(func.body) if isinstance(n, For)].count("parallel") == 1
    out = func.params[1]
    stores = [n for n in walk(func.body) if isinstance(n, Store) and n.buffer == out]
    assert len(stores) == 2  # the exponentials, then the quotients
    xs = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32)
    y = np.empty_like(xs)
    interpret(func, xs, y, np.empty((rows, 1), np.float32), np.empty((rows, 1), np.float32))
    e = np.exp(xs - xs.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-6, atol=1e-7)


def test_cheap_value_read_twice_is_inlined_into_both():
    kernel = _shared_row_value(lambda v: v * 2.0)
    assert len(kernel.workspaces) == 2  # the maximum and the sum only
    # The input is read by the maximum, the sum and the output (x * 2 inlined into both).
    x = kernel.function.params[0]
    assert sum(isinstance(n, Load) and n.buffer == x for n in walk(kernel.function.body)) == 3


def _rows(func) -> str:
    (rows,) = [n for n in walk(func.body) if isinstance(n, For) and n.kind == "parallel"]
    return rows.var.name


@pytest.mark.parametrize("shape", [(2, 5, 7, 3), (1, 13, 1, 17), (3, Var("H"), 11, 6)])
def test_a_transposition_walks_its_rows_with_the_input_contiguous_axis_fastest(shape):
    """N x H x W x C returned as N x C x H x W: the channel, the input's contiguous axis,
    is the fastest of the row coordinates (the row index modulo C), so consecutive rows
    read the same cache lines; a per-channel bias, constant along the row, keeps the
    computes' order. Both mean what numpy's transpose does, through the interpreter."""
    n, h, w, c = shape
    x = Buffer("x", dtypes.float32, (n, h, w, c))
    bias = Buffer("b", dtypes.float32, (c,))
    out = compute("t", [n, c, h, w], lambda i, j, k, m: x[i, k, m, j] + bias[j])
    func = schedule_computes("to_nchw", [x, bias], [out]).function
    verify(func)
    assert f"{_rows(func)} % {c}" in str(func)
    plain = compute("p", [n, c, h, w], lambda i, j, k, m: bias[j] * 2.0)
    kept = schedule_computes("bias", [bias], [plain]).function
    assert f"{_rows(kept)} % {c}" not in str(kept)
    sizes = [7 if isinstance(d, Var) else d for d in shape]
    xs = np.random.default_rng(1).standard_normal(sizes).astype(np.float32)
    bs = np.arange(c, dtype=np.float32)
    y = np.empty([sizes[0], c, sizes[1], sizes[2]], np.float32)
    interpret(func, xs, bs, y)
    np.testing.assert_array_equal(y, xs.transpose(0, 3, 1, 2) + bs[:, None, None])


def _instance_norm(shape):
    """A channels-last instance norm of one image, as the operator defines it."""
    _, h, w, c = shape
    x = Buffer("x", dtypes.float32, shape)
    scale = Buffer("g", dtypes.float32, (c,))
    count = h * w
    total = reduce("sum", [1, 1, 1, c], [h, w], lambda n, a, b, j, p, q: x[n, p, q, j])
    spread = reduce("var", [1, 1, 1, c], [h, w], lambda n, a, b, j, p, q: (
        x[n, p, q, j] - total[0, 0, 0, j] / count) * (x[n, p, q, j] - total[0, 0, 0, j] / count))
    out = compute("y", shape, lambda n, p, q, j: (x[n, p, q, j] - total[0, 0, 0, j] / count)
                  * (1.0 / call("sqrt", spread[0, 0, 0, j] / count + 1e-5)) * scale[j])
    return schedule_computes("instance_norm", [x, scale], [out])


@pytest.mark.parametrize("shape", [(1, 7, 5, 3), (1, 13, 1, 17), (1, 0, 4, 2),
                                   (1, Var("H"), 6, 16)])
def test_a_value_constant_down_the_columns_is_computed_once_per_column(shape):
    """The mean and the reciprocal square root of each channel's variance are computed
    into workspaces before the loop over pixels, whose elements then only subtract and
    multiply; the result is numpy's."""
    kernel = _instance_norm(shape)
    func = kernel.function
    verify(func)
    *_, rows = [n for n in walk(func.body) if isinstance(n, For) and n.kind == "parallel"]
    assert not any(isinstance(n, Call) or isinstance(n, Binary) and n.op == "/"
                   and n.dtype.is_float for n in walk(rows))
    c = shape[-1]
    assert [[str(d) for d in w.shape] for w in kernel.workspaces][-2:] == [[str(c)]] * 2
    sizes = [7 if isinstance(d, Var) else d for d in shape]
    rng = np.random.default_rng(sizes[1])
    xs = rng.standard_normal(sizes).astype(np.float32) * 3 + 1
    gs = rng.standard_normal(c).astype(np.float32)
    y = np.empty_like(xs)
    interpret(func, xs, gs, y, *(np.empty([int(str(d)) for d in w.shape], np.float32)
                                 for w in kernel.workspaces))
    x64 = xs.astype(np.float64)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an empty image's mean
        mean = x64.mean(axis=(1, 2), keepdims=True)
        var = ((x64 - mean) ** 2).mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(y, (x64 - mean) / np.sqrt(var + 1e-5) * gs, rtol=1e-4, atol=1e-4)


def test_a_value_of_each_row_stays_in_the_loop_over_rows():
    """A reciprocal of each row's sum varies down the columns: nothing is hoisted."""
    n, k = Var("N"), Var("K")
    x = Buffer("x", dtypes.float32, (n, k))
    total = reduce("sum", [n, 1], [k], lambda i, _, r: x[i, r])
    out = compute("out", [n, k], lambda i, j: x[i, j] * (1.0 / total[i, 0]))
    kernel = schedule_computes("normalise", [x], [out])
    assert len(kernel.workspaces) == 1


@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("shape, sizes", [
    ((1, 61, 37, 16), [(61,)]),  # 36 112 elements: split along the 61 rows
    ((1, Var("H"), 3, 5), [(0,), (1,), (7,), (97,)]),  # unknown: always split
    ((1, 2, 3, 5), [(2,)]),  # too small to split
])
def test_a_single_row_column_reduction_splits_among_threads(op, shape, sizes):
    """A global pooling of one channels-last image: parallel parts along its first long
    axis into rows of partial results, combined after, where it reads enough to pay for
    the threads; numpy's result at every size."""
    _, h, w, c = shape
    x = Buffer("x", dtypes.float32, shape)
    pooled = reduce("pool", [1, 1, 1, c], [h, w], lambda n, a, b, j, p, q: x[n, p, q, j], op)
    kernel = schedule_computes("pool", [x], [pooled])
    verify(kernel.function)
    parallel = [n for n in walk(kernel.function.body) if isinstance(n, For)
                and n.kind == "parallel"]
    assert len(parallel) == (0 if shape[1] == 2 else 1)
    for (rows,) in sizes:
        xs = np.random.default_rng(rows).standard_normal((1, rows, w, c)).astype(np.float32)
        y = np.empty((1, 1, 1, c), np.float32)
        workspaces = [np.empty([int(str(d)) for d in b.shape], np.float32)
                      for b in kernel.workspaces]
        interpret(kernel.function, xs, y, *workspaces)
        expected = getattr(np, op)(xs.astype(np.float64), axis=(1, 2), keepdims=True,
                                   initial=0.0 if op == "sum" else -np.inf)
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
