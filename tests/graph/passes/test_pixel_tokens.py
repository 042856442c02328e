"""A vision transformer's head (Segformer's decoder): each stage's tokens N x HW x C,
projected, transposed and viewed as an N x C x H x W image, bilinearly upsampled to one
size, concatenated and fused by a 1x1 convolution. The views become channels-last images,
so nothing between the projections and the convolution transposes; against ONNX Runtime
with odd sizes and a symbolic batch."""
import numpy as np
import pytest
from onnx import helper

from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array, run_onnxruntime
import treadle
from treadle.frontend.onnx import from_onnx
from treadle.graph.optimize import optimize


def decoder_head(sides, channels, out_side, mode="linear", batch=1):
    """With a static batch the upsampling gives sizes, with a symbolic one (integer)
    scales."""
    inits = {"fuse": random_array((12, 6 * len(sides), 1, 1), seed=1)}
    inputs, nodes, branches = [], [], []
    for k, side in enumerate(sides):
        inits[f"w{k}"] = random_array((channels[k], 6), seed=10 + k)
        inits[f"shape{k}"] = np.array([0, 6, side, side], np.int64)
        if batch == 1:
            inits[f"size{k}"] = np.array([1, 6, out_side, out_side], np.int64)
            resize = ["", "", f"size{k}"]
        else:
            inits[f"scale{k}"] = np.array([1, 1, out_side // side, out_side // side],
                                          np.float32)
            resize = ["", f"scale{k}"]
        inputs.append(tensor(f"t{k}", [batch, side * side, channels[k]]))
        nodes += [helper.make_node("MatMul", [f"t{k}", f"w{k}"], [f"m{k}"]),
                  helper.make_node("Transpose", [f"m{k}"], [f"tr{k}"], perm=[0, 2, 1]),
                  helper.make_node("Reshape", [f"tr{k}", f"shape{k}"], [f"img{k}"]),
                  helper.make_node("Resize", [f"img{k}", *resize], [f"up{k}"], mode=mode)]
        branches.append(f"up{k}")
    nodes += [helper.make_node("Concat", branches, ["cat"], axis=1),
              helper.make_node("Conv", ["cat", "fuse"], ["c"]),
              helper.make_node("Relu", ["c"], ["y"])]
    return make_model(nodes, inputs, [tensor("y", [batch, 12, out_side, out_side])],
                      initializers=inits)


@pytest.mark.parametrize("sides,out_side,mode,batch", [((9, 5, 3), 9, "linear", 1),
                                                       ((8, 4), 13, "nearest", 1),
                                                       ((9, 3), 9, "linear", "batch"),
                                                       ((7,), 7, "nearest", "batch")])
def test_decoder_head_matches_onnxruntime(sides, out_side, mode, batch):
    channels = [5, 11, 16][:len(sides)]
    model = decoder_head(sides, channels, out_side, mode, batch)
    compiled = treadle.compile(model)
    for n in ((1,) if batch == 1 else (1, 2)):
        feeds = {f"t{k}": random_array((n, s * s, channels[k]), seed=n + k)
                 for k, s in enumerate(sides)}
        (expected,) = run_onnxruntime(model, feeds)
        (actual,) = compiled(**feeds)
        assert_close(actual, expected, reduction=sum(channels) + 6 * len(sides))


@pytest.mark.parametrize("batch", [1, "batch"])
def test_token_images_stay_channels_last(batch):
    graph = optimize(from_onnx(decoder_head((9, 3), [5, 11], 9, batch=batch)))
    transposes = [n for n in graph.nodes if n.op_type == "Transpose"]
    # Only the convolution's result goes back to N x C x H x W.
    assert len(transposes) == 1, [n.op_type for n in graph.nodes]
    assert transposes[0] is graph.nodes[-1]
