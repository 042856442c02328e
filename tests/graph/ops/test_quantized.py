"""MatMulInteger against ONNX Runtime, exactly: uint8 and int8 operands in every pairing,
zero points per tensor, per row and per column, given at run time or as constants, a
batch, odd, prime, zero and symbolic sizes; and the errors that name the node."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import rng, run_onnxruntime
from treadle.errors import DTypeError, ModelError, ShapeError

pytest.importorskip("onnxruntime")

ELEM = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}


def _bytes(dtype, shape, seed):
    info = np.iinfo(dtype)
    values = rng(seed).integers(info.min, info.max + 1, shape).astype(dtype)
    values.flat[:2] = [info.min, info.max][:values.size]  # the type's limits
    return values


def matmul_integer(a_type, b_type, b_shape, constant_b=None, zero_a=None, zero_b=None,
                   a_shape=("M", "K")):
    """y = MatMulInteger(a, b[, za][, zb]); b and the zero points constants where given."""
    names, inits = ["a", "b"], {}
    inputs = [tensor("a", list(a_shape), ELEM[a_type])]
    if constant_b is not None:
        inits["b"] = constant_b
    else:
        inputs.append(tensor("b", list(b_shape), ELEM[b_type]))
    for name, zero in (("za", zero_a), ("zb", zero_b)):
        if zero is not None:
            inits[name] = zero
            names.append(name)
        elif name == "za" and zero_b is not None:
            names.append("")
    node = helper.make_node("MatMulInteger", names, ["y"], name="mmi")
    return make_model([node], inputs, [tensor("y", None, TensorProto.INT32)], inits, opset=13)


def assert_exact(model, feeds, compiled=None):
    got = (compiled or treadle.compile(model))(**feeds)[0]
    want = run_onnxruntime(model, feeds)[0]
    assert got.dtype == want.dtype == np.int32 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("a_type, b_type", [(np.uint8, np.int8), (np.int8, np.int8),
                                            (np.uint8, np.uint8), (np.int8, np.uint8)])
@pytest.mark.parametrize("zeros", ["none", "tensor", "column"])
def test_constant_weights_with_zero_points(a_type, b_type, zeros):
    """The raw-byte product and its corrections (passes.integer_products)."""
    k, n = 97, 61
    b = _bytes(b_type, (k, n), 1)
    zero_a = None if zeros == "none" else np.array(_bytes(a_type, (), 2))
    zero_b = {"none": None, "tensor": np.array(_bytes(b_type, (), 3)),
              "column": _bytes(b_type, (n,), 4)}[zeros]
    model = matmul_integer(a_type, b_type, (k, n), b, zero_a, zero_b, a_shape=("M", k))
    compiled = treadle.compile(model)
    for m in (1, 7, 13, 0):
        assert_exact(model, {"a": _bytes(a_type, (m, k), m)}, compiled)


@pytest.mark.parametrize("a_type, b_type", [(np.uint8, np.int8), (np.int8, np.uint8)])
def test_run_time_operands_and_per_row_zero_points(a_type, b_type):
    """Both operands inputs (the definition's own loops), a zero point per row of a, which
    ONNX allows and ONNX Runtime refuses: numpy is the reference."""
    m, k, n = 7, 13, 5
    zero_a, zero_b = _bytes(a_type, (m,), 5), _bytes(b_type, (), 6)
    model = matmul_integer(a_type, b_type, ("K", "N"), zero_a=zero_a, zero_b=zero_b,
                           a_shape=(m, "K"))
    a, b = _bytes(a_type, (m, k), 7), _bytes(b_type, (k, n), 8)
    got = treadle.compile(model)(a=a, b=b)[0]
    wide = np.int64
    want = (a.astype(wide) - zero_a.astype(wide)[:, None]) @ (b.astype(wide) - int(zero_b))
    np.testing.assert_array_equal(got, want.astype(np.int32))


def test_batched_left_operand_with_a_run_time_zero_point():
    """What quantize_dynamic makes: the zero point computed by DynamicQuantizeLinear."""
    k, n = 33, 17
    b = _bytes(np.int8, (k, n), 9)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "scale", "zero"]),
             helper.make_node("MatMulInteger", ["q", "b", "zero"], ["y"], name="mmi")]
    model = make_model(nodes, [tensor("x", ["B", "T", k])],
                       [tensor("y", None, TensorProto.INT32)], {"b": b}, opset=13)
    compiled = treadle.compile(model)
    for batch, steps in ((2, 3), (1, 1), (3, 0)):
        x = rng(batch).normal(size=(batch, steps, k)).astype(np.float32) + 0.5
        assert_exact(model, {"x": x}, compiled)


def test_wrong_types_and_zero_point_lengths_name_the_node():
    b = _bytes(np.int8, (4, 3), 1)
    wide = make_model([helper.make_node("MatMulInteger", ["a", "b"], ["y"], name="mmi")],
                      [tensor("a", [2, 4], TensorProto.INT32)],
                      [tensor("y", None, TensorProto.INT32)], {"b": b}, opset=13)
    with pytest.raises(DTypeError, match="mmi.*uint8 or int8"):
        treadle.compile(wide)
    bad_zero = matmul_integer(np.uint8, np.int8, (4, 3), b, zero_b=_bytes(np.int8, (5,), 2),
                              a_shape=(2, 4))
    with pytest.raises(ShapeError, match="mmi.*5 values"):
        treadle.compile(bad_zero)


def conv_integer(x_type, w, zero_x=None, zero_w=None, **attrs):
    names, inits = ["x", "w"], {"w": w}
    for name, zero in (("zx", zero_x), ("zw", zero_w)):
        if zero is not None:
            inits[name] = zero
            names.append(name)
        elif name == "zx" and zero_w is not None:
            names.append("")
    node = helper.make_node("ConvInteger", names, ["y"], name="convi", **attrs)
    return make_model([node], [tensor("x", ["N", w.shape[1], "H", "W"], ELEM[x_type])],
                      [tensor("y", None, TensorProto.INT32)], inits, opset=13)


@pytest.mark.parametrize("x_type, w_type", [(np.uint8, np.int8), (np.int8, np.uint8)])
@pytest.mark.parametrize("zeros, attrs", [
    ("none", {}), ("x", {"pads": [1, 1, 1, 1]}), ("both", {"pads": [2, 0, 1, 1]}),
    ("x", {"strides": [2, 2], "dilations": [2, 1]}), ("channel", {"pads": [1, 1, 1, 1]})])
def test_conv_integer_matches_onnxruntime(x_type, w_type, zeros, attrs):
    """The padding reads as x's zero point; channels last on the integer GEMM."""
    w = _bytes(w_type, (19, 5, 3, 3), 1)
    zero_x = None if zeros == "none" else np.array(_bytes(x_type, (), 2))
    zero_w = {"both": np.array(_bytes(w_type, (), 3)),
              "channel": _bytes(w_type, (19,), 4)}.get(zeros)
    model = conv_integer(x_type, w, zero_x, zero_w, **attrs)
    compiled = treadle.compile(model)
    for shape in ((1, 5, 7, 9), (2, 5, 13, 5)):
        x = _bytes(x_type, shape, shape[2])
        if zeros == "channel":  # which ONNX Runtime refuses: PyTorch in float64 instead
            want = _conv_reference(x, w, zero_x, zero_w, attrs)
            np.testing.assert_array_equal(compiled(x=x)[0], want)
        else:
            assert_exact(model, {"x": x}, compiled)


def _conv_reference(x, w, zero_x, zero_w, attrs):
    """ConvInteger by PyTorch in float64 (exact at these magnitudes): zero points
    subtracted first, so the padding adds nothing."""
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    wide = torch.from_numpy(x.astype(np.float64) - float(zero_x))
    pads = attrs.get("pads", [0, 0, 0, 0])
    wide = functional.pad(wide, (pads[1], pads[3], pads[0], pads[2]))
    weights = w.astype(np.float64) - zero_w.astype(np.float64).reshape(-1, 1, 1, 1)
    out = functional.conv2d(wide, torch.from_numpy(weights),
                            stride=attrs.get("strides", 1), dilation=attrs.get("dilations", 1))
    return out.numpy().astype(np.int32)


def test_qlinear_matmul_and_conv_import_as_quantised_float_ops():
    """QLinearMatMul and QLinearConv (a bias, per-channel weight scales) against ONNX
    Runtime: both run on integer products, so the results agree exactly."""
    gen = rng(5)
    w = _bytes(np.int8, (8, 3, 3, 3), 6)
    conv = helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "b"],
                            ["c"], name="qconv", pads=[1, 1, 1, 1], strides=[2, 2])
    flat = helper.make_node("Reshape", ["c", "shape"], ["f"], name="flat")
    matmul = helper.make_node("QLinearMatMul", ["f", "sy", "zy", "m", "sm", "zm", "so", "zo"],
                              ["y"], name="qmm")
    inits = {"sx": np.float32(0.02), "zx": np.uint8(120), "w": w,
             "sw": gen.uniform(0.01, 0.03, 8).astype(np.float32), "zw": np.zeros(8, np.int8),
             "sy": np.float32(0.05), "zy": np.uint8(100), "b": gen.integers(-50, 50, 8,
                                                                          dtype=np.int32),
             "shape": np.array([-1, 8 * 4 * 4], np.int64), "m": _bytes(np.int8, (128, 11), 7),
             "sm": np.float32(0.01), "zm": np.int8(0), "so": np.float32(0.1),
             "zo": np.uint8(128)}
    model = make_model([conv, flat, matmul], [tensor("x", ["N", 3, 8, 8], TensorProto.UINT8)],
                       [tensor("y", None, TensorProto.UINT8)], inits, opset=13)
    compiled = treadle.compile(model)
    for batch in (1, 3):
        x = _bytes(np.uint8, (batch, 3, 8, 8), batch)
        got, want = compiled(x=x)[0], run_onnxruntime(model, {"x": x})[0]
        assert got.dtype == want.dtype == np.uint8 and got.shape == want.shape
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1  # one step at most
        assert np.mean(got == want) >= 0.99


