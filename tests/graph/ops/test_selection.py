"""NonZero and Compress, whose output sizes come from the data, against ONNX Runtime: every
rank, float, integer and bool inputs, odd, prime, empty and symbolic sizes, sizes found
anywhere from none to all; kernels after them running at the size found, a size found
from a size found, graph outputs of found sizes, saved models, the bound checked, and
the CUDA target's refusal naming the tensor."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, rng, run_onnxruntime
from treadle.errors import UnsupportedOpError

pytest.importorskip("onnxruntime")

ELEM = {np.float32: TensorProto.FLOAT, np.int32: TensorProto.INT32,
        np.int64: TensorProto.INT64, np.bool_: TensorProto.BOOL}


def sparse(shape, dtype, seed, density=0.4):
    """Values of ``dtype`` with about ``density`` of them non-zero (true)."""
    gen = rng(seed)
    kept = gen.random(shape) < density
    values = gen.integers(1, 5, shape) * gen.choice([-1, 1], shape)
    return np.asarray(kept if dtype is np.bool_ else kept * values, dtype)


def nonzero_model(shape, dtype=np.float32):
    node = helper.make_node("NonZero", ["x"], ["y"], name="nz")
    return make_model([node], [tensor("x", list(shape), ELEM[dtype])],
                      [tensor("y", None, TensorProto.INT64)], opset=13)


def assert_same(model, feeds, compiled=None):
    got = (compiled or treadle.compile(model))(**feeds)
    want = run_onnxruntime(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.shape, w.shape)
        assert_close(g, w)


@pytest.mark.parametrize("shape, dtype", [
    ((), np.float32), ((7,), np.float32), ((3, 5), np.int32), ((2, 3, 7), np.bool_),
    ((1, 2, 3, 5), np.int64), ((13, 0), np.float32), ((4, 1), np.bool_)])
@pytest.mark.parametrize("density", [0.0, 0.4, 1.0])
def test_nonzero_matches_onnxruntime(shape, dtype, density):
    x = sparse(shape, dtype, seed=len(shape), density=density)
    assert_same(nonzero_model(shape, dtype), {"x": x})


def test_one_compile_serves_every_size_and_count():
    """Symbolic dimensions and a count that changes from call to call."""
    model = nonzero_model(["a", "b"])
    compiled = treadle.compile(model)
    for seed, shape in enumerate([(3, 5), (0, 4), (17, 2), (1, 1), (31, 7)]):
        for density in (0.0, 0.3, 1.0):
            assert_same(model, {"x": sparse(shape, np.float32, seed, density)}, compiled)


def test_kernels_after_nonzero_run_at_the_size_found():
    """The coordinates feed a gather, an elementwise op and a reduction, and a second
    NonZero finds its size in the first one's result."""
    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"], name="nz"),
        helper.make_node("Transpose", ["nz"], ["rows"], perm=[1, 0]),
        helper.make_node("GatherND", ["x", "rows"], ["picked"]),
        helper.make_node("Mul", ["picked", "picked"], ["squares"]),
        helper.make_node("ReduceSum", ["squares"], ["total"], keepdims=0),
        helper.make_node("Greater", ["picked", "zero"], ["positive"]),
        helper.make_node("NonZero", ["positive"], ["again"], name="nz2"),
    ]
    model = make_model(nodes, [tensor("x", ["n", 6])],
                       [tensor("picked", None), tensor("total", None),
                        tensor("again", None, TensorProto.INT64)],
                       {"zero": np.float32(0.0)}, opset=13)
    compiled = treadle.compile(model)
    for seed, n in enumerate([5, 0, 23]):
        assert_same(model, {"x": sparse((n, 6), np.float32, seed)}, compiled)


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("length", [0, 3, 7])
def test_compress_matches_onnxruntime(axis, length):
    """A condition as long as the axis, shorter, or empty."""
    attrs = {} if axis is None else {"axis": axis}
    node = helper.make_node("Compress", ["x", "c"], ["y"], name="compress", **attrs)
    model = make_model([node], [tensor("x", [7, 7]), tensor("c", [length], TensorProto.BOOL)],
                       [tensor("y", None)], opset=13)
    x = rng(1).standard_normal((7, 7)).astype(np.float32)
    assert_same(model, {"x": x, "c": sparse((length,), np.bool_, seed=length, density=0.5)})


def test_a_saved_model_finds_its_sizes_again(tmp_path):
    model = nonzero_model(["a", 3], np.int32)
    treadle.compile(model).save(tmp_path / "saved")
    loaded = treadle.load(tmp_path / "saved")
    for seed, a in enumerate([2, 11]):
        assert_same(model, {"x": sparse((a, 3), np.int32, seed)}, loaded)


def test_the_cuda_target_refuses_sizes_found_in_the_data_naming_the_tensor():
    with pytest.raises(UnsupportedOpError, match="'nz/rows:1'.*found in the data"):
        treadle.compile(nonzero_model([4, 5]), target="cuda:sm_80")
