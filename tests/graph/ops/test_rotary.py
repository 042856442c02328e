"""RotaryEmbedding against ONNX Runtime: 4-D and 3-D inputs, halves and interleaved pairs,
a partial rotation, caches indexed by position ids or by batch and token, symbolic sizes,
and the errors."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, rng, run_onnxruntime
from treadle.errors import ShapeError

pytest.importorskip("onnxruntime")
POSITIONS = 11  # rows of a cache indexed by position ids


def rope_model(x_shape, cache_shape, positions: bool, **attrs):
    names = ["x", "cos", "sin"] + (["pos"] if positions else [])
    inputs = [tensor("x", x_shape), tensor("cos", cache_shape), tensor("sin", cache_shape)]
    if positions:
        inputs.append(tensor("pos", [x_shape[0], "seq"], TensorProto.INT64))
    node = helper.make_node("RotaryEmbedding", names, ["y"], name="rope", **attrs)
    return make_model([node], inputs, [tensor("y", None)], opset=23)


def feeds_for(x_shape, half: int, positions: bool, seed: int = 0):
    r = rng(seed)
    batch, seq = x_shape[0], x_shape[2] if len(x_shape) == 4 else x_shape[1]
    cache = (POSITIONS, half) if positions else (batch, seq, half)
    feeds = {"x": r.standard_normal(x_shape).astype(np.float32),
             "cos": r.standard_normal(cache).astype(np.float32),
             "sin": r.standard_normal(cache).astype(np.float32)}
    if positions:
        feeds["pos"] = r.integers(0, POSITIONS, (batch, seq))
    return feeds


# (x shape, rotary_embedding_dim, interleaved, position ids, num_heads)
CASES = [((2, 3, 7, 8), 0, 0, True, 0), ((2, 3, 7, 8), 0, 1, True, 0),
         ((1, 2, 13, 12), 8, 0, False, 0), ((3, 1, 5, 6), 2, 1, False, 0),
         ((2, 7, 24), 4, 1, True, 3), ((1, 5, 12), 0, 0, False, 2), ((2, 0, 12), 0, 0, True, 2)]


@pytest.mark.parametrize("x_shape, rotated, interleaved, positions, heads", CASES)
def test_matches_onnxruntime(x_shape, rotated, interleaved, positions, heads):
    head = x_shape[-1] if len(x_shape) == 4 else x_shape[-1] // heads
    half = (rotated or head) // 2
    attrs = {"interleaved": interleaved}
    if rotated:
        attrs["rotary_embedding_dim"] = rotated
    if heads:
        attrs["num_heads"] = heads
    seq_axis = 2 if len(x_shape) == 4 else 1
    cache = [POSITIONS, half] if positions else [x_shape[0], "seq", half]
    shape = [("seq" if k == seq_axis else d) for k, d in enumerate(x_shape)]
    model = rope_model(shape, cache, positions, **attrs)
    compiled = treadle.compile(model)  # one compile for every sequence length
    for seed, seq in enumerate((x_shape[seq_axis], 1, 9)):
        x_shape_now = tuple(seq if k == seq_axis else d for k, d in enumerate(x_shape))
        feeds = feeds_for(x_shape_now, half, positions, seed)
        assert_close(compiled(**feeds)[0], run_onnxruntime(model, feeds)[0],
                     context=f"seq={seq}")


def test_caches_of_batch_1_broadcast():
    """Exporters write caches [1, seq, dim / 2] for every batch (ONNX Runtime refuses
    them): the result equals that of caches repeated to the batch."""
    model = rope_model([3, 2, "seq", 8], [1, "seq", 4], False)
    feeds = feeds_for((3, 2, 7, 8), 4, False)
    for name in ("cos", "sin"):
        feeds[name] = feeds[name][:1]
    repeated = dict(feeds, cos=np.repeat(feeds["cos"], 3, 0), sin=np.repeat(feeds["sin"], 3, 0))
    reference = rope_model([3, 2, "seq", 8], [3, "seq", 4], False)
    assert_close(treadle.compile(model)(**feeds)[0], run_onnxruntime(reference, repeated)[0])


def test_a_position_past_the_cache_reads_inside_it():
    """An index out of range is clamped (no read outside the cache), as gathers are."""
    model = rope_model([1, 1, 3, 4], [POSITIONS, 2], True)
    feeds = feeds_for((1, 1, 3, 4), 2, True)
    feeds["pos"] = np.array([[0, POSITIONS + 5, -1]])
    got = treadle.compile(model)(**feeds)[0]
    assert np.isfinite(got).all()


@pytest.mark.parametrize("attrs, cache, message", [
    ({"rotary_embedding_dim": 5}, [POSITIONS, 2], "even"),
    ({}, [POSITIONS, 3], "last dimension of 4"),
    ({"rotary_embedding_dim": 10}, [POSITIONS, 5], "at most the head size 8")])
def test_bad_attributes_name_the_node(attrs, cache, message):
    model = rope_model([1, 2, 3, 8], cache, True, **attrs)
    with pytest.raises(ShapeError, match=f"rope.*{message}"):
        treadle.compile(model)


def test_caches_that_do_not_cover_the_batch_are_refused():
    with pytest.raises(ShapeError, match="rope.*cannot be broadcast"):
        treadle.compile(rope_model([3, 2, 5, 8], [2, 5, 4], False))


def test_a_3d_input_needs_its_number_of_heads():
    model = rope_model([1, 3, 12], [POSITIONS, 6], True)
    with pytest.raises(ShapeError, match="rope.*num_heads"):
        treadle.compile(model)
