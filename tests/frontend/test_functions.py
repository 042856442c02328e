"""Operators ONNX defines as functions of others, imported as their bodies, against ONNX
Runtime: a plain function (MeanVarianceNormalization), ones whose body depends on the node
(CenterCropPad, with the shape given as a constant or in the call), AffineGrid; an
operator without a function is still refused by name."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, rng, run_onnxruntime
from treadle.errors import UnsupportedOpError
from treadle.frontend.onnx import unsupported_nodes

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("axes", [None, [1], [0, 2, 3]])
def test_mean_variance_normalization(axes):
    attrs = {} if axes is None else {"axes": axes}
    node = helper.make_node("MeanVarianceNormalization", ["x"], ["y"], name="mvn", **attrs)
    model = make_model([node], [tensor("x", ["n", 3, 7, 5])], [tensor("y", None)])
    compiled = treadle.compile(model)
    for n in (1, 2, 13):
        x = rng(n).standard_normal((n, 3, 7, 5)).astype(np.float32)
        # The body's variance is E[x^2] - E[x]^2, which cancels over few elements (3
        # channels): the two sums' rounding, in either system's order, shows at 1e-4.
        np.testing.assert_allclose(compiled(x=x)[0], run_onnxruntime(model, {"x": x})[0],
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape, target, axes", [((20, 10, 3), [13, 17, 3], None),
                                                 ((3, 7, 8), [11, 5], [-2, -1]),
                                                 ((1, 61), [61], [1])])
def test_center_crop_pad(shape, target, axes):
    attrs = {} if axes is None else {"axes": axes}
    node = helper.make_node("CenterCropPad", ["x", "shape"], ["y"], name="crop", **attrs)
    constant = make_model([node], [tensor("x", list(shape))], [tensor("y", None)],
                          {"shape": np.array(target, np.int64)}, opset=18)
    given = make_model([node], [tensor("x", list(shape)),
                                tensor("shape", [len(target)], TensorProto.INT64)],
                       [tensor("y", None)], opset=18)
    x = rng(0).standard_normal(shape).astype(np.float32)
    want = run_onnxruntime(constant, {"x": x})[0]
    np.testing.assert_array_equal(treadle.compile(constant)(x=x)[0], want)
    got = treadle.compile(given)(x=x, shape=np.array(target, np.int64))[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("align_corners", [0, 1])
def test_affine_grid(align_corners):
    node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], name="grid",
                            align_corners=align_corners)
    model = make_model([node], [tensor("theta", [2, 2, 3])], [tensor("grid", None)],
                       {"size": np.array([2, 3, 5, 7], np.int64)}, opset=20)
    theta = rng(1).standard_normal((2, 2, 3)).astype(np.float32)
    assert_close(treadle.compile(model)(theta=theta)[0],
                 run_onnxruntime(model, {"theta": theta})[0])


def test_functions_are_not_listed_as_unsupported_but_other_operators_are():
    nodes = [helper.make_node("MeanVarianceNormalization", ["x"], ["m"], name="mvn"),
             helper.make_node("Det", ["m"], ["y"], name="det")]
    model = make_model(nodes, [tensor("x", [2, 3, 4, 5])], [tensor("y", None)])
    assert unsupported_nodes(model.graph, 17) == {"Det": ["det"]}
    with pytest.raises(UnsupportedOpError, match="Det.*'det'"):
        treadle.compile(model)
