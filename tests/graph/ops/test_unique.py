"""Unique, whose count comes from the data, against ONNX Runtime and eager PyTorch: over
the flattened elements and along every axis, sorted and in order of first occurrence,
float and integer values with many repeats or none, empty, one-element, prime and
symbolic sizes (one compile serving several), each set of outputs a node may ask for,
kernels after it running at the count found; torch's ``unique`` (inverse indices,
counts, ``dim``) and ``unique_consecutive``. Unique copies elements, so results must
match exactly. NaN is left out: treadle does not treat it apart."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import rng, run_onnxruntime

pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from tests.frontend.test_torch_indexing import Function  # noqa: E402

ELEM = {np.float32: TensorProto.FLOAT, np.int64: TensorProto.INT64}
OUTPUTS = ("y", "indices", "inverse", "counts")


def values(shape, dtype, repeats: bool, seed: int = 0) -> np.ndarray:
    """Elements of ``dtype`` drawn from five values (many repeats), or all distinct."""
    gen, size = rng(seed), int(np.prod(shape))
    drawn = gen.integers(-2, 3, size) if repeats else gen.permutation(size) - size // 2
    scale = 0.5 if dtype is np.float32 else 1
    return np.asarray(drawn * scale, dtype).reshape(shape)


def unique_model(shape, dtype, axis=None, sort=None, outputs=OUTPUTS):
    attrs = {k: v for k, v in (("axis", axis), ("sorted", sort)) if v is not None}
    node = helper.make_node("Unique", ["x"], list(outputs), name="unique", **attrs)
    kinds = [ELEM[dtype]] + [TensorProto.INT64] * 3
    return make_model([node], [tensor("x", list(shape), ELEM[dtype])],
                      [tensor(o, None, k) for o, k in zip(outputs, kinds) if o], opset=11)


def assert_same(model, feeds, compiled=None):
    got = (compiled or treadle.compile(model))(**feeds)
    want = run_onnxruntime(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("shape", [(), (0,), (1,), (2039,), (3, 5), (2, 0, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
@pytest.mark.parametrize("sort", [None, 0, 1])
def test_unique_of_the_flattened_elements(shape, dtype, sort):
    model = unique_model(shape, dtype, sort=sort)
    compiled = treadle.compile(model)
    for repeats in (True, False):
        assert_same(model, {"x": values(shape, dtype, repeats)}, compiled)


@pytest.mark.parametrize("shape", [(1, 1), (7, 5), (0, 3), (4, 0), (2, 13, 3)])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
@pytest.mark.parametrize("sort", [0, 1])
def test_unique_slices_along_an_axis(shape, axis, dtype, sort):
    """Slices in lexicographic order, or in order of first occurrence."""
    if shape == (4, 0) and axis == 0:
        pytest.skip("ONNX Runtime aborts on several empty slices; numpy's answer is below")
    model = unique_model(shape, dtype, axis, sort)
    compiled = treadle.compile(model)
    for repeats in (True, False):
        # Elements from two values: slices of several elements still repeat.
        x = values(shape, dtype, repeats) % 2 if repeats else values(shape, dtype, repeats)
        assert_same(model, {"x": x}, compiled)


@pytest.mark.parametrize("shape, axis", [((3, 0), 0), ((3, 0), -2), ((2, 0, 5), 2)])
@pytest.mark.parametrize("sort", [0, 1])
def test_empty_slices_are_one(shape, axis, sort):
    """Slices without elements are all equal: one unique slice, as numpy has it."""
    model = unique_model(shape, np.float32, axis, sort)
    got = treadle.compile(model)(x=np.zeros(shape, np.float32))
    want = np.unique(np.zeros(shape, np.float32), return_index=True, return_inverse=True,
                     return_counts=True, axis=axis)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("axis", [None, 1])
@pytest.mark.parametrize("sort", [0, 1])
def test_one_compile_serves_every_size_and_count(axis, sort):
    model = unique_model(["a", "b"], np.int64, axis, sort)
    compiled = treadle.compile(model)
    for seed, shape in enumerate([(3, 5), (0, 4), (17, 2), (1, 1), (31, 7), (3, 0)]):
        for repeats in (True, False):
            x = values(shape, np.int64, repeats, seed)
            assert_same(model, {"x": x % 2 if axis is not None else x}, compiled)


@pytest.mark.parametrize("outputs", [("y",), ("y", "indices"), ("y", "", "inverse"),
                                     ("y", "", "", "counts"), ("y", "indices", "", "counts")])
@pytest.mark.parametrize("axis", [None, -1])
def test_each_set_of_outputs(outputs, axis):
    """A node asks for the values and any of the other outputs (ONNX requires the
    values)."""
    model = unique_model([6, 5], np.float32, axis, 0, outputs)
    assert_same(model, {"x": values((6, 5), np.float32, True, seed=3) % 1.5})


def test_kernels_after_unique_run_at_the_count_found():
    """The values feed an elementwise op and a reduction, the first indices a gather, and
    the counts add up to the elements' count."""
    nodes = [
        helper.make_node("Unique", ["x"], ["y", "first", "", "counts"], name="unique", sorted=0),
        helper.make_node("Mul", ["y", "y"], ["squares"]),
        helper.make_node("ReduceSum", ["squares"], ["total"], keepdims=0),
        helper.make_node("Flatten", ["x"], ["flat"], axis=0),
        helper.make_node("Gather", ["flat", "first"], ["again"], axis=1),
        helper.make_node("ReduceSum", ["counts"], ["elements"], keepdims=0),
    ]
    model = make_model(nodes, [tensor("x", ["n", 3])],
                       [tensor("squares", None), tensor("total", None), tensor("again", None),
                        tensor("elements", None, TensorProto.INT64)], opset=13)
    compiled = treadle.compile(model)
    for seed, n in enumerate([5, 0, 23]):
        assert_same(model, {"x": values((n, 3), np.float32, True, seed)}, compiled)


