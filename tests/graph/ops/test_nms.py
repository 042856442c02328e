"""NonMaxSuppression against ONNX Runtime: corner boxes (corners in either order) and
centre boxes, batches and classes, no, one, prime and many boxes, tied scores and
identical boxes, every threshold from none to all, maxima of 0, 1 and more than there
are boxes, optional inputs absent, constant or fed at run time, one compile serving every
size, kernels after it running at the size found, opset 10's node, and the errors."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import rng, run_onnxruntime
from treadle.errors import KernelError, ShapeError

pytest.importorskip("onnxruntime")

SCALARS = (("max", TensorProto.INT64, np.int64), ("iou", TensorProto.FLOAT, np.float32),
           ("thr", TensorProto.FLOAT, np.float32))


def boxes_and_scores(batches, classes, n, seed, centered=False, levels=None):
    """Boxes in a few clusters, so that many overlap, some identical and some of no width;
    corners in either order. Scores uniform, or from ``levels`` values for ties."""
    gen = rng(seed)
    centres = gen.uniform(0, 6, (batches, n, 2)) // 2 * 2 + gen.normal(0, 0.3, (batches, n, 2))
    sizes = gen.uniform(0, 3, (batches, n, 2))
    sizes[gen.random((batches, n)) < 0.05] = 0
    if n > 3:
        centres[:, 1], sizes[:, 1] = centres[:, 0], sizes[:, 0]
    if centered:
        boxes = np.concatenate([centres[..., ::-1], sizes[..., ::-1]], -1)
    else:
        sign = np.where(gen.random((batches, n, 2)) < 0.5, -1, 1)
        boxes = np.concatenate([centres - sign * sizes / 2, centres + sign * sizes / 2], -1)
    shape = (batches, classes, n)
    scores = gen.random(shape) if levels is None else gen.integers(0, levels, shape) / levels
    return boxes.astype(np.float32), scores.astype(np.float32)


def nms_model(present=(True, True, True), fed=True, boxes=("b", "n", 4),
              scores=("b", "c", "n"), opset=11, center_point_box=0, after=()):
    """A NonMaxSuppression node; of max_output_boxes_per_class, iou_threshold and
    score_threshold those ``present``, graph inputs where ``fed``, else constants."""
    names = [n if p else "" for (n, _, _), p in zip(SCALARS, present)]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", *names], ["y"],
                            name="nms", center_point_box=center_point_box)
    inputs = [tensor("boxes", list(boxes)), tensor("scores", list(scores))]
    constants = {}
    for (name, elem, dtype), p in zip(SCALARS, present):
        if p and fed:
            inputs.append(tensor(name, [1] if name == "iou" else [], elem))
        elif p:
            constants[name] = np.array([3] if name == "max" else 0.4, dtype)
    outputs = [tensor("y", None, TensorProto.INT64)] + [tensor(o, None, e) for o, e in after]
    return make_model([node], inputs, outputs, constants, opset=opset)


def assert_same(model, feeds, compiled=None, reference=None):
    got = (compiled or treadle.compile(model))(**feeds)
    want = run_onnxruntime(reference or model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.shape, w.shape, feeds)
        np.testing.assert_array_equal(g, w)


def scalar_feeds(limit, iou, threshold):
    return {"max": np.array(limit, np.int64), "iou": np.array([iou], np.float32),
            "thr": np.array(threshold, np.float32)}


@pytest.mark.parametrize("centered", [0, 1])
def test_one_compile_serves_every_size_and_threshold(centered):
    """Symbolic batches, classes and boxes, the scalars fed at run time."""
    model = nms_model(center_point_box=centered)
    compiled = treadle.compile(model)
    for seed, (b, c, n) in enumerate([(1, 1, 0), (1, 1, 1), (2, 3, 7), (1, 2, 13),
                                      (3, 1, 31), (0, 2, 5), (2, 0, 5)]):
        boxes, scores = boxes_and_scores(b, c, n, seed, centered)
        for limit in (0, 1, 3, 10**9):
            for iou in (0.0, 0.3, 0.5, 1.0):
                for threshold in (-1.0, 0.25, 0.7, 2.0):
                    feeds = {"boxes": boxes, "scores": scores,
                             **scalar_feeds(limit, iou, threshold)}
                    assert_same(model, feeds, compiled)


@pytest.mark.parametrize("centered", [0, 1])
@pytest.mark.parametrize("levels", [1, 3])
def test_tied_scores_rank_the_lower_box_first(centered, levels):
    model = nms_model(center_point_box=centered)
    compiled = treadle.compile(model)
    for seed, n in enumerate([2, 7, 61]):
        boxes, scores = boxes_and_scores(2, 2, n, seed, centered, levels=levels)
        for iou in (0.0, 0.5):
            feeds = {"boxes": boxes, "scores": scores, **scalar_feeds(5, iou, -1.0)}
            assert_same(model, feeds, compiled)


@pytest.mark.parametrize("centered", [0, 1])
def test_an_iou_equal_to_the_threshold_does_not_suppress(centered):
    """Exact overlaps of 1/2 and 1/3, touching and empty boxes, and (for centre boxes)
    negative sizes, which ONNX Runtime's normalised corners never let overlap."""
    corners = [[0, 0, 2, 2], [2, 0, 0, 1], [0, 1, 2, 3], [0, 2, 2, 4], [1, 1, 1, 1],
               [2, 2, 0, 0], [0, 0, 2, 2]]
    boxes = np.array(corners, np.float32)
    if centered:
        low, high = boxes[:, :2], boxes[:, 2:]
        boxes = np.concatenate([((low + high) / 2)[:, ::-1], (high - low)[:, ::-1]], 1)
    model = nms_model(center_point_box=centered)
    compiled = treadle.compile(model)
    scores = np.linspace(1, 0.4, len(corners), dtype=np.float32)
    for iou in (0.0, 1 / 3, 0.5, 0.51, 1.0):
        feeds = {"boxes": boxes[None], "scores": scores[None, None],
                 **scalar_feeds(10, iou, 0.0)}
        assert_same(model, feeds, compiled)


