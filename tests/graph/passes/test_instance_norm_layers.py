"""Style-transfer layers (fast-neural-style Candy): reflection padding, convolution,
instance normalisation, ReLU and nearest upsampling, against ONNX Runtime with odd sizes
and a symbolic batch. Between the layers everything stays channels-last: the instance
normalisation's moments are column sums over the pixels, the ReLU is its epilogue, and
only the model's ends transpose."""
import numpy as np
import onnx
import pytest
from onnx import helper

from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array, run_onnxruntime
import treadle
from treadle.frontend.onnx import from_onnx
from treadle.graph.optimize import optimize


def style_layers(channels, side, mode="nearest"):
    """reflect pad -> conv 3x3 -> IN -> ReLU -> x2 resize -> reflect pad -> conv 3x3 -> IN
    -> ReLU -> conv 3x3 to 3 channels."""
    inits = {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
             "scales": np.array([1, 1, 2, 2], np.float32),
             "w0": random_array((channels, 3, 3, 3), seed=1),
             "w1": random_array((channels, channels, 3, 3), seed=2),
             "w2": random_array((3, channels, 3, 3), seed=3)}
    for k in (0, 1):
        inits[f"g{k}"] = random_array((channels,), seed=10 + k, low=0.5, high=1.5)
        inits[f"b{k}"] = random_array((channels,), seed=20 + k)
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p0"], mode="reflect"),
             helper.make_node("Conv", ["p0", "w0"], ["c0"]),
             helper.make_node("InstanceNormalization", ["c0", "g0", "b0"], ["n0"],
                              epsilon=1e-5),
             helper.make_node("Relu", ["n0"], ["r0"]),
             helper.make_node("Resize", ["r0", "", "scales"], ["u"], mode=mode),
             helper.make_node("Pad", ["u", "pads"], ["p1"], mode="reflect"),
             helper.make_node("Conv", ["p1", "w1"], ["c1"]),
             helper.make_node("InstanceNormalization", ["c1", "g1", "b1"], ["n1"],
                              epsilon=1e-5),
             helper.make_node("Relu", ["n1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["y"], pads=[1, 1, 1, 1])]
    return make_model(nodes, [tensor("x", ["batch", 3, side, side])],
                      [tensor("y", ["batch", 3, 2 * side, 2 * side])], initializers=inits)


@pytest.mark.parametrize("channels,side,mode", [(8, 7, "nearest"), (13, 11, "nearest"),
                                                (16, 5, "linear"), (9, 2, "nearest")])
def test_style_layers_match_onnxruntime(channels, side, mode):
    model = style_layers(channels, side, mode)
    compiled = treadle.compile(model)
    for batch in (1, 2):
        x = random_array((batch, 3, side, side), seed=batch)
        for actual, expected in zip(compiled(x), run_onnxruntime(model, {"x": x}),
                                    strict=True):
            assert_close(actual, expected, reduction=9 * channels)


def test_instance_norm_layers_stay_channels_last():
    graph = optimize(from_onnx(style_layers(16, 9)))
    types = [n.op_type for n in graph.nodes]
    assert "InstanceNormalization" not in types
    assert types.count("ChannelsLastInstanceNormalization") == 2
    # In: to channels-last before the first padding; out: the last convolution, to 3
    # channels from 16 (whole vectors: the dot template), runs channels last too and
    # its result goes back to channels first.
    assert types.count("Transpose") == 2, types


def test_instance_norm_takes_its_relu_and_transposes_fuse():
    compiled = treadle.compile(style_layers(16, 9))
    steps = [s.name for s in compiled.executable.steps if s.kernel is not None]
    # pad, conv, IN + ReLU, resize + reflect pad, conv, IN + ReLU (+ transpose), conv: no
    # kernel of its own for an activation, a transpose or the padding after the resize
    assert len(steps) <= 7, steps
    assert not any(s.endswith(("Relu", "to_nchw", "to_nhwc", "sunk")) for s in steps), steps
    assert sum(s.split("/")[-1].startswith("Pad") for s in steps) == 1, steps


def group_norm_block(channels, groups, side, after_conv=True):
    """(conv 3x3 ->) GroupNormalization -> SiLU -> conv 1x1: channels-last after a
    convolution, NCHW on the model's input."""
    inits = {"g": random_array((channels,), seed=1, low=0.5, high=1.5),
             "b": random_array((channels,), seed=2),
             "w1": random_array((7, channels, 1, 1), seed=4)}
    nodes = []
    source = "x"
    if after_conv:
        inits["w0"] = random_array((channels, channels, 3, 3), seed=3)
        nodes.append(helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]))
        source = "c0"
    nodes += [helper.make_node("GroupNormalization", [source, "g", "b"], ["n"],
                               num_groups=groups, epsilon=1e-5),
              helper.make_node("Sigmoid", ["n"], ["s"]),
              helper.make_node("Mul", ["n", "s"], ["a"]),
              helper.make_node("Conv", ["a", "w1"], ["y"])]
    return make_model(nodes, [tensor("x", ["batch", channels, side, side])],
                      [tensor("y", ["batch", 7, side, side])], initializers=inits, opset=21)


