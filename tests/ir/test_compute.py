"""Compute definitions: the shape, dtype, axes and reduction a definition records, the
reducers' identities against numpy's limits, the producer registry, and copies that read
other tensors. One definition is run through the rule-based schedule against numpy."""
import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle.ir.compute import (REDUCERS, combine, compute, identity_of, producer_of,
                                reachable, reduce, retarget)
from treadle.ir.dtypes import float16, float32, float64, index_type, int8, int32, uint8, uint16
from treadle.ir.expr import Binary, Buffer, Const, Load, Var, call, cast, maximum
from treadle.ir.functor import evaluate
from treadle.runtime.interpret import interpret
from treadle.schedule.rules import schedule_computes

N, K = Var("n"), Var("k")
X = Buffer("x", float32, (N, 7))


def test_compute_records_shape_dtype_axes_and_value():
    relu = compute("relu", [N, 7], lambda i, j: maximum(X[i, j], 0.0))
    assert relu.shape == (N, Const(7, index_type)) and relu.dtype == float32
    assert len(relu.axes) == 2 and all(a.dtype == index_type for a in relu.axes)
    i, j = relu.axes
    assert relu.value == maximum(X[i, j], 0.0)
    assert not relu.is_reduction and relu.reduce_op is None and relu.reduce_axes == ()
    assert relu.name.startswith("relu_") and relu.buffer.scope == "global"
    assert relu[0, 1] == Load(relu.buffer, (0, 1))


def test_each_definition_gets_its_own_buffer_and_axes():
    a = compute("same", [3], lambda i: X[i, 0])
    b = compute("same", [3], lambda i: X[i, 0])
    assert a.buffer != b.buffer and a.name != b.name
    assert set(a.axes).isdisjoint(b.axes)


def test_a_dtype_casts_the_value():
    half = compute("half", [N, 7], lambda i, j: X[i, j] * 2.0, float16)
    i, j = half.axes
    assert half.dtype == float16 and half.value == cast(X[i, j] * 2.0, float16)
    same = compute("same", [5], lambda i: X[i, 0], "float32")
    assert isinstance(same.value, Load)  # no cast to the dtype it already has


def test_reduce_records_its_reduction():
    total = reduce("rowsum", [N], [K, 3], lambda i, r, s: X[i, r] * cast(s, float32), "sum")
    assert total.is_reduction and total.reduce_op == "sum"
    assert total.shape == (N,) and total.reduce_extents == (K, Const(3, index_type))
    assert len(total.axes) == 1 and len(total.reduce_axes) == 2
    (i,), (r, s) = total.axes, total.reduce_axes
    assert total.value == X[i, r] * cast(s, float32)
    assert set(total.axes).isdisjoint(total.reduce_axes)


def test_reduce_dtype_follows_its_value_unless_given():
    assert reduce("m", [N], [7], lambda i, r: X[i, r], "max").dtype == float32
    assert reduce("m", [N], [7], lambda i, r: X[i, r], "max", float64).dtype == float64


def test_an_unknown_reduction_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown reduction 'mean'; known: sum, prod, max, min"):
        reduce("avg", [N], [7], lambda i, r: X[i, r], "mean")


@pytest.mark.parametrize("dtype", [float16, float32, float64, int8, int32, uint8, uint16])
def test_identities_are_numpys_limits(dtype):
    np_type = dtype.numpy.type
    limits = np.finfo(np_type) if dtype.is_float else np.iinfo(np_type)
    low = -np.inf if dtype.is_float else limits.min
    high = np.inf if dtype.is_float else limits.max
    assert identity_of("sum", dtype) == Const(0, dtype)
    assert identity_of("prod", dtype) == Const(1, dtype)
    assert identity_of("max", dtype) == Const(low, dtype)
    assert identity_of("min", dtype) == Const(high, dtype)


def test_combine_builds_the_reducers_operation():
    a, b = Var("a", float32), Var("b", float32)
    assert combine("sum", a, b) == Binary("+", a, b)
    assert combine("prod", a, b) == Binary("*", a, b)
    assert combine("max", a, b) == Binary("max", a, b)
    assert combine("min", a, b) == Binary("min", a, b)
    assert set(REDUCERS) == {"sum", "prod", "max", "min"}


def test_producers_sources_and_reachable_computes():
    """x -> scaled -> total -> normalised: each compute knows the computes it reads."""
    scaled = compute("scaled", [N, 7], lambda i, j: X[i, j] * 2.0)
    total = reduce("total", [N], [7], lambda i, r: scaled[i, r])
    normalised = compute("normalised", [N, 7], lambda i, j: scaled[i, j] / total[i])
    assert producer_of(scaled.buffer) is scaled and producer_of(X) is None
    assert normalised.sources == (scaled, total) and total.sources == (scaled,)
    assert {load.buffer for load in normalised.loads()} == {scaled.buffer, total.buffer}
    found = reachable([normalised])
    assert found == {c.buffer: c for c in (normalised, scaled, total)}
    assert reachable([scaled]) == {scaled.buffer: scaled}


def test_retarget_copies_the_chain_onto_other_inputs():
    scaled = compute("scaled", [N, 7], lambda i, j: X[i, j] * 2.0)
    total = reduce("total", [N], [7], lambda i, r: scaled[i, r] + 1.0, "max")
    other = Buffer("other", float32, (N, 7))
    (copy,) = retarget([total], {X: other})
    assert copy.buffer != total.buffer and copy.reduce_op == "max"
    assert copy.axes == total.axes and copy.reduce_axes == total.reduce_axes
    (source,) = copy.sources
    assert source.buffer != scaled.buffer and producer_of(source.buffer) is source
    assert {load.buffer for load in source.loads()} == {other}
    assert total.sources == (scaled,)  # the original is untouched


def test_retarget_onto_an_expression_substitutes_the_value():
    s = Buffer("s", float32, ())
    shifted = compute("shifted", [N, 7], lambda i, j: X[i, j] - s[()])
    (copy,) = retarget([shifted], {s: Const(0.5, float32)})
    i, j = copy.axes
    assert copy.value == X[i, j] - Const(0.5, float32)


@pytest.mark.parametrize("rows, cols", [(1, 1), (7, 13), (13, 61), (0, 5)])
def test_a_softmax_definition_computes_numpys_softmax(rows, cols):
    """The definitions mean what numpy means: a max and a sum reduction over a symbolic
    row length, read by an element-wise compute."""
    x = Buffer("x", float32, (N, K))
    high = reduce("high", [N], [K], lambda i, r: x[i, r], "max")
    total = reduce("total", [N], [K], lambda i, r: call("exp", x[i, r] - high[i]))
    probs = compute("probs", [N, K], lambda i, j: call("exp", x[i, j] - high[i]) / total[i])
    kernel = schedule_computes("softmax", [x], [probs])
    data = random_array((rows, cols), seed=rows)
    out = np.full((rows, cols), np.nan, np.float32)
    sizes = {N: rows, K: cols}
    workspaces = [np.full([evaluate(d, sizes) for d in w.shape], np.nan, np.float32)
                  for w in kernel.workspaces]
    interpret(kernel.function, data, out, *workspaces)
    e = np.exp(data - data.max(axis=1, keepdims=True)) if rows else data
    assert_close(out, e / e.sum(axis=1, keepdims=True), reduction=cols)
