"""3-D convolution and pooling run channels-last (N x D x H x W x C) on the CPU templates
of their 2-D twins: a convolution is an implicit GEMM whose reduction has the depth as
one more tap axis, a depthwise convolution or a pool is a window. Numbers against ONNX
Runtime at odd and prime sizes (depths 1, 3, 5; sides 7 and 13; 3, 17 and 64
channels), strides, dilations and groups, with a symbolic batch and a symbolic depth."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array, run_onnxruntime
import treadle
from treadle.frontend.onnx import from_onnx
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.optimize import optimize
from treadle.graph.tensor import Tensor, constant
from treadle.ir.functor import walk
from treadle.ir.stmt import For
from treadle.ir.verify import verify
from treadle.schedule.select import schedule_operator, select_template
from treadle.schedule.templates.gemm import GEMM
from treadle.schedule.templates.window_cpu import match_window
from treadle.target.cpu import host


def triple(v) -> list[int]:
    return list(v) if isinstance(v, tuple) else [v] * 3


def conv_model(cin, cout, size, kernel, *, stride=1, pad=1, dilation=1, group=1, bias=True,
               depth=None):
    """One Conv over an N x C x D x H x W clip of symbolic batch (and ``depth``, a name,
    for a symbolic depth)."""
    kernel = triple(kernel)
    weights = {"w": random_array((cout, cin // group, *kernel), seed=1)}
    if bias:
        weights["b"] = random_array((cout,), seed=2)
    conv = helper.make_node("Conv", ["x", *weights], ["y"], name="conv", group=group,
                            kernel_shape=kernel, strides=triple(stride),
                            dilations=triple(dilation), pads=triple(pad) * 2)
    return make_model([conv], [tensor("x", ["n", cin, depth or size[0], *size[1:]])],
                      [tensor("y", None)], weights)


def pool_model(op, channels, size, kernel, stride, pad, **attrs):
    pool = helper.make_node(op, ["x"], ["y"], name="pool", kernel_shape=triple(kernel),
                            strides=triple(stride), pads=triple(pad) * 2, **attrs)
    opset = 19 if "dilations" in attrs else 17  # AveragePool's dilations: opset 19
    return make_model([pool], [tensor("x", ["n", channels, *size])], [tensor("y", None)],
                      opset=opset)


def layer_templates(model) -> list[tuple[str, str]]:
    """(op type, template) of every convolution and pool of the optimised graph."""
    graph = optimize(from_onnx(model))
    return [(n.op_type, select_template(n, host())[0].name) for n in graph.nodes
            if "Conv" in n.op_type or "Pool" in n.op_type]


def check_against_onnxruntime(model, shape, reduction, batches=(1, 2)):
    compiled = treadle.compile(model)
    for batch in batches:
        x = random_array((batch, *shape), seed=batch)
        (expected,) = run_onnxruntime(model, {"x": x})
        assert_close(compiled(x)[0], expected, reduction=reduction, context=f"batch {batch}")


CONVS = [  # input, output channels, (depth, height, width), kernel, options
    (3, 17, (1, 7, 7), 3, {}),
    (3, 64, (5, 13, 13), (3, 7, 7), {"stride": (1, 2, 2), "pad": (1, 3, 3)}),  # R3D's stem
    (17, 64, (3, 7, 13), 3, {"bias": False}),
    (64, 64, (5, 7, 7), 3, {"stride": 2}),
    (17, 19, (5, 13, 7), 1, {"stride": 2, "pad": 0}),  # a downsampling shortcut
    (16, 32, (3, 13, 13), 3, {"dilation": (1, 2, 2), "pad": (1, 2, 2)}),
    (17, 64, (5, 7, 7), (2, 3, 3), {"pad": 0}),
    (64, 64, (1, 7, 7), 3, {}),  # one frame: the depth taps read padding only
]


@pytest.mark.parametrize("cin, cout, size, kernel, options", CONVS)
def test_convolution_is_a_channels_last_gemm_and_matches_onnxruntime(cin, cout, size, kernel,
                                                                     options):
    model = conv_model(cin, cout, size, kernel, **options)
    assert set(layer_templates(model)) == {("ChannelsLastConv", "gemm")}
    check_against_onnxruntime(model, (cin, *size), cin * int(np.prod(triple(kernel))))


@pytest.mark.parametrize("channels, group, expected", [
    (34, 2, ("ChannelsLastGroupConv", "gemm")),
    (64, 16, ("ChannelsLastGroupConv", "gemm")),
    (17, 17, ("ChannelsLastConv", "window")),  # depthwise
    (64, 64, ("ChannelsLastConv", "window")),
])
def test_grouped_convolution_matches_onnxruntime(channels, group, expected):
    """Several channels per group: a batch of GEMMs over groups; one (depthwise): the
    window template, its rows the channels of one output pixel."""
    model = conv_model(channels, channels, (3, 13, 7), 3, group=group, stride=(1, 2, 2))
    assert layer_templates(model) == [expected]
    check_against_onnxruntime(model, (channels, 3, 13, 7), channels // group * 27)


def test_symbolic_depth_matches_onnxruntime():
    model = conv_model(17, 64, (5, 7, 7), 3, depth="d")
    assert layer_templates(model) == [("ChannelsLastConv", "gemm")]
    compiled = treadle.compile(model)
    for depth in (1, 3, 5):
        x = random_array((1, 17, depth, 7, 7), seed=depth)
        (expected,) = run_onnxruntime(model, {"x": x})
        assert_close(compiled(x)[0], expected, reduction=17 * 27, context=f"depth {depth}")


def _channels_last_conv(channels, out_channels, group=1):
    x = Tensor("x", "float32", ["n", 5, 7, 13, channels])
    w = constant(random_array((3, 3, 3, channels // group, out_channels), seed=3))
    y = apply("ChannelsLastConv", [x, w], {"group": group, "pads": [1] * 6})[0]
    (op,) = Graph.from_outputs([x], [y]).nodes
    return op


def test_the_depth_is_one_more_tap_axis_of_the_gemm():
    """The GEMM's rows are the output pixels (batch, depth, height, width), its columns
    the output channels, its reduction the taps (depth, height, width) and the input
    channels, innermost, so that packing copies one pixel's channels at a time."""
    pattern = GEMM.match(_channels_last_conv(17, 64))
    assert pattern is not None and pattern.constant_right
    assert len(pattern.m_axes) == 4 and len(pattern.n_axes) == 1 and not pattern.batch_axes
    assert [e.value for e in pattern.compute.reduce_extents] == [3, 3, 3, 17]


