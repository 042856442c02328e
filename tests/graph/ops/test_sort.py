"""TopK against ONNX Runtime, values and indices exactly: both algorithms of its kernel
(insertion for a small k, a merge sort for a large one), ties, NaN, every axis, symbolic
sizes and a symbolic k, and the errors."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import rng, run_onnxruntime
from treadle.errors import KernelError, ShapeError, TreadleError
from treadle.graph.ops import sort

pytest.importorskip("onnxruntime")

TYPES = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE,
         np.float16: TensorProto.FLOAT16, np.int32: TensorProto.INT32,
         np.int64: TensorProto.INT64}


def top_k_model(shape, k, axis=-1, largest=1, dtype=np.float32):
    """TopK of x (``shape``, names allowed) with k a constant, or with k=None the length of
    the axis, read from x's shape (a sort of symbolic length)."""
    nodes = [helper.make_node("TopK", ["x", "k"], ["values", "indices"], name="top",
                              axis=axis, largest=largest)]
    constants = {}
    if k is None:
        nodes[:0] = [helper.make_node("Shape", ["x"], ["shape"]),
                     helper.make_node("Gather", ["shape", "axis"], ["k"], axis=0)]
        constants["axis"] = np.array([axis], np.int64)
    else:
        constants["k"] = np.array([k], np.int64)
    elem = TYPES[dtype]
    return make_model(nodes, [tensor("x", list(shape), elem)],
                      [tensor("values", None, elem), tensor("indices", None, TensorProto.INT64)],
                      constants)


def with_ties_and_nan(shape, dtype=np.float32, seed=0):
    """Few distinct values, so many ties; NaN at every 7th element of a float array."""
    x = rng(seed).integers(-4, 5, shape).astype(dtype)
    if np.issubdtype(dtype, np.floating):
        x.reshape(-1)[::7] = np.nan
    return x


def assert_matches(compiled, model, x):
    got = compiled(x=x)
    want = run_onnxruntime(model, {"x": x})
    np.testing.assert_array_equal(got[0], want[0])  # NaN equals NaN here
    np.testing.assert_array_equal(got[1], want[1])


# (shape, k, axis): k past INSERTION_RATIO * length takes the merge sort.
CASES = [((7, 13), 5, -1), ((7, 13), 13, 1), ((3, 11, 5), 4, 1), ((3, 11, 5), 11, 1),
         ((2, 97, 3), 97, 1), ((5, 300), 300, 1), ((5, 300), 131, -1), ((1, 1), 1, 0),
         ((2039,), 61, 0), ((4, 0, 3), 0, 1), ((6, 9), 0, 1)]


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("shape, k, axis", CASES)
def test_top_k_matches_onnxruntime(shape, k, axis, largest):
    model = top_k_model(shape, k, axis, largest)
    assert_matches(treadle.compile(model), model, with_ties_and_nan(shape))


def test_both_algorithms_are_covered():
    merged = [k for shape, k, _ in CASES
              if k > sort.MAX_INSERTION_K and k * k > sort.INSERTION_RATIO * shape[1]]
    assert merged and any(k > 1 for shape, k, _ in CASES if k <= sort.MAX_INSERTION_K)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.int64])
def test_other_types(dtype):
    model = top_k_model((4, 17), 6, 1, 1, dtype)
    assert_matches(treadle.compile(model), model, with_ties_and_nan((4, 17), dtype))


@pytest.mark.parametrize("k", [3, 100])
def test_symbolic_lines_compile_once(k):
    model = top_k_model(["n", 131], k, 1, 0)
    compiled = treadle.compile(model)
    for n in (0, 1, 7):
        assert_matches(compiled, model, with_ties_and_nan((n, 131), seed=n))


def test_a_sort_of_symbolic_length():
    model = top_k_model([3, "length"], None, 1, 1)
    compiled = treadle.compile(model)
    for length in (0, 1, 13, 257):
        assert_matches(compiled, model, with_ties_and_nan((3, length), seed=length))


def test_a_constant_k_past_a_symbolic_length_fails_in_the_call():
    model = top_k_model([2, "length"], 5, 1)
    compiled = treadle.compile(model)
    assert_matches(compiled, model, with_ties_and_nan((2, 5)))
    with pytest.raises(KernelError, match="k = 5 exceeds the length"):
        compiled(x=with_ties_and_nan((2, 4)))


@pytest.mark.parametrize("k, message", [(14, "k = 14 exceeds the length 13"),
                                        (-1, "k must not be negative")])
def test_bad_k_names_the_node(k, message):
    with pytest.raises(TreadleError, match=f"top.*{message}"):
        treadle.compile(top_k_model((7, 13), k))


def test_k_given_in_the_call():
    """k as a model input: each value specialises the model when it is first given."""
    model = make_model([helper.make_node("TopK", ["x", "k"], ["values", "indices"],
                                         name="top")],
                       [tensor("x", [7, 13]), tensor("k", [1], TensorProto.INT64)],
                       [tensor("values", None), tensor("indices", None, TensorProto.INT64)])
    compiled = treadle.compile(model)
    x = with_ties_and_nan((7, 13))
    for k in (3, 13, 0):
        feeds = {"x": x, "k": np.array([k])}
        for got, want in zip(compiled(**feeds), run_onnxruntime(model, feeds)):
            np.testing.assert_array_equal(got, want)
    with pytest.raises(ShapeError, match="top.*k = 14 exceeds the length 13"):
        compiled(x=x, k=np.array([14]))


@pytest.mark.parametrize("shape, k", [((3, 13), 5), ((2, 300), 300)])
def test_the_cuda_kernel_in_the_simulator(shape, k):
    model = top_k_model(shape, k)
    x = with_ties_and_nan(shape)
    got = treadle.compile(model, target="cuda:sm_90").executable.simulate(x)
    for actual, expected in zip(got, run_onnxruntime(model, {"x": x})):
        np.testing.assert_array_equal(actual, expected)
