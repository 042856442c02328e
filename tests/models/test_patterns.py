"""Minimal reproducers of graph patterns from exported zoo models that treadle once failed on.

Each test builds, with onnx.helper, the few nodes that torch.onnx.export wrote around the
failing node, so a failure here points at one op rather than at a whole model.
"""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import treadle
from tests.harness import assert_close, random_array


def make_model(nodes, inputs, outputs, constants=()):
    graph = helper.make_graph(nodes, "pattern", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in constants])
    # ONNX Runtime and treadle read IR version 9 with opset 17, as the exporter writes.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    return model


def expand_with_minus_one(sizes: str) -> list:
    """What torch.onnx.export writes for ``x.expand(*sizes)`` when a size is -1 ("keep
    this axis"): Where(sizes == -1, 1, sizes) as the target of Expand. In BERT and GPT-2
    the expanded tensor is the boolean attention mask ('/model/Expand')."""
    return [
        helper.make_node("Constant", [], ["rank"], value=numpy_helper.from_array(
            np.array([4], np.int64))),
        helper.make_node("ConstantOfShape", ["rank"], ["ones"], value=numpy_helper.from_array(
            np.array([1], np.int64))),
        helper.make_node("Constant", [], ["minus_one"], value=numpy_helper.from_array(
            np.array(-1, np.int64))),
        helper.make_node("Mul", ["ones", "minus_one"], ["minus_ones"]),
        helper.make_node("Equal", [sizes, "minus_ones"], ["keep"]),
        helper.make_node("Where", ["keep", "ones", sizes], ["target"]),
        helper.make_node("Expand", ["x", "target"], ["y"], name="/model/Expand"),
    ]


def test_expand_to_exported_sizes_with_minus_one():
    # The reduced BERT's mask.expand(1, -1, 16, 16), at 4 instead of 16.
    nodes = [helper.make_node("Constant", [], ["sizes"], value=numpy_helper.from_array(
        np.array([1, -1, 4, 4], np.int64)))] + expand_with_minus_one("sizes")
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 1])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])])
    x = random_array((1, 1, 4, 1))
    assert_close(treadle.compile(model)(x)[0], np.broadcast_to(x, (1, 1, 4, 4)))


def test_expand_to_symbolic_sizes_with_minus_one():
    # As with a symbolic sequence: sizes = [1, -1, seq, seq] from Shape, so deciding
    # "seq == -1" needs sizes to be known non-negative.
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], start=2, end=3),
        helper.make_node("Constant", [], ["head"], value=numpy_helper.from_array(
            np.array([1, -1], np.int64))),
        helper.make_node("Concat", ["head", "shape", "shape"], ["sizes"], axis=0),
    ] + expand_with_minus_one("sizes")
    model = make_model(
        nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "seq", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "seq", "seq"])])
    compiled = treadle.compile(model)
    for seq in (1, 7):
        x = random_array((1, 1, seq, 1), seed=seq)
        assert_close(compiled(x)[0], np.broadcast_to(x, (1, 1, seq, seq)), context=f"seq={seq}")