# ---- torch -------------------------------------------------------------------------------

UNIQUES = {
    "values": lambda x: torch.unique(x),
    "inverse_and_counts": lambda x: torch.unique(x, return_inverse=True, return_counts=True),
    "unsorted": lambda x: torch.unique(x, sorted=False, return_inverse=True),
    "rows": lambda x: torch.unique(x, dim=0, return_inverse=True, return_counts=True),
    "columns": lambda x: torch.unique(x, dim=1, return_inverse=True, return_counts=True),
    "last_dim": lambda x: torch.unique(x, dim=-1),
    "consecutive": lambda x: torch.unique_consecutive(x, return_inverse=True,
                                                      return_counts=True),
    "consecutive_rows": lambda x: torch.unique_consecutive(x, dim=0, return_counts=True),
    "then_a_sum": lambda x: (torch.unique(x) * 2).sum(),
    "floats": lambda x: torch.unique(x.float() / 2, return_inverse=True),
}


@pytest.mark.parametrize("name", sorted(UNIQUES))
@pytest.mark.parametrize("size", [2, 7, 13])  # torch.export fixes a symbolic size traced at 1
def test_torch_unique(name, size):
    """One compile serves every count, a second call with other sizes and values too."""
    function = UNIQUES[name]
    model = Function(function).eval()
    gen = torch.Generator().manual_seed(size)
    compiled = treadle.compile(model, (torch.randint(0, 2, (size, 3), generator=gen),),
                               dims={0: {0: "n"}})
    for n in (size, size + 2):
        x = torch.randint(0, 2, (n, 3), generator=gen)
        got = torch.utils._pytree.tree_leaves(compiled(x))
        expected = torch.utils._pytree.tree_leaves(function(x))
        for g, e in zip(got, expected, strict=True):
            assert np.asarray(g).dtype == e.numpy().dtype
            np.testing.assert_array_equal(np.asarray(g), e.numpy())