def group_norm_reference(x, groups, scale, bias):
    n, c = x.shape[:2]
    rows = x.astype(np.float64).reshape(n, groups, -1)
    normal = (rows - rows.mean(-1, keepdims=True)) / np.sqrt(rows.var(-1, keepdims=True) + 1e-5)
    normal = normal.reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return normal * scale.reshape(shape) + bias.reshape(shape)


@pytest.mark.parametrize("channels,groups,side,after_conv", [
    (12, 3, 7, True), (16, 16, 5, True), (9, 1, 6, False), (20, 4, 11, True),
    (6, 2, 1, False)])
def test_group_norm_matches_a_numpy_reference(channels, groups, side, after_conv):
    model = group_norm_block(channels, groups, side, after_conv)
    graph = optimize(from_onnx(model))
    types = [n.op_type for n in graph.nodes]
    assert ("ChannelsLastGroupNormalization" in types) == after_conv, types
    compiled = treadle.compile(model)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    for batch in (1, 3):
        x = random_array((batch, channels, side, side), seed=batch)
        h = x.astype(np.float64)
        if after_conv:
            (h,) = run_onnxruntime(conv_only(channels), {"x": x, "w0": inits["w0"]})
        normal = group_norm_reference(np.asarray(h, np.float64), groups, inits["g"],
                                      inits["b"])
        act = normal / (1 + np.exp(-normal))
        expected = np.einsum("nchw,mc->nmhw", act, inits["w1"][:, :, 0, 0])
        (actual,) = compiled(x)
        assert_close(actual, expected.astype(np.float32), reduction=channels * side * side)


def conv_only(channels):
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1])]
    return make_model(nodes, [tensor("x", ["batch", channels, None, None]),
                              tensor("w0", [channels, channels, 3, 3])],
                      [tensor("c0", None)])


def padded_block(channels, mode, pads, residual=False):
    """conv 3x3 -> IN -> ReLU (-> + the convolution's input, ``residual``, a result of
    the model too) -> ``mode`` padding by ``pads`` -> conv 3x3 without padding of its
    own."""
    inits = {"pads": np.array(pads, np.int64),
             "w0": random_array((channels, channels, 3, 3), seed=1),
             "w1": random_array((12, channels, 3, 3), seed=2),
             "g": random_array((channels,), seed=3, low=0.5, high=1.5),
             "b": random_array((channels,), seed=4)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("InstanceNormalization", ["c", "g", "b"], ["n"], epsilon=1e-5),
             helper.make_node("Relu", ["n"], ["r"])]
    last = "r"
    if residual:
        nodes.append(helper.make_node("Add", ["r", "x"], ["s"]))
        last = "s"
    nodes += [helper.make_node("Pad", [last, "pads"], ["p"], mode=mode),
              helper.make_node("Conv", ["p", "w1"], ["y"])]
    outputs = [tensor("y", None)] + ([tensor("s", None)] if residual else [])
    return make_model(nodes, [tensor("x", ["batch", channels, None, None])], outputs,
                      initializers=inits)


@pytest.mark.parametrize("mode,pads,side", [
    ("reflect", [0, 0, 1, 1, 0, 0, 1, 1], 9), ("reflect", [0, 0, 2, 1, 0, 0, 1, 3], 7),
    ("edge", [0, 0, 1, 2, 0, 0, 3, 1], 5), ("edge", [0, 0, 4, 0, 0, 0, 0, 4], 2),
    ("reflect", [0, 0, 1, 1, 0, 0, 1, 1], 2)])
@pytest.mark.parametrize("residual", [False, True])
def test_folded_padding_is_its_producers_epilogue(mode, pads, side, residual):
    """Edge and reflect padding of the instance normalisation's result: the kernel writes
    the interior at its padded place and then copies the border from it, so no kernel of
    its own pads. Where the unpadded result is read too (a residual sum) the padding
    stays a kernel: one kernel writing both ran three times slower (Candy's residual
    sums, read by the next block's padding and its sum)."""
    channels = 11
    model = padded_block(channels, mode, pads, residual)
    batch = "batch" if side == 9 else 2  # symbolic, or every size known
    compiled = treadle.compile(model, shapes={"x": [batch, channels, side, side]})
    steps = [s.name for s in compiled.executable.steps if s.kernel is not None]
    assert any(s.startswith("Pad") for s in steps) == residual, steps
    for x in [random_array((2, channels, side, side), seed=side)] + (
            [random_array((1, channels, side, side), seed=1)] if batch == "batch" else []):
        for actual, expected in zip(compiled(x), run_onnxruntime(model, {"x": x}),
                                    strict=True):
            assert_close(actual, expected, reduction=9 * channels)
