"""The dot template: which products it takes (a few columns, K's innermost axis along
the left factor's rows in whole vectors, constant columns), and tall matrix products and
channels-last convolutions to a few channels against numpy and ONNX Runtime, over odd and
prime sizes, zero rows and a symbolic row count, on this machine's vectors and AVX2's."""
from __future__ import annotations

import numpy as np
import pytest

from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array, run_onnxruntime
import treadle
from treadle.compiler import compile_graph
from treadle.frontend.onnx import from_onnx
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.optimize import optimize
from treadle.graph.tensor import Tensor, constant
from treadle.schedule.select import select_template
from treadle.schedule.templates.dot_cpu import DOT
from treadle.target.cpu import CpuTarget, host

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

AVX2 = CpuTarget(("avx2", "fma"), 32 * 1024, 512 * 1024, 8 * 1024 * 1024)


def _dense(k: int, n: int, rows="m"):
    """relu(x @ w + b), x: rows x k, w and b constants."""
    w, b = random_array((k, n), seed=k + n), random_array((n,), seed=n)
    x = Tensor("x", "float32", [rows, k])
    y = apply("Add", [apply("MatMul", [x, constant(w)])[0], constant(b)])[0]
    return Graph.from_outputs([x], [apply("Relu", [y])[0]]), w, b


def _template(graph: Graph) -> str:
    (anchor, *_) = [op for op in graph.nodes if op.op_type == "MatMul"]
    return select_template(anchor, host())[0].name


@pytest.mark.parametrize("k, n, taken", [
    (8, 1, True), (24, 3, True), (64, 7, True),   # a few columns, whole vectors along K
    (13, 3, False),                               # K in no whole vector
    (16, 8, False),                               # as wide as a GEMM's columns
])
def test_takes_narrow_products_whose_rows_fill_vectors(k, n, taken):
    graph = _dense(k, n)[0]
    assert (_template(graph) == DOT.name) == taken


@pytest.mark.parametrize("target", [None, AVX2], ids=["host", "avx2"])
@pytest.mark.parametrize("k, n", [(8, 1), (24, 3), (64, 7), (1024, 4)])
def test_tall_products_match_numpy(target, k, n):
    graph, w, b = _dense(k, n)
    program = compile_graph(graph, target=target)
    for rows in (0, 1, 13, 97):
        xs = random_array((rows, k), seed=rows)
        expected = np.maximum(xs.astype(np.float64) @ w + b, 0).astype(np.float32)
        assert_close(program(xs)[0], expected, reduction=k, context=f"{rows} rows")


def _style_tail(channels: int, out: int, kernel: int):
    """conv 3x3 -> ReLU -> reflect pad -> conv kernel x kernel to ``out`` channels, the last
    convolution reading the channels-last activations of the first."""
    half = kernel // 2
    inits = {"w0": random_array((channels, 3, 3, 3), seed=1),
             "w1": random_array((out, channels, kernel, kernel), seed=2),
             "b1": random_array((out,), seed=3),
             "pads": np.array([0, 0, half, half, 0, 0, half, half], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Pad", ["r0", "pads"], ["p0"], mode="reflect"),
             helper.make_node("Conv", ["p0", "w1", "b1"], ["y"])]
    return make_model(nodes, [tensor("x", ["batch", 3, "h", "w"])],
                      [tensor("y", ["batch", out, "h", "w"])], initializers=inits)


@pytest.mark.parametrize("channels, out, kernel", [(16, 3, 3), (32, 1, 5), (8, 7, 3)])
def test_convolutions_to_a_few_channels_match_onnxruntime(channels, out, kernel):
    """The last convolution runs channels last on the dot template (its kernel is named
    so in the plan) and matches ONNX Runtime for odd, prime and one-pixel images."""
    model = _style_tail(channels, out, kernel)
    graph = optimize(from_onnx(model))
    (last,) = [op for op in graph.nodes if op.op_type == "ChannelsLastConv"
               and op.outputs[0].shape[-1] == out]
    assert select_template(last, host())[0].name == DOT.name
    compiled = treadle.compile(model)
    for batch, h, w in ((1, 7, 13), (2, 5, 3), (1, kernel // 2 + 1, 11)):
        x = random_array((batch, 3, h, w), seed=h * w)
        (expected,) = run_onnxruntime(model, {"x": x})
        assert_close(compiled(x)[0], expected, reduction=channels * kernel * kernel * 27)