def _quantize_model(scale, zero, x_shape=("N", 4), axis=1, op="QuantizeLinear",
                    x_type=TensorProto.FLOAT):
    node = helper.make_node(op, ["x", "s", "z"], ["y"], name="q", axis=axis)
    return make_model([node], [tensor("x", list(x_shape), x_type)],
                      [tensor("y", None, ELEM.get(zero.dtype.type, TensorProto.FLOAT))],
                      {"s": scale, "z": zero}, opset=13)


@pytest.mark.parametrize("scale", [0.0, np.nan, np.inf])
@pytest.mark.parametrize("op, x_type", [("QuantizeLinear", TensorProto.FLOAT),
                                        ("DequantizeLinear", TensorProto.UINT8)])
def test_a_scale_of_zero_or_nan_names_the_node(scale, op, x_type):
    model = _quantize_model(np.array([0.5, scale, 1, 1], np.float32), np.zeros(4, np.uint8),
                            op=op, x_type=x_type)
    with pytest.raises(ModelError, match="'q'.*not a finite non-zero"):
        treadle.compile(model)


def test_a_per_axis_scale_of_the_wrong_length_names_the_node():
    model = _quantize_model(np.ones(3, np.float32), np.zeros(3, np.uint8))
    with pytest.raises(ShapeError, match="'q'.*needs 4 values.*got 3"):
        treadle.compile(model)


@pytest.mark.parametrize("zero_type", [np.uint8, np.int8])
def test_quantize_saturates_and_rounds_half_to_even_at_the_limits(zero_type):
    """Halves round to the even neighbour; values past the type's range saturate to its
    limits, infinities too: against ONNX Runtime, exactly."""
    info = np.iinfo(zero_type)
    model = _quantize_model(np.array([1, 0.5, 2, 0.25], np.float32),
                            np.array([0, 1, info.min + 2, info.max - 2], zero_type))
    x = np.array([[0.5, 1.5, 2.5, -0.5], [-1.5, 254.5, -255.5, 127.5],
                  [1e9, -1e9, np.inf, -np.inf], [info.max + 0.5, info.min - 0.5, 3.5, -2.5]],
                 np.float32)
    got, want = treadle.compile(model)(x=x)[0], run_onnxruntime(model, {"x": x})[0]
    assert got.dtype == want.dtype == zero_type
    np.testing.assert_array_equal(got, want)
