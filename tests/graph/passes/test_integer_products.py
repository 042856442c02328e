"""integer_products: models quantised by ONNX Runtime's own tools (static QDQ, per tensor
and per channel, int8 and uint8 activations; dynamic) become products of raw uint8 by
int8 bytes whose corrections, scales and requantisation fuse into one kernel per layer,
and their outputs match ONNX Runtime's on the same file."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import treadle
from tests.harness import rng, run_onnxruntime
from treadle.compiler import compile_graph
from treadle.config import override
from treadle.frontend.onnx import from_onnx
from treadle.graph.optimize import optimize
from treadle.ir import dtypes
from treadle.target.cpu import host

quantization = pytest.importorskip("onnxruntime.quantization")

K, HIDDEN, N = 67, 128, 29  # K prime: no word or vector divides it


def float_mlp(path) -> str:
    """y = relu(x @ w1 + b1) @ w2, x of a symbolic number of rows."""
    gen = rng(0)
    weights = {"w1": gen.normal(size=(K, HIDDEN)) * 0.2, "b1": gen.normal(size=HIDDEN) * 0.1,
               "w2": gen.normal(size=(HIDDEN, N)) * 0.2}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    return _saved(nodes, ["M", K], weights, path)


def _saved(nodes, x_shape, weights: dict, path) -> str:
    """The float32 model of ``nodes`` from input x to output y, saved at ``path``."""
    graph = helper.make_graph(
        nodes, "float", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return str(path)


class _Calibration(quantization.CalibrationDataReader):
    def __init__(self):
        self.batches = iter([{"x": rng(s).normal(size=(5, K)).astype(np.float32)}
                             for s in range(8)])

    def get_next(self):
        return next(self.batches, None)


QUANTISE = {
    "static_per_channel": lambda src, dst: quantization.quantize_static(
        src, dst, _Calibration(), quant_format=quantization.QuantFormat.QDQ, per_channel=True),
    "static_uint8": lambda src, dst: quantization.quantize_static(
        src, dst, _Calibration(), quant_format=quantization.QuantFormat.QDQ,
        activation_type=quantization.QuantType.QUInt8,
        weight_type=quantization.QuantType.QUInt8),
    "dynamic": lambda src, dst: quantization.quantize_dynamic(
        src, dst, weight_type=quantization.QuantType.QInt8),
}


@pytest.fixture(scope="module", params=list(QUANTISE))
def quantised(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    path = str(folder / "q.onnx")
    QUANTISE[request.param](float_mlp(folder / "f.onnx"), path)
    return request.param, path


def test_products_become_raw_bytes_of_constant_weights(quantised):
    graph = optimize(from_onnx(onnx.load(quantised[1])))
    products = [n for n in graph.nodes if n.op_type in ("MatMul", "MatMulInteger")]
    assert [n.op_type for n in products] == ["MatMulInteger"] * 2
    for node in products:
        a, b = node.inputs
        assert len(node.inputs) == 2  # no zero points left
        assert a.dtype == dtypes.uint8 and b.dtype == dtypes.int8 and b.is_constant


def test_one_kernel_per_layer_on_word_products(quantised, tmp_path):
    """The quantisation of the input, the corrections, the scales, the bias, the ReLU and
    the next quantisation all fuse into the two products' kernels."""
    with override(dump_dir=tmp_path):
        treadle.compile(quantised[1])
    sources = "".join(p.read_text() for p in tmp_path.rglob("*.c"))
    word = "dpbusd" if "avx512_vnni" in host().features else "madd_epi16"
    assert word in sources
    kernels = [d.name.split("_", 1)[1] for d in tmp_path.rglob("k*_*") if d.is_dir()]
    assert kernels.count("MatMulInteger") == 2 and "MatMul" not in kernels
    if quantised[0] == "static_per_channel":
        assert len(kernels) == 2, kernels
    # Otherwise dynamic quantisation adds kernels finding each input's range, and uint8
    # weights (zero points not 0) a kernel summing each row of the input.


