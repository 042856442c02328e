"""Models whose shapes depend on the contents of inputs, compiled per content, against
ONNX Runtime."""
from __future__ import annotations

import numpy as np
import pytest

import treadle
from tests.harness import assert_close, random_array, run_onnxruntime
from treadle.errors import ArgumentError, DTypeError, ModelError, UnsupportedOpError
from treadle.specialise import SpecialisingModel

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402


def _model(nodes, inputs, outputs=("y",)):
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


RESHAPE_THEN_SUM = _model(
    [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
     helper.make_node("ReduceSum", ["r", "axes"], ["y"], name="sum", keepdims=0)],
    [("x", TensorProto.FLOAT, ["n", 6]), ("shape", TensorProto.INT64, [3]),
     ("axes", TensorProto.INT64, [1])])


def test_each_content_compiles_once_and_matches_onnx_runtime():
    model = treadle.compile(RESHAPE_THEN_SUM)
    assert isinstance(model, SpecialisingModel)
    assert model.input_names == ["x", "shape", "axes"]
    cases = [(5, [5, 3, 2], [1]), (5, [-1, 2, 3], [-1]), (7, [7, 6, 1], [0]),
             (0, [0, 2, 3], [2]), (5, [5, 3, 2], [1])]
    for n, shape, axes in cases:
        feeds = {"x": random_array((n, 6)), "shape": np.array(shape, np.int64),
                 "axes": np.array(axes, np.int64)}
        assert_close(model(**feeds)[0], run_onnxruntime(RESHAPE_THEN_SUM, feeds)[0])
    # Found one at a time (the axes only once the shape is known); the repeat is cached.
    assert model.value_inputs == ["shape", "axes"]
    assert model.specialisations == 4


def test_positional_arguments_and_bad_values():
    model = treadle.compile(RESHAPE_THEN_SUM)
    x = random_array((4, 6))
    out, = model(x, np.array([4, 6, 1], np.int64), np.array([1], np.int64))
    assert_close(out, x.sum(axis=1).reshape(4, 1))
    with pytest.raises(ArgumentError, match="'shape' is missing"):
        model(x=x, axes=np.array([1], np.int64))
    with pytest.raises(DTypeError, match="'shape': expected int64, got int32"):
        model(x, np.array([4, 6, 1], np.int32), np.array([1], np.int64))
    with pytest.raises(ArgumentError, match="no input 'z'"):
        model(x, z=x)
    with pytest.raises(ModelError, match="cannot be saved"):
        model.save("never-written")


def test_large_or_symbolic_inputs_are_not_specialised():
    """Specialising on data would compile at every call: a shape input of unknown length
    stays an error naming the node."""
    model = _model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
                   [("x", TensorProto.FLOAT, [6]), ("shape", TensorProto.INT64, ["k"])])
    with pytest.raises(UnsupportedOpError, match="node 'reshape' .* must be known"):
        treadle.compile(model)
