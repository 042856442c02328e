"""GridSample against ONNX Runtime: linear and nearest modes, zeros and border padding,
both corner conventions, points outside the image, and symbolic image and grid sizes."""
from __future__ import annotations

import pytest
from onnx import helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array, run_onnxruntime
from treadle.errors import UnsupportedOpError

pytest.importorskip("onnxruntime")


def sample_model(**attrs):
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], name="sample", **attrs)
    return make_model([node], [tensor("x", ["n", 3, "h", "w"]),
                               tensor("grid", ["n", "ho", "wo", 2])], [tensor("y", None)],
                      opset=20)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border"])
@pytest.mark.parametrize("corners", [0, 1])
def test_matches_onnxruntime_at_symbolic_sizes(mode, padding, corners):
    model = sample_model(mode=mode, padding_mode=padding, align_corners=corners)
    compiled = treadle.compile(model)  # one compile for every size
    for seed, (n, h, w, ho, wo) in enumerate([(1, 7, 13, 5, 3), (2, 1, 1, 2, 7), (1, 4, 9, 0, 3)]):
        feeds = {"x": random_array((n, 3, h, w), seed=seed),
                 # past the edges too, where zeros padding reads nothing
                 "grid": random_array((n, ho, wo, 2), seed=seed + 10, low=-1.3, high=1.3)}
        assert_close(compiled(**feeds)[0], run_onnxruntime(model, feeds)[0],
                     context=f"{mode} {padding} corners={corners} size={h}x{w}")


@pytest.mark.parametrize("attrs, message", [({"mode": "cubic"}, "cubic"),
                                            ({"padding_mode": "reflection"}, "reflection")])
def test_unsupported_modes_name_the_node(attrs, message):
    with pytest.raises(UnsupportedOpError, match=f"sample.*{message}"):
        treadle.compile(sample_model(**attrs))
