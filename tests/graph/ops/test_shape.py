"""Shape and constant operators: symbolic values at compile time, numbers at run time."""
from __future__ import annotations

import numpy as np
import pytest

from tests.graph.ops.test_transform import Case, In, check, i64
from tests.harness import random_array, run_graph
from treadle.compiler import compile_graph
from treadle.errors import ShapeError, UnsupportedOpError
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.ops.shape import MAX_CONSTANT_ELEMENTS, constant_value
from treadle.graph.tensor import Tensor, constant, symbol
from treadle.ir.functor import evaluate

batch, seq = symbol("batch"), symbol("seq")


def test_shape_and_size_are_symbolic_and_computed():
    x = Tensor("x", "float32", ["batch", "seq", 7])
    attrs = [{}, {"start": 1}, {"end": -1}, {"start": -2, "end": 10}, {"start": 2, "end": 1}]
    shapes = [apply("Shape", [x], a)[0] for a in attrs]
    size, = apply("Size", [x])
    assert [s.value for s in shapes] == [(batch, seq, 7), (seq, 7), (batch, seq), (seq, 7), ()]
    assert size.value == (batch * seq * 7,) and size.shape == ()
    executable = compile_graph(Graph.from_outputs([x], shapes + [size]))
    for n in (1, 13):
        a = random_array((3, n, 7))
        *computed, computed_size = executable(a)
        expected = [a.shape, a.shape[1:], a.shape[:-1], a.shape[1:], ()]
        for got, want in zip(computed, expected):
            np.testing.assert_array_equal(got, np.array(want, np.int64).reshape(-1))
            assert got.dtype == np.int64
        assert computed_size == a.size and computed_size.shape == ()


def test_shape_arithmetic_gives_symbolic_reshape_targets():
    # x.view(*x.shape[:-1], 12, 64) and x.view(b, s * 12, 64), as exporters write them
    x = Tensor("x", "float32", ["batch", "seq", 768])
    shape, = apply("Shape", [x])
    leading, = apply("Slice", [shape, constant(i64(0)), constant(i64(-1))])
    target, = apply("Concat", [leading, constant(i64(12, 64))], {"axis": 0})
    heads, = apply("Reshape", [x, target])
    s, = apply("Gather", [shape, constant(i64(1))])
    s12, = apply("Mul", [s, constant(i64(12))])
    b, = apply("Slice", [shape, constant(i64(0)), constant(i64(1))])
    target2, = apply("Concat", [b, s12, constant(i64(64))], {"axis": 0})
    rows, = apply("Reshape", [x, target2])
    assert target.value == (batch, seq, 12, 64)
    assert s12.value == (seq * 12,)
    assert rows.shape == (batch, seq * 12, 64)
    executable = compile_graph(Graph.from_outputs([x], [heads, rows]))
    for n in (1, 5):
        a = random_array((2, n, 768))
        out_heads, out_rows = executable(a)
        np.testing.assert_array_equal(out_heads, a.reshape(2, n, 12, 64))
        np.testing.assert_array_equal(out_rows, a.reshape(2, n * 12, 64))


def test_bool_values_flow_into_shapes():
    # Where(Equal(...), Shape(x), ...) -> Expand, as exporters write masks' target shapes
    x = Tensor("x", "float32", [3, "seq"])
    ones = Tensor("ones", "float32", [1, 1])
    shape, = apply("Shape", [x])
    chosen, = apply("Equal", [constant(i64(0, 5)), constant(i64(1, 5))])
    target, = apply("Where", [chosen, shape, constant(i64(3, 9))])
    y, = apply("Expand", [ones, target])
    assert chosen.value == (False, True)
    assert target.value == (3, seq) and y.shape == (3, seq)
    executable = compile_graph(Graph.from_outputs([x, ones], [y]))
    out, = executable(random_array((3, 6)), np.full((1, 1), 2.0, np.float32))
    np.testing.assert_array_equal(out, np.full((3, 6), 2.0, np.float32))