@pytest.mark.parametrize("n", [257, 2039])
def test_many_boxes(n):
    """Prime counts past several merge passes, most boxes suppressed or kept."""
    model = nms_model(boxes=(1, n, 4), scores=(1, 2, n))
    compiled = treadle.compile(model)
    boxes, scores = boxes_and_scores(1, 2, n, seed=n)
    for limit, iou in ((10**9, 0.5), (10**9, 1.0), (100, 0.2)):
        assert_same(model, {"boxes": boxes, "scores": scores,
                            **scalar_feeds(limit, iou, 0.1)}, compiled)


@pytest.mark.parametrize("present", [(False, False, False), (True, False, False),
                                     (True, True, False), (True, False, True),
                                     (False, True, True), (True, True, True)])
def test_optional_inputs_absent_or_constant(present):
    """Absent, the maximum selects nothing and no score threshold applies."""
    model = nms_model(present, fed=False, boxes=(2, 11, 4), scores=(2, 3, 11))
    boxes, scores = boxes_and_scores(2, 3, 11, seed=5)
    assert_same(model, {"boxes": boxes, "scores": scores - 0.5})


def test_opset_10_node_means_what_opset_11_does():
    """The importer reads opset 11 on; the version-10 node ONNX Runtime runs selects the
    same boxes."""
    model = nms_model(boxes=(2, 13, 4), scores=(2, 2, 13))
    boxes, scores = boxes_and_scores(2, 2, 13, seed=10)
    for iou in (0.0, 0.3, 0.7):
        feeds = {"boxes": boxes, "scores": scores, **scalar_feeds(4, iou, 0.1)}
        assert_same(model, feeds, reference=nms_model(boxes=(2, 13, 4), scores=(2, 2, 13),
                                                      opset=10))


def test_kernels_after_it_run_at_the_size_found():
    """The selected boxes' indices feed a gather and an elementwise op."""
    nodes = [
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max", "iou"], ["y"],
                         name="nms"),
        helper.make_node("Gather", ["y", "two"], ["picked"], axis=1),
        helper.make_node("Squeeze", ["boxes", "zero"], ["flat"]),
        helper.make_node("Gather", ["flat", "picked"], ["chosen"], axis=0),
        helper.make_node("Mul", ["chosen", "chosen"], ["squares"]),
    ]
    model = make_model(nodes, [tensor("boxes", [1, "n", 4]), tensor("scores", [1, 1, "n"])],
                       [tensor("squares", None)],
                       {"max": np.array([100], np.int64), "iou": np.float32(0.3),
                        "two": np.int64(2), "zero": np.array([0], np.int64)}, opset=13)
    compiled = treadle.compile(model)
    for seed, n in enumerate([0, 1, 23, 97]):
        boxes, scores = boxes_and_scores(1, 1, n, seed)
        assert_same(model, {"boxes": boxes, "scores": scores}, compiled)


def test_an_iou_threshold_outside_0_to_1_fails_naming_the_node():
    compiled = treadle.compile(nms_model())
    boxes, scores = boxes_and_scores(1, 1, 5, seed=0)
    with pytest.raises(KernelError, match="'nms'.*iou_threshold"):
        compiled(boxes=boxes, scores=scores, **scalar_feeds(3, 1.5, 0.0))


def test_symbolic_box_counts_that_differ_fail_naming_the_node():
    compiled = treadle.compile(nms_model(scores=("b", "c", "m")))
    boxes, scores = boxes_and_scores(1, 2, 5, seed=0)
    feeds = scalar_feeds(3, 0.5, 0.0)
    assert compiled(boxes=boxes, scores=scores, **feeds)[0].shape[1] == 3
    with pytest.raises(KernelError, match="'nms'.*number of boxes"):
        compiled(boxes=boxes, scores=scores[..., :4], **feeds)


@pytest.mark.parametrize("boxes, scores, attrs, message", [
    ((1, 5, 3), (1, 1, 5), {}, "boxes \\[batches, boxes, 4\\]"),
    ((2, 5, 4), (1, 1, 5), {}, "boxes has 2 batches, scores 1"),
    ((1, 5, 4), (1, 1, 6), {}, "boxes has 5 boxes, scores 6"),
    ((1, 5, 4), (1, 1, 5), {"center_point_box": 2}, "center_point_box must be 0 or 1")])
def test_bad_inputs_name_the_node(boxes, scores, attrs, message):
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["y"], name="nms",
                            **attrs)
    model = make_model([node], [tensor("boxes", list(boxes)), tensor("scores", list(scores))],
                       [tensor("y", None, TensorProto.INT64)], opset=11)
    with pytest.raises(ShapeError, match=f"'nms'.*{message}"):
        treadle.compile(model)