def test_outputs_match_onnxruntime_within_a_quantisation_step(quantised):
    """One step of the output's scale per element at most (the float32 scale products
    may round a value across a step's midpoint), exact on almost every element."""
    name, path = quantised
    compiled = treadle.compile(path)
    for rows in (1, 7, 13, 0):
        x = rng(rows).normal(size=(rows, K)).astype(np.float32)
        got, want = compiled(x)[0], run_onnxruntime(onnx.load(path), {"x": x})[0]
        assert got.shape == want.shape == (rows, N)
        if rows:
            step = np.abs(np.diff(np.unique(want))).min(initial=np.inf)
            difference = np.abs(got - want)
            assert difference.max() <= max(step, 1e-5) * 1.01
            assert np.mean(difference <= 1e-6 * np.abs(want).max()) >= 0.999


def float_cnn(path) -> str:
    """Two padded convolutions (the second strided) with biases and ReLUs, then a
    depthwise one, which stays dequantised float32, and a residual sum."""
    gen = rng(1)
    weights = {"w1": gen.normal(size=(32, 3, 3, 3)) * 0.3, "b1": gen.normal(size=32) * 0.1,
               "w2": gen.normal(size=(64, 32, 3, 3)) * 0.1, "b2": gen.normal(size=64) * 0.1,
               "w3": gen.normal(size=(64, 1, 3, 3)) * 0.3}
    pads = [1, 1, 1, 1]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=pads),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=pads, strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3"], ["c3"], pads=pads, group=64),
             helper.make_node("Add", ["c3", "r2"], ["y"])]
    return _saved(nodes, ["N", 3, "H", "W"], weights, path)


class _Images(quantization.CalibrationDataReader):
    def __init__(self):
        self.batches = iter([{"x": rng(s).normal(size=(1, 3, 16, 16)).astype(np.float32)}
                             for s in range(4)])

    def get_next(self):
        return next(self.batches, None)


@pytest.mark.parametrize("form", ["QDQ", "QOperator"])
def test_quantised_convolutions_run_on_integer_products(form, tmp_path):
    """Per-channel int8 weights: QDQ, and QLinearConv (QOperator without its contrib ops).
    The padding becomes the input's zero point around its bytes; the depthwise
    convolution stays float32."""
    path = str(tmp_path / "q.onnx")
    quantization.quantize_static(float_cnn(tmp_path / "f.onnx"), path, _Images(),
                                 quant_format=getattr(quantization.QuantFormat, form),
                                 per_channel=True, op_types_to_quantize=["Conv"])
    graph = optimize(from_onnx(onnx.load(path)))
    convs = [n.op_type for n in graph.nodes if "Conv" in n.op_type]
    assert convs == ["ChannelsLastConvInteger"] * 2 + ["ChannelsLastConv"]
    compiled = treadle.compile(path)
    for shape in ((1, 3, 16, 16), (2, 3, 13, 7)):
        x = rng(shape[2]).normal(size=shape).astype(np.float32)
        got, want = compiled(x)[0], run_onnxruntime(onnx.load(path), {"x": x})[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_an_avx2_cpu_takes_sixteen_bit_halves(tmp_path):
    """Without VNNI (Zen 3) the same model runs on vpmaddwd, with the same results."""
    path = str(tmp_path / "q.onnx")
    QUANTISE["static_per_channel"](float_mlp(tmp_path / "f.onnx"), path)
    avx2 = replace(host(), features=("avx2", "fma"), vector_registers=16)
    with override(dump_dir=tmp_path / "dump"):
        compiled = compile_graph(from_onnx(onnx.load(path)), target=avx2)
    sources = "".join(p.read_text() for p in (tmp_path / "dump").rglob("*.c"))
    assert "_mm256_madd_epi16" in sources and "dpbusd" not in sources
    x = rng(3).normal(size=(11, K)).astype(np.float32)
    np.testing.assert_array_equal(compiled(x)[0], treadle.compile(path)(x)[0])