def test_depthwise_window_vectorises_along_the_channels():
    op = _channels_last_conv(64, 64, group=64)
    window = match_window(op.definition[0])
    assert window is not None and [e.value for e in window.reduction.reduce_extents] == \
        [3, 3, 3, 1]
    func = schedule_operator(op, "dw3d", host()).function
    verify(func)
    loops = [n for n in walk(func.body) if isinstance(n, For)]
    assert [n.kind for n in loops].count("parallel") == 1
    assert any(n.kind == "vectorize" for n in loops)


POOLS = [  # op, (depth, height, width), kernel, stride, padding, attributes
    ("MaxPool", (5, 13, 13), 3, 2, 1, {}),
    ("MaxPool", (3, 7, 13), (1, 3, 3), (1, 2, 2), (0, 1, 1), {}),
    ("MaxPool", (5, 7, 7), (2, 3, 3), 2, (0, 1, 1), {"ceil_mode": 1}),
    ("MaxPool", (5, 13, 13), 3, 1, 1, {"dilations": [1, 2, 2]}),
    ("AveragePool", (5, 13, 13), 3, 2, 1, {}),
    ("AveragePool", (5, 13, 13), 3, 2, 1, {"count_include_pad": 1}),
    ("AveragePool", (1, 7, 7), (1, 3, 3), 1, (0, 1, 1), {}),
    ("AveragePool", (5, 7, 13), 2, 2, 0, {"ceil_mode": 1}),
    ("AveragePool", (5, 7, 13), 3, 2, (1, 0, 1), {"ceil_mode": 1, "count_include_pad": 1}),
    ("AveragePool", (5, 13, 7), 2, 1, 1, {"dilations": [2, 2, 1]}),
]


@pytest.mark.parametrize("channels", [3, 64])
@pytest.mark.parametrize("op, size, kernel, stride, pad, attrs", POOLS)
def test_pooling_is_a_channels_last_window_and_matches_onnxruntime(op, size, kernel, stride,
                                                                   pad, attrs, channels):
    """Every pool is a window, an average one whatever it counts: the count of taps
    inside is a closed form of the output position, the division the window's epilogue."""
    model = pool_model(op, channels, size, kernel, stride, pad, **attrs)
    assert layer_templates(model) == [(f"ChannelsLast{op}", "window")]
    check_against_onnxruntime(model, (channels, *size), int(np.prod(triple(kernel))))
