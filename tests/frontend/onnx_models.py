"""Small ONNX models built with onnx.helper, and ONNX Runtime as their reference.

Models use IR version 9 and opset 17 unless a test needs another: ONNX Runtime rejects
models of a newer IR version than it knows.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 9
OPSET = 17


def tensor(name: str, shape, elem_type: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)


def make_model(nodes: Sequence[onnx.NodeProto], inputs: Sequence[onnx.ValueInfoProto],
               outputs: Sequence[onnx.ValueInfoProto], initializers: dict | None = None,
               opset: int = OPSET, name: str = "test") -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=IR_VERSION)


def affine_model() -> onnx.ModelProto:
    """y = sigmoid((x + b) * 2) with x: float32[batch, 5] and b an initializer."""
    nodes = [helper.make_node("Add", ["x", "b"], ["sum"], name="add_bias"),
             helper.make_node("Constant", [], ["two"], name="two", value_float=2.0),
             helper.make_node("Mul", ["sum", "two"], ["scaled"], name="scale"),
             helper.make_node("Sigmoid", ["scaled"], ["y"], name="squash")]
    bias = np.linspace(-1, 1, 5, dtype=np.float32)
    return make_model(nodes, [tensor("x", ["batch", 5])], [tensor("y", ["batch", 5])],
                      {"b": bias})


