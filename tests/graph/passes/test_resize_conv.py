"""resize_conv: a 1x1 convolution of enlarged (and concatenated) images convolves before
the enlarging, and the numbers still match ONNX Runtime."""
import numpy as np
import pytest
from onnx import helper

from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array, run_onnxruntime
from treadle.compiler import compile_graph
from treadle.frontend.onnx import from_onnx
from treadle.graph.optimize import optimize
from treadle.graph.passes.canonicalize import canonicalize
from treadle.graph.passes.fold_constants import fold_constants
from treadle.graph.passes.resize_conv import resize_conv

SIDE = (11, 13)  # the decoder's output image: odd and prime


def node(op, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs, name=outputs[0], **attrs)


def decoder(out_channels: int, modes=("linear", "nearest")):
    """Segformer's decoder in miniature: an image at full size and two smaller ones
    resized to it (sizes given), concatenated, fused by a 1x1 convolution with a bias."""
    sizes = np.array([1, 8, *SIDE], np.int64)
    nodes = [node("Resize", ["b", "", "", "sizes"], ["rb"], mode=modes[0]),
             node("Resize", ["c", "", "", "sizes"], ["rc"], mode=modes[1]),
             node("Concat", ["a", "rb", "rc"], ["cat"], axis=1),
             node("Conv", ["cat", "w", "bias"], ["conv"], kernel_shape=[1, 1]),
             node("Relu", ["conv"], ["y"])]
    inputs = [tensor("a", [1, 6, *SIDE]), tensor("b", [1, 8, 5, 7]), tensor("c", [1, 8, 3, 4])]
    weights = {"sizes": sizes, "w": random_array((out_channels, 22, 1, 1), seed=1),
               "bias": random_array((out_channels,), seed=2)}
    feeds = {"a": random_array((1, 6, *SIDE), seed=3), "b": random_array((1, 8, 5, 7), seed=4),
             "c": random_array((1, 8, 3, 4), seed=5)}
    return make_model(nodes, inputs, [tensor("y", None)], weights), feeds


def moved(model):
    """The graph after the pass, before channels-last layout."""
    return resize_conv(fold_constants(canonicalize(from_onnx(model))))


def resizes(graph):
    return [n for n in graph.nodes if n.op_type == "Resize"]


@pytest.mark.parametrize("modes", [("linear", "nearest"), ("nearest", "linear")])
def test_a_decoder_convolves_each_part_before_resizing_it(modes):
    model, feeds = decoder(5, modes)
    graph = moved(model)
    assert "Concat" not in {n.op_type for n in graph.nodes}
    # Both resizes now enlarge the convolution's 5 channels, not the parts' 8.
    assert [r.inputs[0].shape[1] for r in resizes(graph)] == [5, 5]
    assert all(r.inputs[0].producer.op_type == "Conv" for r in resizes(graph))
    convs = [n for n in graph.nodes if n.op_type == "Conv"]
    assert sorted(tuple(c.outputs[0].shape[2:]) for c in convs) == [(3, 4), (5, 7), SIDE]
    expected = run_onnxruntime(model, feeds)[0]
    assert_close(compile_graph(from_onnx(model))(**feeds)[0], expected, reduction=22)


def test_a_convolution_adding_channels_keeps_the_model_order():
    """To more channels than a part has, resizing after the convolution would cost more:
    the concatenation stays."""
    model, feeds = decoder(12)
    graph = moved(model)
    assert "Concat" in {n.op_type for n in graph.nodes}
    assert [r.inputs[0].shape[1] for r in resizes(graph)] == [8, 8]
    assert_close(compile_graph(from_onnx(model))(**feeds)[0],
                 run_onnxruntime(model, feeds)[0], reduction=22)


def test_a_resize_read_elsewhere_is_kept():
    """A resized part that another output reads is still computed; the pass leaves its
    part of the convolution after it."""
    model, feeds = decoder(5)
    model.graph.output.append(tensor("rb", None))
    graph = moved(model)
    assert sorted(r.inputs[0].shape[1] for r in resizes(graph)) == [5, 8]
    actual = compile_graph(from_onnx(model))(**feeds)
    for got, want in zip(actual, run_onnxruntime(model, feeds)):
        assert_close(got, want, reduction=22)


@pytest.mark.parametrize("batch", [1, 3])
def test_one_resize_by_scales_with_a_symbolic_batch(batch):
    """Conv(Resize(x)) without a concatenation, the resize by scales (2x, align_corners),
    a symbolic batch: the convolution runs on the small image."""
    nodes = [node("Resize", ["x", "", "scales"], ["r"], mode="linear",
                  coordinate_transformation_mode="align_corners"),
             node("Conv", ["r", "w", "bias"], ["y"], kernel_shape=[1, 1])]
    model = make_model(nodes, [tensor("x", ["n", 7, 5, 3])], [tensor("y", None)],
                       {"scales": np.array([1, 1, 2, 2], np.float32),
                        "w": random_array((4, 7, 1, 1), seed=6),
                        "bias": random_array((4,), seed=7)})
    graph = moved(model)
    (resize,) = resizes(graph)
    assert resize.inputs[0].producer.op_type == "Conv"
    assert resize.inputs[0].shape[1:] == (4, 5, 3)
    assert [n.op_type for n in optimize(from_onnx(model)).nodes].count("Resize") == 1
    feeds = {"x": random_array((batch, 7, 5, 3), seed=8)}
    assert_close(compile_graph(from_onnx(model))(**feeds)[0],
                 run_onnxruntime(model, feeds)[0], reduction=7)


def test_a_crop_reading_outside_the_image_is_kept():
    """tf_crop_and_resize fills what lies outside the input with extrapolation_value,
    which a convolution moved before it would not see: the resize stays first."""
    nodes = [node("Resize", ["x", "roi", "", "sizes"], ["r"], mode="linear",
                  coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=3.0),
             node("Conv", ["r", "w", "bias"], ["y"], kernel_shape=[1, 1])]
    model = make_model(nodes, [tensor("x", [1, 7, 5, 3])], [tensor("y", None)],
                       {"roi": np.array([0, 0, -0.5, 0, 1, 1, 1, 1.5], np.float32),
                        "sizes": np.array([1, 7, 11, 13], np.int64),
                        "w": random_array((4, 7, 1, 1), seed=6),
                        "bias": random_array((4,), seed=7)})
    (resize,) = resizes(moved(model))
    assert resize.inputs[0].producer is None
    feeds = {"x": random_array((1, 7, 5, 3), seed=8)}
    assert_close(compile_graph(from_onnx(model))(**feeds)[0],
                 run_onnxruntime(model, feeds)[0], reduction=7)
