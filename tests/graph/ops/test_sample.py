"""GridSample against ONNX Runtime: linear, nearest and cubic modes, zeros, border and
reflection padding, both corner conventions, points outside the input (far enough to
reflect more than once), images and volumes, at symbolic sizes that include 1 and 0."""
from __future__ import annotations

import pytest
from onnx import helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array, run_onnxruntime
from treadle.errors import UnsupportedOpError

pytest.importorskip("onnxruntime")

# Spatial rank -> the modes ONNX defines for it and the sizes drawn: (n, input, output).
RANKS = {
    2: (("linear", "nearest", "cubic"),
        [(1, (7, 13), (5, 3)), (2, (1, 1), (2, 7)), (1, (4, 9), (0, 3)), (1, (2, 11), (3, 5))]),
    3: (("linear", "nearest"),
        [(1, (5, 3, 7), (2, 3, 5)), (2, (1, 2, 1), (3, 1, 2)), (1, (3, 4, 2), (0, 2, 3))]),
}


def sample_model(rank: int, modes, padding: str, opset: int = 20):
    """One GridSample per mode and corner convention, all reading the same x and grid."""
    spatial, points = ["d", "h", "w"][3 - rank:], ["do", "ho", "wo"][3 - rank:]
    nodes, outputs = [], []
    for mode in modes:
        for corners in (0, 1):
            out = f"y_{mode}_{corners}"
            nodes.append(helper.make_node("GridSample", ["x", "grid"], [out], name=out,
                                          mode=mode, padding_mode=padding,
                                          align_corners=corners))
            outputs.append(tensor(out, None))
    return make_model(nodes, [tensor("x", ["n", 3, *spatial]),
                              tensor("grid", ["n", *points, rank])], outputs, opset=opset)


# Each rank and each padding by default, every pairing of them with -m slow.
@pytest.mark.parametrize("rank, padding", [
    pytest.param(rank, padding, marks=() if (rank, padding) in {
        (2, "zeros"), (2, "reflection"), (3, "border")} else pytest.mark.slow)
    for rank in sorted(RANKS) for padding in ("zeros", "border", "reflection")])
def test_matches_onnxruntime_at_symbolic_sizes(rank, padding):
    modes, sizes = RANKS[rank]
    model = sample_model(rank, modes, padding)
    compiled = treadle.compile(model)  # one compile for every size
    for seed, (n, spatial, points) in enumerate(sizes):
        feeds = {"x": random_array((n, 3, *spatial), seed=seed),
                 # past the edges too, where padding decides, by up to three lengths
                 "grid": random_array((n, *points, rank), seed=seed + 10, low=-3.5, high=3.5)}
        expected = run_onnxruntime(model, feeds)
        for k, (actual, ref) in enumerate(zip(compiled(**feeds), expected)):
            assert_close(actual, ref, context=f"{model.graph.node[k].name} {padding} "
                                              f"sizes {spatial} -> {points}")


@pytest.mark.parametrize("rank", [pytest.param(r, marks=pytest.mark.slow) if r == 3 else r
                                  for r in sorted(RANKS)])
def test_in_the_gpu_simulator(rank):
    modes, sizes = RANKS[rank]
    model = sample_model(rank, modes, "reflection")
    n, spatial, points = sizes[0]
    feeds = {"x": random_array((n, 3, *spatial), seed=1),
             "grid": random_array((n, *points, rank), seed=2, low=-3.5, high=3.5)}
    compiled = treadle.compile(model, target="cuda:sm_90")
    for actual, ref in zip(compiled.executable.simulate(**feeds), run_onnxruntime(model, feeds)):
        assert_close(actual, ref)


def test_opset_16_mode_names():
    model = sample_model(2, ("bilinear", "bicubic"), "border", opset=16)
    feeds = {"x": random_array((1, 3, 5, 7), seed=1),
             "grid": random_array((1, 3, 2, 2), seed=2, low=-1.2, high=1.2)}
    for actual, ref in zip(treadle.compile(model)(**feeds), run_onnxruntime(model, feeds)):
        assert_close(actual, ref)


def test_unsupported_modes_name_the_node():
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], name="sample", mode="cubic")
    model = make_model([node], [tensor("x", [1, 3, 2, 4, 5]), tensor("grid", [1, 2, 2, 2, 3])],
                       [tensor("y", None)], opset=20)
    with pytest.raises(UnsupportedOpError, match="sample.*cubic"):
        treadle.compile(model)
