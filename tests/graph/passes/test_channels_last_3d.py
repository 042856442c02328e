"""channels_last on 3-D layers: a video network's convolutions and pools run
N x D x H x W x C, the transposes between consecutive layers cancel, and the network
still matches ONNX Runtime with a symbolic batch."""
import pytest
from onnx import helper

from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array, run_onnxruntime
import treadle
from treadle.frontend.onnx import from_onnx
from treadle.graph.optimize import optimize


def node(op, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs, name=outputs[0], **attrs)


def video_net(depth: int, side: int, c: int = 16):
    """R3D-18 in miniature: a 3x7x7 stem of stride (1, 2, 2) with BatchNorm and ReLU, a
    3-D max pool, a residual block of two 3x3x3 convolutions, a block of stride 2 whose
    shortcut is a 1x1x1 convolution, a 3-D average pool and the global pool."""
    nodes = [
        node("Conv", ["x", "w_stem"], ["stem"], kernel_shape=[3, 7, 7], strides=[1, 2, 2],
             pads=[1, 3, 3, 1, 3, 3]),
        node("BatchNormalization", ["stem", "g", "beta", "mean", "var"], ["bn"]),
        node("Relu", ["bn"], ["r0"]),
        node("MaxPool", ["r0"], ["p0"], kernel_shape=[3, 3, 3], strides=[1, 2, 2],
             pads=[1] * 6),
        node("Conv", ["p0", "w1"], ["c1"], pads=[1] * 6),
        node("Relu", ["c1"], ["r1"]),
        node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1] * 6),
        node("Add", ["c2", "p0"], ["res1"]),
        node("Relu", ["res1"], ["r2"]),
        node("Conv", ["r2", "w3"], ["c3"], strides=[2] * 3, pads=[1] * 6),
        node("Relu", ["c3"], ["r3"]),
        node("Conv", ["r3", "w4"], ["c4"], pads=[1] * 6),
        node("Conv", ["r2", "w_down"], ["down"], strides=[2] * 3),
        node("Add", ["c4", "down"], ["res2"]),
        node("Relu", ["res2"], ["r4"]),
        node("AveragePool", ["r4"], ["p1"], kernel_shape=[1, 3, 3], pads=[0, 1, 1, 0, 1, 1]),
        node("GlobalAveragePool", ["p1"], ["y"]),
    ]
    weights = {
        "w_stem": random_array((c, 3, 3, 7, 7), seed=1),
        "g": random_array((c,), seed=2, low=0.5, high=1.5), "beta": random_array((c,), seed=3),
        "mean": random_array((c,), seed=4), "var": random_array((c,), seed=5, low=0.5),
        "w1": random_array((c, c, 3, 3, 3), seed=6), "w2": random_array((c, c, 3, 3, 3), seed=7),
        "b2": random_array((c,), seed=8), "w3": random_array((2 * c, c, 3, 3, 3), seed=9),
        "w4": random_array((2 * c, 2 * c, 3, 3, 3), seed=10),
        "w_down": random_array((2 * c, c, 1, 1, 1), seed=11),
    }
    return make_model(nodes, [tensor("x", ["n", 3, depth, side, side])],
                      [tensor("y", ["n", 2 * c, 1, 1, 1])], weights)


def test_video_layers_run_channels_last_and_only_the_ends_transpose():
    graph = optimize(from_onnx(video_net(5, 13)))
    types = [n.op_type for n in graph.nodes]
    assert not {"Conv", "MaxPool", "AveragePool"} & set(types), types
    assert types.count("ChannelsLastConv") == 6
    assert types.count("ChannelsLastMaxPool") == types.count("ChannelsLastAveragePool") == 1
    # The clip is transposed once; only the global pool's N x 1 x 1 x 1 x C result goes
    # back to N x C x D x H x W.
    transposes = [n for n in graph.nodes if n.op_type == "Transpose"]
    assert len(transposes) == 2, types
    assert transposes[0].inputs[0] is graph.inputs[0]
    assert transposes[0].attrs["perm"] == [0, 2, 3, 4, 1]
    assert transposes[1].inputs[0].producer.op_type == "ReduceMean"
    assert transposes[1].attrs["perm"] == [0, 4, 1, 2, 3]
    # Weights are kernel-major: D x H x W x C/group x M.
    stem = next(n for n in graph.nodes if n.op_type == "ChannelsLastConv")
    assert tuple(stem.inputs[1].shape) == (3, 7, 7, 3, 16)


@pytest.mark.parametrize("depth,side", [(1, 7), (3, 13), (5, 7)])
def test_video_net_matches_onnxruntime(depth, side):
    model = video_net(depth, side)
    compiled = treadle.compile(model)
    for batch in (1, 2):
        x = random_array((batch, 3, depth, side, side), seed=depth * side + batch)
        expected = run_onnxruntime(model, {"x": x})[0]
        assert_close(compiled(x)[0], expected, reduction=27 * 32 * 4)


