"""fold_linear: a 1x1 convolution of a dense layer's tokens viewed as an image folds into
the layer where that saves products, and the numbers still match ONNX Runtime."""
import numpy as np
import pytest
from onnx import helper

from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array, run_onnxruntime
from treadle.compiler import compile_graph
from treadle.frontend.onnx import from_onnx
from treadle.graph.optimize import optimize

H, W = 5, 7  # the token image: odd and prime sides


def node(op, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs, name=outputs[0], **attrs)


def tokens_to_conv(cin: int, hidden: int, cout: int, dense_bias: bool, conv_bias: bool):
    """X @ P (+ b), transposed and reshaped to an image, then a 1x1 convolution."""
    nodes = [node("MatMul", ["x", "p"], ["xp"])]
    projected = "xp"
    if dense_bias:
        nodes.append(node("Add", ["b", "xp"], ["xpb"]))
        projected = "xpb"
    nodes += [node("Transpose", [projected], ["t"], perm=[0, 2, 1]),
              node("Reshape", ["t", "shape"], ["image"]),
              node("Conv", ["image", "w"] + (["cb"] if conv_bias else []), ["conv"],
                   kernel_shape=[1, 1]),
              node("Relu", ["conv"], ["y"])]
    weights = {"p": random_array((cin, hidden), seed=1), "b": random_array((hidden,), seed=2),
               "shape": np.array([1, hidden, H, W], np.int64),
               "w": random_array((cout, hidden, 1, 1), seed=3),
               "cb": random_array((cout,), seed=4)}
    used = {n for n_ in nodes for n in n_.input}
    weights = {k: v for k, v in weights.items() if k in used}
    model = make_model(nodes, [tensor("x", [1, H * W, cin])], [tensor("y", None)], weights)
    return model, {"x": random_array((1, H * W, cin), seed=5)}


@pytest.mark.parametrize("dense_bias, conv_bias", [(True, True), (True, False), (False, True)])
def test_the_convolution_folds_into_the_dense_layer(dense_bias, conv_bias):
    model, feeds = tokens_to_conv(3, 16, 6, dense_bias, conv_bias)
    types = [n.op_type for n in optimize(from_onnx(model)).nodes]
    assert types.count("MatMul") == 1 and not {"Conv", "ChannelsLastConv"} & set(types)
    assert_close(compile_graph(from_onnx(model))(**feeds)[0],
                 run_onnxruntime(model, feeds)[0], reduction=16)


def test_a_fold_that_would_cost_more_products_is_left_alone():
    """3 -> 2 -> 20 channels: 3 x 20 products per token folded, 3 x 2 + 2 x 20 apart."""
    model, feeds = tokens_to_conv(3, 2, 20, True, True)
    types = [n.op_type for n in optimize(from_onnx(model)).nodes]
    assert "MatMul" in types and "ChannelsLastConv" in types
    assert_close(compile_graph(from_onnx(model))(**feeds)[0],
                 run_onnxruntime(model, feeds)[0], reduction=16)
