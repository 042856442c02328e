"""Grouped convolutions run as a batch of matrix products over groups
(ChannelsLastGroupConv), against ONNX Runtime: groups 1, 2, 3, 32, C/2 and C (depthwise),
odd channel counts, strides, dilations, biases, fused neighbours and a symbolic batch."""
import numpy as np
import onnx
import pytest
from onnx import helper

from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array, run_onnxruntime
import treadle
from treadle.frontend.onnx import from_onnx
from treadle.graph.optimize import optimize


def grouped_model(channels, out_channels, group, side, *, kernel=3, stride=1, dilation=1,
                  pad=1, bias=True, batch="batch"):
    """Conv(group) -> Relu -> Conv 1x1: the grouped layer with an epilogue and a reader."""
    w = random_array((out_channels, channels // group, kernel, kernel), seed=1)
    w2 = random_array((5, out_channels, 1, 1), seed=3)
    inits = {"w": w, "w2": w2}
    inputs = ["x", "w"]
    if bias:
        inits["b"] = random_array((out_channels,), seed=2)
        inputs.append("b")
    nodes = [helper.make_node("Conv", inputs, ["c"], name="grouped", group=group,
                              strides=[stride, stride], dilations=[dilation, dilation],
                              pads=[pad] * 4),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="project")]
    out = (side + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    return make_model(nodes, [tensor("x", [batch, channels, side, side])],
                      [tensor("y", [batch, 5, out, out])], initializers=inits)


CASES = [  # channels, out channels, group, side, options
    (6, 6, 1, 9, {}),
    (6, 10, 2, 9, {}),
    (9, 12, 3, 11, {"stride": 2}),
    (64, 64, 32, 7, {}),
    (34, 34, 17, 13, {"dilation": 2, "pad": 2}),  # C/2 groups, odd
    (7, 7, 7, 10, {"bias": False}),  # depthwise
    (48, 96, 3, 5, {"kernel": 1, "pad": 0}),
    (40, 40, 5, 6, {"kernel": 5, "pad": 2, "stride": 2}),
]


@pytest.mark.parametrize("channels,out_channels,group,side,options", CASES)
def test_grouped_conv_matches_onnxruntime(channels, out_channels, group, side, options):
    model = grouped_model(channels, out_channels, group, side, **options)
    compiled = treadle.compile(model)
    for batch in (1, 3):
        x = random_array((batch, channels, side, side), seed=batch)
        (expected,) = run_onnxruntime(model, {"x": x})
        (actual,) = compiled(x)
        assert_close(actual, expected, reduction=channels // group * 9 + out_channels)


@pytest.mark.parametrize("group,expected", [(1, "ChannelsLastConv"),
                                            (4, "ChannelsLastGroupConv"),
                                            (32, "ChannelsLastConv")])
def test_grouped_conv_becomes_a_batch_over_groups(group, expected):
    """Several channels per group: the group-axis form; depthwise keeps the window form."""
    graph = optimize(from_onnx(grouped_model(32, 32, group, 8)))
    convs = [n.op_type for n in graph.nodes if "Conv" in n.op_type]
    assert convs[0] == expected


def test_grouped_conv_fuses_its_padding_relu_and_neighbours():
    model = grouped_model(32, 32, 4, 12)
    compiled = treadle.compile(model)
    kernels = [s for s in compiled.executable.steps if s.kernel is not None]
    # to_nhwc + padding copy, the grouped GEMM with its ReLU, the 1x1 projection
    assert len(kernels) <= 3


@pytest.mark.parametrize("channels,group,merged", [(128, 32, 8), (64, 8, 4), (64, 4, 4),
                                                    (12, 3, 1)])
def test_narrow_groups_merge_into_block_diagonal_groups(channels, group, merged):
    """Groups of fewer than 16 output channels run several to a product, their weights
    block-diagonal: zero between neighbours, each block the group's own."""
    model = grouped_model(channels, channels, group, 5)
    graph = optimize(from_onnx(model))
    (conv,) = [n for n in graph.nodes if n.op_type == "ChannelsLastGroupConv"]
    weight = conv.inputs[1].data
    width = channels // merged
    assert weight.shape == (merged, 3, 3, width, width)
    per_group = channels // group
    original = model.graph.initializer[0]
    assert original.name == "w"
    w = onnx.numpy_helper.to_array(original)  # M x C/G x 3 x 3
    for g in range(group):
        block = weight[g * per_group // width, :, :,
                       g * per_group % width:g * per_group % width + per_group,
                       g * per_group % width:g * per_group % width + per_group]
        expected = w[g * per_group:(g + 1) * per_group].transpose(2, 3, 1, 0)
        np.testing.assert_array_equal(block, expected)
    nonzero = (weight != 0).sum()
    assert nonzero == (w != 0).sum()
