"""channels_last: convolutions and pools run N x spatial x C, the transposes between
consecutive layers cancel, and the network still matches ONNX Runtime."""
import numpy as np
import pytest
from onnx import helper

from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array, run_onnxruntime
from treadle.compiler import compile_graph
from treadle.frontend.onnx import from_onnx
from treadle.graph.optimize import optimize


def node(op, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs, name=outputs[0], **attrs)


def small_net(side: int, pads_input: bool = True):
    """Conv-BN-ReLU, max pool, a residual 3x3 block, a 1x1 branch joined by Concat, an
    average pool and a global pool: the layers of ResNet and Inception in miniature."""
    c = 8
    nodes = [
        node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        node("BatchNormalization", ["c0", "g", "beta", "mean", "var"], ["bn"]),
        node("Relu", ["bn"], ["r0"]),
        node("MaxPool", ["r0"], ["p0"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        node("Conv", ["p0", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        node("Mul", ["c1", "scale"], ["s1"]),
        node("Add", ["s1", "p0"], ["res"]),
        node("Relu", ["res"], ["r1"]),
        node("Conv", ["r1", "w2"], ["c2"], strides=[1, 1]),
        node("Sigmoid", ["c2"], ["g2"]),
        node("Concat", ["r1", "g2"], ["cat"], axis=1),
        node("AveragePool", ["cat"], ["p1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        node("Conv", ["p1", "w3"], ["c3"], group=2 * c, pads=[1, 1, 1, 1]),
        node("GlobalAveragePool", ["c3"], ["y"]),
    ]
    weights = {
        "w0": random_array((c, 3, 3, 3), seed=1), "b0": random_array((c,), seed=2),
        "g": random_array((c,), seed=3, low=0.5, high=1.5), "beta": random_array((c,), seed=4),
        "mean": random_array((c,), seed=5), "var": random_array((c,), seed=6, low=0.5),
        "w1": random_array((c, c, 3, 3), seed=7), "scale": random_array((c, 1, 1), seed=8),
        "w2": random_array((c, c, 1, 1), seed=9), "w3": random_array((2 * c, 1, 3, 3), seed=10),
    }
    return make_model(nodes, [tensor("x", ["n", 3, side, side])], [tensor("y", ["n", 2 * c, 1, 1])],
                      weights)


def op_types(graph):
    return [n.op_type for n in graph.nodes]


def test_layers_run_channels_last_and_only_the_ends_transpose():
    graph = optimize(from_onnx(small_net(11)))
    types = op_types(graph)
    assert not {"Conv", "MaxPool", "AveragePool"} & set(types)
    assert types.count("ChannelsLastConv") == 4
    # The input is transposed once, then padded channels-last; the global pool reduces
    # the channels-last layer, and only its N x 1 x 1 x C result goes back to NCHW.
    transposes = [n for n in graph.nodes if n.op_type == "Transpose"]
    assert len(transposes) == 2, types
    assert transposes[0].inputs[0] is graph.inputs[0]
    assert transposes[1].inputs[0].producer.op_type == "ReduceMean"
    assert transposes[1] is graph.nodes[-1]
    # Padding is on the channels-last side: only the first Pad reads a transpose, the
    # input's.
    pads = [n for n in graph.nodes if n.op_type == "Pad"]
    assert pads and pads[0].inputs[0].producer is transposes[0]
    assert all(p.inputs[0].producer.op_type != "Transpose" for p in pads[1:])


@pytest.mark.parametrize("channels", [3, 8])
def test_a_convolution_to_few_channels_stays_channels_first(channels):
    """Few output channels: the GEMM is channels x pixels, not pixels x channels."""
    nodes = [node("Relu", ["x"], ["r"]), node("Conv", ["r", "w"], ["y"], pads=[1, 1, 1, 1])]
    model = make_model(nodes, [tensor("x", [1, 8, 13, 11])], [tensor("y", None)],
                       {"w": random_array((channels, 8, 3, 3), seed=1)})
    graph = optimize(from_onnx(model))
    assert ("Conv" in op_types(graph)) == (channels < 8)
    x = random_array((1, 8, 13, 11), seed=2)
    assert_close(compile_graph(from_onnx(model))(x)[0], run_onnxruntime(model, {"x": x})[0],
                 reduction=72)


@pytest.mark.parametrize("batch,side", [(1, 11), (2, 7), (1, 16)])
def test_small_net_matches_onnxruntime(batch, side):
    model = small_net(side)
    x = random_array((batch, 3, side, side), seed=side)
    expected = run_onnxruntime(model, {"x": x})[0]
    actual = compile_graph(from_onnx(model))(x)[0]
    assert_close(actual, expected, reduction=9 * 6 * 4)


def test_non_constant_broadcast_operand_keeps_the_transpose():
    nodes = [node("Conv", ["x", "w"], ["c"]), node("Mul", ["c", "s"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, 4, 5, 7]), tensor("s", [8, 1, 1])],
                       [tensor("y", [1, 8, 5, 7])], {"w": random_array((8, 4, 1, 1), seed=1)})
    graph = optimize(from_onnx(model))
    mul = next(n for n in graph.nodes if n.op_type == "Mul")
    assert mul.inputs[0].producer.op_type == "Transpose"
    feeds = {"x": random_array((1, 4, 5, 7), seed=2), "s": random_array((8, 1, 1), seed=3)}
    assert_close(compile_graph(from_onnx(model))(**feeds)[0],
                 run_onnxruntime(model, feeds)[0], reduction=4)


@pytest.mark.parametrize("batch,channels,side", [(1, 16, 7), (2, 24, 5), (1, 17, 13)])
def test_channel_attention_scales_the_map_channels_last(batch, channels, side):
    """ECA's attention, sigmoid(1-D convolution over the pooled channels), scales the
    convolution's map: the scale's N x C x 1 x 1 values are transposed, not the map, and
    the product stays channels-last between the convolutions."""
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             node("GlobalAveragePool", ["c"], ["pooled"]),
             node("Squeeze", ["pooled", "last_two"], ["squeezed"]),
             node("Unsqueeze", ["squeezed", "second"], ["row"]),
             node("Conv", ["row", "w_eca"], ["mixed"], pads=[2, 2]),
             node("Squeeze", ["mixed", "second"], ["flat"]),
             node("Unsqueeze", ["flat", "last_two"], ["scale_map"]),
             node("Sigmoid", ["scale_map"], ["gate"]),
             node("Mul", ["c", "gate"], ["scaled"]),
             node("Conv", ["scaled", "w2"], ["y"])]
    weights = {"w": random_array((channels, 8, 3, 3), seed=1),
               "w_eca": random_array((1, 1, 5), seed=2),
               "w2": random_array((16, channels, 1, 1), seed=3),
               "last_two": np.array([2, 3], np.int64), "second": np.array([1], np.int64)}
    model = make_model(nodes, [tensor("x", [batch, 8, side, side])], [tensor("y", None)],
                       weights)
    graph = optimize(from_onnx(model))
    mul = next(n for n in graph.nodes if n.op_type == "Mul")
    big, gate = sorted(mul.inputs, key=lambda t: -len([d for d in t.shape if d != 1]))
    assert big.producer.op_type != "Transpose" and big.shape[-1] == channels
    assert gate.producer.op_type == "Transpose" and list(gate.shape) == [batch, 1, 1, channels]
    x = random_array((batch, 8, side, side), seed=4)
    assert_close(compile_graph(from_onnx(model))(x)[0], run_onnxruntime(model, {"x": x})[0],
                 reduction=72 * channels)


def test_other_transposes_stay_where_the_model_put_them():
    """An attention-style transpose is not a layout change and does not sink."""
    nodes = [node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]), node("Relu", ["t"], ["y"])]
    model = make_model(nodes, [tensor("x", [2, 3, 4, 5])], [tensor("y", [2, 4, 3, 5])])
    assert op_types(optimize(from_onnx(model))) == ["Transpose", "Relu"]
