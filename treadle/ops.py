"""Building graphs directly in Python, without a model file.

    import treadle
    from treadle import ops
    x = ops.input("x", "float32", ["batch", 3, 32, 32])      # "batch" is a symbol
    w = ops.constant(weights)
    y = ops.relu(ops.conv2d(x, w, padding=1))
    model = treadle.compile(ops.graph([x], [y]))

Every function here is a thin spelling of one registered operator (ONNX semantics and
attribute names), so the graph API and the ONNX frontend share one definition per op.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.tensor import Tensor, constant as _constant


def input(name: str, dtype: str, shape: Sequence) -> Tensor:  # noqa: A001 (mirrors ONNX)
    """A graph input; string dimensions are symbols bound at call time."""
    return Tensor(name, dtype, tuple(shape))


def constant(data, name: str = "const", dtype: Optional[str] = None) -> Tensor:
    return _constant(data, name, dtype)


def graph(inputs: Sequence[Tensor], outputs: Sequence[Tensor], name: str = "graph") -> Graph:
    return Graph.from_outputs(inputs, outputs, name)


def op(op_type: str, *inputs: Optional[Tensor], name: Optional[str] = None, **attrs) -> Tensor:
    """Any registered operator with one output, by its ONNX name."""
    return apply(op_type, list(inputs), attrs, name)[0]


def _as_tensor(value, like: Tensor) -> Tensor:
    if isinstance(value, Tensor):
        return value
    return _constant(np.asarray(value, dtype=like.dtype.numpy), "scalar")


def _pair(value, rank: int) -> list[int]:
    return list(value) if isinstance(value, (list, tuple)) else [int(value)] * rank


def conv2d(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, *, stride=1, padding=0,
           dilation=1, groups: int = 1, name: Optional[str] = None) -> Tensor:
    """2-D convolution, NCHW activations and OIHW weights (PyTorch's conventions)."""
    pads = _pair(padding, 2)
    attrs = {"strides": _pair(stride, 2), "pads": pads + pads, "dilations": _pair(dilation, 2),
             "group": groups}
    inputs = [x, weight] + ([bias] if bias is not None else [])
    return apply("Conv", inputs, attrs, name)[0]


def matmul(a: Tensor, b: Tensor, name: Optional[str] = None) -> Tensor:
    return op("MatMul", a, b, name=name)


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
           name: Optional[str] = None) -> Tensor:
    """``x @ weight.T + bias`` with weight [out, in], as torch.nn.Linear."""
    inputs = [x, weight] + ([bias] if bias is not None else [])
    if x.rank == 2:
        return apply("Gemm", inputs, {"transB": 1}, name)[0]
    y = matmul(x, op("Transpose", weight, perm=[1, 0]))
    return y if bias is None else add(y, bias)


def add(a: Tensor, b) -> Tensor:
    return op("Add", a, _as_tensor(b, a))


def sub(a: Tensor, b) -> Tensor:
    return op("Sub", a, _as_tensor(b, a))


def mul(a: Tensor, b) -> Tensor:
    return op("Mul", a, _as_tensor(b, a))


def div(a: Tensor, b) -> Tensor:
    return op("Div", a, _as_tensor(b, a))


def relu(x: Tensor) -> Tensor:
    return op("Relu", x)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    return op("Gelu", x, approximate=approximate)


def sigmoid(x: Tensor) -> Tensor:
    return op("Sigmoid", x)


def tanh(x: Tensor) -> Tensor:
    return op("Tanh", x)


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    return op("Softmax", x, axis=axis)


def layer_norm(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, *, axis: int = -1,
               epsilon: float = 1e-5) -> Tensor:
    inputs = [x, weight] + ([bias] if bias is not None else [])
    return apply("LayerNormalization", inputs, {"axis": axis, "epsilon": epsilon})[0]


def max_pool2d(x: Tensor, kernel_size, stride=None, padding=0) -> Tensor:
    pads = _pair(padding, 2)
    return op("MaxPool", x, kernel_shape=_pair(kernel_size, 2),
              strides=_pair(stride if stride is not None else kernel_size, 2), pads=pads + pads)


def avg_pool2d(x: Tensor, kernel_size, stride=None, padding=0) -> Tensor:
    pads = _pair(padding, 2)
    return op("AveragePool", x, kernel_shape=_pair(kernel_size, 2),
              strides=_pair(stride if stride is not None else kernel_size, 2), pads=pads + pads)


def global_avg_pool(x: Tensor) -> Tensor:
    return op("GlobalAveragePool", x)


def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    return op("Reshape", x, _constant(np.array(shape, np.int64), "shape"))


def transpose(x: Tensor, perm: Sequence[int]) -> Tensor:
    return op("Transpose", x, perm=list(perm))


def concat(tensors: Sequence[Tensor], axis: int) -> Tensor:
    return apply("Concat", list(tensors), {"axis": axis})[0]


def reduce_mean(x: Tensor, axes: Sequence[int], keepdims: bool = True) -> Tensor:
    return op("ReduceMean", x, _constant(np.array(axes, np.int64), "axes"),
              keepdims=int(keepdims))