def test_constant_attributes():
    from onnx import numpy_helper
    table = np.arange(6, dtype=np.int32).reshape(2, 3)
    cases = {
        "value": np.array([[1.5, -2.0]], np.float32),
        "value_float": 0.25,
        "value_floats": [1.0, 2.5, -3.0],
        "value_int": -7,
        "value_ints": [3, 1, 4, 1, 5],
    }
    outputs = [apply("Constant", [], {k: v})[0] for k, v in cases.items()]
    from_proto, = apply("Constant", [], {"value": numpy_helper.from_array(table)})
    assert outputs[3].value == (-7,) and outputs[4].value == (3, 1, 4, 1, 5)
    results = run_graph([], outputs + [from_proto])
    expected = [cases["value"], np.float32(0.25), np.array(cases["value_floats"], np.float32),
                np.int64(-7), np.array(cases["value_ints"], np.int64), table]
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype and got.shape == np.shape(want)


def test_large_constants_are_for_the_frontend():
    big = np.arange(MAX_CONSTANT_ELEMENTS + 1, dtype=np.float32)
    with pytest.raises(UnsupportedOpError, match="weights"):
        apply("Constant", [], {"value": big}, name="weights")
    np.testing.assert_array_equal(constant_value({"value": big}), big)
    with pytest.raises(UnsupportedOpError, match="exactly one"):
        constant_value({"value_int": 1, "value_float": 2.0})
    with pytest.raises(UnsupportedOpError, match="value_string"):
        constant_value({"value_string": "text"})


def test_constant_of_shape_and_range_from_symbolic_shapes():
    x = Tensor("x", "float32", ["batch", "seq"])
    shape, = apply("Shape", [x])
    zeros, = apply("ConstantOfShape", [shape])
    filled, = apply("ConstantOfShape", [shape], {"value": np.array([7], np.int32)})
    n, = apply("Gather", [shape, constant(np.array(1, np.int64))])
    positions, = apply("Range", [constant(np.array(0, np.int64)), n,
                                 constant(np.array(1, np.int64))])
    down, = apply("Range", [n, constant(np.array(-1, np.int64)), constant(np.array(-3, np.int64))])
    assert zeros.shape == filled.shape == (batch, seq)
    assert positions.shape == (seq,)
    assert [evaluate(down.shape[0], {seq: s}) for s in range(8)] == [
        len(range(s, -1, -3)) for s in range(8)]
    executable = compile_graph(Graph.from_outputs([x], [zeros, filled, positions, down]))
    for s in (1, 8):
        out = executable(random_array((3, s)))
        expected = [np.zeros((3, s), np.float32), np.full((3, s), 7, np.int32),
                    np.arange(s, dtype=np.int64), np.arange(s, -1, -3, dtype=np.int64)]
        for got, want in zip(out, expected):
            np.testing.assert_array_equal(got, want)
            assert got.dtype == want.dtype


def test_range_against_onnxruntime():
    scalars = [(2, 11, 3), (5, 5, 1), (7, 1, 2), (10, -3, -4)]
    cases = [Case("Range", [np.array(v, np.int32) for v in s]) for s in scalars]
    cases += [Case("Range", [np.array(v, np.float32) for v in s])
              for s in [(0.5, 3.1, 0.3), (1.0, -2.0, -0.7), (0.0, 1.0, 2.0)]]
    check(cases)
    known, = apply("Range", [constant(np.array(v, np.int64)) for v in (2, 11, 3)])
    assert known.value == (2, 5, 8)


def test_eye_like():
    cases = [Case("EyeLike", [In((5, 5))]),
             Case("EyeLike", [In((3, 7))], {"k": 2}),
             Case("EyeLike", [In((7, 3), "int32")], {"k": -1, "dtype": 1}),
             Case("EyeLike", [In(("n", 4))], {"k": 1, "dtype": 7})]
    check(cases, envs=({"n": 1}, {"n": 11}))


def test_bad_inputs_name_the_node():
    runtime = Tensor("limit", "int64", [])
    cases = [
        (UnsupportedOpError, "Range", [constant(np.array(0, np.int64)), runtime,
                                       constant(np.array(1, np.int64))], {}, "limit"),
        (UnsupportedOpError, "ConstantOfShape", [Tensor("s", "int64", [2])], {}, "shape"),
        (ShapeError, "Range", [constant(np.array(v, np.int64)) for v in (0, 5, 0)], {}, "delta"),
        (ShapeError, "EyeLike", [Tensor("t", "float32", [2, 2, 2])], {}, "2-D"),
        (ShapeError, "ConstantOfShape", [constant(i64(2, -1))], {}, "negative"),
    ]
    for kind, op, inputs, attrs, match in cases:
        with pytest.raises(kind, match=match) as info:
            apply(op, inputs, attrs, name=f"bad_{op}")
        assert f"bad_{op}" in str(info.value)
