"""conv_taps: a convolution's taps that read only padding for every output are cut from
its weights, the padding shrinking by what they spanned (cropping the input where it
shrinks below zero), and one whose taps mostly read padding is a sum of its taps over
the outputs each reaches; the compiled result equals ONNX Runtime's at odd sizes and strides,
dilations, asymmetric pads, groups and 1-D to 3-D."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import treadle
from tests.harness import run_onnxruntime
from treadle.frontend.onnx import from_onnx
from treadle.graph.passes.canonicalize import canonicalize
from treadle.graph.passes import conv_taps
from treadle.graph.passes.conv_taps import live_taps


def conv_model(image, channels, out_channels, kernel, *, dilations, pads, strides,
               group=1, bias=True):
    rank = len(image)
    rng = np.random.default_rng(sum(image) + sum(kernel))
    weight = rng.standard_normal((out_channels, channels // group, *kernel)).astype(np.float32)
    inits = [numpy_helper.from_array(weight, "w")]
    names = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(out_channels)
                                             .astype(np.float32), "b"))
        names.append("b")
    node = helper.make_node("Conv", names, ["y"], dilations=dilations, pads=pads,
                            strides=strides, group=group, kernel_shape=list(kernel))
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                       [1, channels, *image])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    assert rank == len(kernel)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def compiled_kernels(model) -> list[tuple[int, ...]]:
    """The kernel sizes of the convolutions left after canonicalisation."""
    graph = canonicalize(from_onnx(model))
    return [tuple(op.inputs[1].shape[2:]) for op in graph.nodes if op.op_type == "Conv"]


def test_a_dilation_past_the_image_leaves_the_centre_tap():
    # DeepLabV3's ASPP branch at dilation 36 on a 28x28 map: a 1x1 convolution.
    model = conv_model((28, 28), 16, 8, (3, 3), dilations=[36, 36], pads=[36] * 4,
                       strides=[1, 1])
    assert compiled_kernels(model) == [(1, 1)]
    # At dilation 12 every tap reaches the 28x28 image, the outer ones for 16 rows or
    # columns: a sum of nine 1x1 convolutions; on 11x11 only the centre tap reaches it.
    model = conv_model((28, 28), 64, 64, (3, 3), dilations=[12, 12], pads=[12] * 4,
                       strides=[1, 1])
    assert compiled_kernels(model) == [(1, 1)] * 9
    # With few channels the nine kernels would cost more than they save.
    model = conv_model((28, 28), 16, 8, (3, 3), dilations=[12, 12], pads=[12] * 4,
                       strides=[1, 1])
    assert compiled_kernels(model) == [(3, 3)]
    # Padded by one, a 3x3's taps reach almost every output: it stays one convolution.
    model = conv_model((28, 28), 64, 64, (3, 3), dilations=[1, 1], pads=[1] * 4,
                       strides=[1, 1])
    assert compiled_kernels(model) == [(3, 3)]
    model = conv_model((11, 11), 16, 8, (3, 3), dilations=[12, 12], pads=[12] * 4,
                       strides=[1, 1])
    assert compiled_kernels(model) == [(1, 1)]
    model = conv_model((7, 10), 16, 8, (3, 3), dilations=[5, 1], pads=[2, 1, 2, 1],
                       strides=[1, 1])
    assert compiled_kernels(model) == [(1, 3)]


@pytest.mark.parametrize("size,out,kernel,stride,dilation,before,expected", [
    (28, 28, 3, 1, 36, 36, (1, 1)),
    (28, 28, 3, 1, 12, 12, (0, 2)),
    (9, 5, 3, 2, 6, 6, (0, 2)),       # stride 2 brings the first tap to row 0
    (2, 2, 3, 4, 2, 2, (1, 1)),       # stride 4 steps over the image from either outer tap
    (7, 7, 5, 1, 4, 8, (1, 3)),
    (5, 3, 3, 1, 9, 0, (0, 0)),       # only the first tap lies inside
    (4, 1, 3, 1, 5, 12, (0, -1)),     # an output of padding alone
])
def test_live_taps(size, out, kernel, stride, dilation, before, expected):
    assert live_taps(size, out, kernel, stride, dilation, before) == expected
    rows = [[o * stride - before + t * dilation for o in range(out)] for t in range(kernel)]
    reaching = [t for t in range(kernel) if any(0 <= r < size for r in rows[t])]
    assert expected == ((reaching[0], reaching[-1]) if reaching else (0, -1))


CASES = [
    # image, kernel, dilations, pads (before..., after...), strides, group
    ((28, 28), (3, 3), [36, 36], [36, 36, 36, 36], [1, 1], 1),
    ((13, 11), (3, 3), [12, 7], [12, 7, 12, 7], [1, 1], 1),
    ((13, 11), (3, 3), [12, 12], [12, 12, 12, 12], [2, 3], 1),
    ((17, 9), (3, 5), [9, 4], [1, 2, 18, 14], [1, 2], 1),
    ((7, 10), (3, 3), [5, 1], [2, 1, 2, 1], [1, 1], 1),       # rows cropped, 3 a side
    ((23,), (3,), [29], [29, 29], [1], 1),
    ((19, 19), (3, 3), [24, 24], [24, 24, 24, 24], [1, 1], 6),  # grouped
    ((13, 11), (3, 3), [7, 5], [7, 5, 7, 5], [1, 1], 4),       # grouped, by taps
    ((19, 19), (3, 3), [24, 24], [24, 24, 24, 24], [1, 1], 12),  # depthwise
    ((5, 7, 6), (3, 3, 3), [6, 2, 7], [6, 2, 7, 6, 2, 7], [1, 2, 1], 1),
]


@pytest.mark.parametrize("image,kernel,dilations,pads,strides,group", CASES)
def test_against_onnxruntime(image, kernel, dilations, pads, strides, group, monkeypatch):
    # Small enough to run quickly, and summed by taps wherever that saves any work.
    monkeypatch.setattr(conv_taps, "MIN_SAVED", 0)
    model = conv_model(image, 12, 12, kernel, dilations=dilations, pads=pads,
                       strides=strides, group=group)
    x = np.random.default_rng(3).standard_normal((1, 12, *image)).astype(np.float32)
    (expected,) = run_onnxruntime(model, {"x": x})
    (got,) = treadle.compile(model)(x)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_a_sum_of_taps_without_bias(monkeypatch):
    monkeypatch.setattr(conv_taps, "MIN_SAVED", 0)
    model = conv_model((13, 11), 12, 5, (3, 3), dilations=[12, 7], pads=[12, 7, 12, 7],
                       strides=[1, 1], bias=False)
    assert compiled_kernels(model) == [(1, 1)] * 9
    x = np.random.default_rng(4).standard_normal((1, 12, 13, 11)).astype(np.float32)
    (expected,) = run_onnxruntime(model, {"x": x})
    np.testing.assert_allclose(treadle.compile(model)(x)[0], expected, rtol=1e-4, atol=1e-4)