def conv3d_model(cin, cout, depth, side, kernel, pads, *, stride=1, bias=True):
    """Conv(3-D) -> Relu -> Add(the Relu): a layer with an epilogue and a reader, over a
    clip of symbolic batch."""
    weights = {"w": random_array((cout, cin, *kernel), seed=1)}
    if bias:
        weights["b"] = random_array((cout,), seed=2)
    nodes = [node("Conv", ["x", *weights], ["c"], kernel_shape=list(kernel), pads=pads * 2,
                  strides=[stride] * 3),
             node("Relu", ["c"], ["r"]), node("Add", ["r", "r"], ["y"])]
    return make_model(nodes, [tensor("x", ["n", cin, depth, side, side])], [tensor("y", None)],
                      weights)


FOLDED = [  # input, output channels, depth, side, kernel, pads (begin = end), bias, taps
    (16, 16, 5, 13, (3, 3, 3), [1, 1, 1], True, 3),
    (17, 32, 3, 13, (3, 3, 3), [0, 1, 1], False, 3),  # no depth padding
    # One slice: conv_taps cuts the depth taps that read padding only.
    (16, 16, 1, 15, (3, 3, 3), [1, 1, 1], True, 1),
    (8, 32, 5, 13, (1, 3, 3), [0, 1, 1], True, 1),  # R(2+1)D's spatial convolution
    (16, 16, 3, 13, (2, 3, 3), [1, 1, 1], False, 2),  # an even depth: output depth 4
]


@pytest.mark.parametrize("cin,cout,depth,side,kernel,pads,bias,taps", FOLDED)
def test_stride_one_3x3_filters_fold_the_depth_into_winograd(cin, cout, depth, side, kernel,
                                                              pads, bias, taps):
    """A D' x 3 x 3 convolution at stride 1 is a Winograd convolution of every depth slice
    to D' x M channels and a sum over the depth taps, which ONNX Runtime's numbers
    confirm (Winograd's rounding: the tolerance of its 2-D tests)."""
    model = conv3d_model(cin, cout, depth, side, kernel, pads, bias=bias)
    graph = optimize(from_onnx(model))
    types = [n.op_type for n in graph.nodes]
    assert "ChannelsLastConv" not in types and types.count("WinogradConv") == 1, types
    (conv,) = [n for n in graph.nodes if n.op_type == "WinogradConv"]
    assert conv.inputs[0].rank == 4 and conv.outputs[0].shape[-1] == taps * cout
    compiled = treadle.compile(model)
    for batch in (1, 2):
        x = random_array((batch, cin, depth, side, side), seed=batch)
        expected = run_onnxruntime(model, {"x": x})[0]
        assert_close(compiled(x)[0], expected, reduction=27 * cin * 16)


@pytest.mark.parametrize("cout,options", [(17, {}), (16, {"stride": 2})])
def test_other_3d_convolutions_stay_one_gemm(cout, options):
    """Where Winograd would not take the folded convolution (3 x 17 output channels are
    no whole panels; a stride), the 3-D convolution stays one implicit GEMM."""
    model = conv3d_model(16, cout, 5, 13, (3, 3, 3), [1, 1, 1], **options)
    types = [n.op_type for n in optimize(from_onnx(model)).nodes]
    assert types.count("ChannelsLastConv") == 1 and "WinogradConv" not in types, types


def test_only_the_cpu_folds_the_depth():
    """The CUDA target has no Winograd convolution: there the folding would add a pass
    over D' outputs for nothing, so its 3-D convolutions stay one implicit GEMM."""
    model = conv3d_model(16, 16, 5, 13, (3, 3, 3), [1, 1, 1])
    types = [n.op_type for n in optimize(from_onnx(model), "cuda").nodes]
    assert types.count("ChannelsLastConv") == 1 and "Slice" not in types, types


def test_folding_takes_a_symbolic_batch_and_image():
    model = make_model([node("Conv", ["x", "w"], ["y"], pads=[1] * 6)],
                       [tensor("x", ["n", 16, 5, "h", "w"])], [tensor("y", None)],
                       {"w": random_array((16, 16, 3, 3, 3), seed=1)})
    assert "WinogradConv" in [n.op_type for n in optimize(from_onnx(model)).nodes]
    compiled = treadle.compile(model)
    for batch, height, width in ((1, 7, 9), (2, 13, 4)):
        x = random_array((batch, 16, 5, height, width), seed=height)
        expected = run_onnxruntime(model, {"x": x})[0]
        assert_close(compiled(x)[0], expected, reduction=27 * 16 * 16,
                     context=f"{batch} x {height} x {width}")
