"""Graphs the differential fuzzer (test_differential.py) found treadle getting wrong,
shrunk by hand and fixed here for good. Each test names what broke and where it was fixed."""
from __future__ import annotations

import numpy as np
from onnx import helper

from tests.frontend.onnx_models import make_model, tensor
from tests.fuzz.compare import assert_matches_onnxruntime
from tests.harness import random_array


def test_view_of_a_scalar_in_an_epilogue():
    """A reduction to a scalar, flattened to [1, 1] and then activated: the Flatten joins
    the reduction's epilogue, and the index of its element came from the rank-0 source
    as a plain 0, not an expression (schedule/fusion.py)."""
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Flatten", ["total"], ["flat"], axis=0),
             helper.make_node("Relu", ["flat"], ["y"])]
    model = make_model(nodes, [tensor("x", [2, 3])], [tensor("y", [1, 1])])
    assert_matches_onnxruntime(model, {"x": random_array((2, 3))})


def test_vector_times_matrix_of_symbolic_width():
    """A 1-D left factor times a matrix of symbolic width: whether the GEMM's tiles share
    one row of A asked the truth of the symbolic tile count
    (schedule/templates/gemm/)."""
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
    model = make_model(nodes, [tensor("a", [4]), tensor("b", [4, "n"])], [tensor("y", ["n"])])
    assert_matches_onnxruntime(model, {"a": random_array((4,)),
                                       "b": random_array((4, 5), seed=1)})


def test_align_corners_downsampling_by_a_scale_that_does_not_divide():
    """Width 5 at scale 0.5 is 2 wide: align_corners maps position 1 to 4, dividing by the
    rounded length as ONNX Runtime and PyTorch do; dividing by the unrounded 2.5, as ONNX's
    reference does, read position 2.67 (graph/ops/transform.py, resize)."""
    scales = np.array([1, 1, 0.5, 0.5], np.float32)
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear",
                              coordinate_transformation_mode="align_corners")]
    model = make_model(nodes, [tensor("x", [1, 1, 2, 5])], [tensor("y", [1, 1, 1, 2])],
                       initializers={"scales": scales})
    assert_matches_onnxruntime(model, {"x": random_array((1, 1, 2, 5))})


def test_nearest_resize_to_a_size_keeps_ties_exact():
    """7 -> 8 wide, asymmetric: position 4 maps to 3.5 exactly, which round_prefer_ceil
    takes to 4; dividing by the float32 scale 8/7 gave 3.4999998 and picked 3
    (graph/ops/transform.py, resize)."""
    sizes = np.array([2, 1, 1, 8], np.int64)
    nodes = [helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest",
                              coordinate_transformation_mode="asymmetric",
                              nearest_mode="round_prefer_ceil")]
    model = make_model(nodes, [tensor("x", [2, 1, 1, 7])], [tensor("y", [2, 1, 1, 8])],
                       initializers={"sizes": sizes})
    assert_matches_onnxruntime(model, {"x": random_array((2, 1, 1, 7))})
