"""Compile-time contents evaluated from operators' compute definitions, against numpy."""
import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle.graph.known import Budget, derive_value, evaluate_operator, small_contents
from treadle.graph.operator import apply
from treadle.graph.tensor import MAX_KNOWN, Tensor, constant
from treadle.ir.dtypes import bfloat16, bfloat16_bits
from treadle.ir.expr import Var


def evaluate(tensor: Tensor, budget: Budget = None):
    op = tensor.producer
    return evaluate_operator(op, [None if t is None else t.data for t in op.inputs],
                             budget or Budget(), [tensor])


@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (3, 0), (0, 5)])
def test_a_float_reduction(shape):
    data = random_array(shape, seed=1)
    total = apply("ReduceSum", [constant(data), constant(np.array([1]))], {"keepdims": 0})[0]
    mean = apply("ReduceMean", [constant(data)], {"axes": [0]})[0]
    got_total, = evaluate(total)
    got_mean, = evaluate(mean)
    assert_close(got_total, data.sum(1), reduction=shape[1])
    if shape[0]:
        assert_close(got_mean, data.mean(0, keepdims=True), reduction=shape[0])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_a_concat(axis):
    parts = [random_array((3, 7), seed=2), random_array((3, 7), seed=3),
             random_array((3, 7), seed=4)[:, :0] if axis else random_array((0, 7), seed=4)]
    y = apply("Concat", [constant(p) for p in parts], {"axis": axis})[0]
    got, = evaluate(y)
    np.testing.assert_array_equal(got, np.concatenate(parts, axis))


def test_a_gather_with_negative_indices():
    data = random_array((5, 11), seed=5)
    indices = np.array([[0, -1], [4, -5], [2, 2]], np.int64)
    y = apply("Gather", [constant(data), constant(indices)], {"axis": 0})[0]
    got, = evaluate(y)
    np.testing.assert_array_equal(got, np.take(data, indices, axis=0))


def test_a_cast_chain_truncates_and_wraps_as_c():
    data = np.array([-2.7, -0.5, 0.0, 2.5, 130.9, 255.0, 300.0], np.float32)
    to_int = apply("Cast", [constant(data)], {"to": 6})[0]  # int32
    to_byte = apply("Cast", [to_int], {"to": 3})[0]  # int8
    back = apply("Cast", [to_byte], {"to": 1})[0]  # float32
    got = small_contents(back)
    np.testing.assert_array_equal(got, data.astype(np.int32).astype(np.int8).astype(np.float32))
    assert got.dtype == np.float32


def test_small_contents_through_float_arithmetic_on_a_static_size():
    """MobileViT's patch count: a static size read through Shape, halved in float."""
    x = Tensor("x", "float32", [1, 96, 30, 30])
    side = apply("Gather", [apply("Shape", [x])[0], constant(np.array(2))], {"axis": 0})[0]
    half = apply("Div", [apply("Cast", [side], {"to": 1})[0], constant(np.float32(2.0))])[0]
    patches = apply("Cast", [apply("Ceil", [half])[0]], {"to": 7})[0]
    assert small_contents(patches) == 15
    assert patches.value == (15,)


def test_derive_value_through_a_float_square_root():
    """Dinov2's patch grid side, int(49 ** 0.5), beside a size read from a symbolic shape."""
    x = Tensor("x", "float32", ["batch", 49, 8])
    root = apply("Sqrt", [constant(np.float32(49.0))])[0]
    side = apply("Unsqueeze", [apply("Cast", [root], {"to": 7})[0], constant(np.array([0]))])[0]
    batch = apply("Slice", [apply("Shape", [x])[0], constant(np.array([0])),
                            constant(np.array([1]))])[0]
    grid = apply("Concat", [batch, side, side], {"axis": 0})[0]
    derive_value(grid)
    assert grid.value == (Var("batch"), 7, 7)


def test_unknown_where_the_definition_does_not_give_the_contents():
    data = constant(random_array((9,), seed=6))
    top = apply("TopK", [data, constant(np.array([3]))])[0]  # a hand-written kernel
    assert evaluate(top) is None and small_contents(top) is None
    x = Tensor("x", "float32", [4])
    assert small_contents(apply("Relu", [x])[0]) is None  # computed from an input


def test_unknown_for_bfloat16_whose_numpy_values_are_bits():
    bits = constant(bfloat16_bits(np.array([1.5, -2.0], np.float32)), "w", bfloat16)
    assert small_contents(apply("Cast", [bits], {"to": 1})[0]) is None


def test_gives_up_over_the_budget():
    big = constant(random_array((MAX_KNOWN, 600), seed=7))
    total = apply("ReduceSum", [big, constant(np.array([1]))], {"keepdims": 0})[0]
    assert evaluate(total, Budget(MAX_KNOWN * 600 - 1)) is None
    got, = evaluate(total, Budget(MAX_KNOWN * 600))
    assert_close(got, big.data.sum(1), reduction=600)
    assert small_contents(total) is None  # over the default budget
