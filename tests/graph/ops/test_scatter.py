"""ScatterND and ScatterElements against ONNX Runtime with indices given at run time: every
reduction over repeated indices, negative indices, slices, odd, prime, empty and symbolic
sizes; the last update wins without a reduction; the kernel's work is linear in data and
updates (MViTv2's relative-position table); the CUDA kernel in the simulator."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.graph.ops.work import iterations
from tests.harness import assert_close, rng, run_onnxruntime
from treadle.errors import KernelError
from treadle.graph.operator import apply
from treadle.graph.ops import scatter
from treadle.graph.tensor import Tensor

pytest.importorskip("onnxruntime")

ELEM = {np.float32: TensorProto.FLOAT, np.int32: TensorProto.INT32,
        np.int64: TensorProto.INT64}


def scatter_model(op, data, indices, updates, dtype=np.float32, **attrs):
    """``op`` over three inputs of the given shapes (names allowed), indices of int64."""
    elem = ELEM[dtype]
    node = helper.make_node(op, ["data", "indices", "updates"], ["y"], name="scatter", **attrs)
    return make_model([node], [tensor("data", list(data), elem),
                               tensor("indices", list(indices), TensorProto.INT64),
                               tensor("updates", list(updates), elem)],
                      [tensor("y", None, elem)], opset=18)


def values(shape, dtype, seed):
    """Small integers (exact in any order of combining), as ``dtype``."""
    return rng(seed).integers(-3, 4, shape).astype(dtype)


def nd_indices(data_shape, batch, depth, unique, seed):
    """Index tuples of ``depth`` into ``data_shape``, half of them counted from the end."""
    gen = rng(seed)
    sizes = data_shape[:depth]
    count = int(np.prod(batch))
    total = int(np.prod(sizes))
    flat = (gen.permutation(total)[:count] if unique else gen.integers(0, total, count))
    tuples = np.stack(np.unravel_index(flat, sizes), -1).astype(np.int64) if total else \
        np.zeros((0, depth), np.int64)
    tuples[::2] -= np.array(sizes, np.int64)  # the same positions, negative
    return tuples.reshape(*batch, depth)


def assert_matches(model, feeds):
    got = treadle.compile(model)(**feeds)
    want = run_onnxruntime(model, feeds)
    assert_close(got[0], want[0])


# (data shape, batch of index tuples, depth, reduction, dtype): repeated indices with every
# reduction, slices (depth < rank), one element per update, none at all.
ND_CASES = [((13, 7), (5,), 1, "none", np.float32), ((13, 7), (11,), 1, "add", np.float32),
            ((3, 11, 5), (4, 3), 2, "mul", np.float32), ((3, 11, 5), (9,), 3, "max", np.int32),
            ((2039,), (61,), 1, "min", np.int64), ((2039,), (97,), 1, "none", np.float32),
            ((4, 0), (3,), 1, "add", np.float32), ((7, 3), (0,), 1, "none", np.float32),
            ((1, 1, 61, 13), (41,), 4, "add", np.float32)]


@pytest.mark.parametrize("shape, batch, depth, reduction, dtype", ND_CASES)
def test_scatter_nd_matches_onnxruntime(shape, batch, depth, reduction, dtype):
    indices = nd_indices(shape, batch, depth, reduction == "none", seed=len(batch) + depth)
    updates_shape = (*batch, *shape[depth:])
    model = scatter_model("ScatterND", shape, indices.shape, updates_shape, dtype,
                          reduction=reduction)
    assert_matches(model, {"data": values(shape, dtype, 1), "indices": indices,
                           "updates": values(updates_shape, dtype, 2)})


# (data shape, indices shape, axis, reduction, dtype): indices smaller than the data on
# the other axes, repeated targets along the axis with every reduction.
ELEMENT_CASES = [((13, 7), (5, 7), 0, "none", np.float32), ((13, 7), (13, 4), 1, "add", np.float32),
                 ((3, 11, 5), (2, 17, 3), 1, "mul", np.float32),
                 ((3, 11, 5), (3, 11, 5), -1, "max", np.int32),
                 ((2039,), (257,), 0, "min", np.int64), ((2, 61, 3), (2, 0, 3), 1, "add", np.float32),
                 ((5, 0, 2), (5, 0, 2), 2, "none", np.float32)]


@pytest.mark.parametrize("shape, index_shape, axis, reduction, dtype", ELEMENT_CASES)
def test_scatter_elements_matches_onnxruntime(shape, index_shape, axis, reduction, dtype):
    gen = rng(axis % 3)
    length = shape[axis]
    if reduction == "none":  # distinct targets along each line of the axis
        indices = np.argsort(gen.random((*index_shape[:axis % len(shape)], length,
                                         *index_shape[axis % len(shape) + 1:])), axis=axis)
        indices = np.take(indices, np.arange(index_shape[axis]), axis=axis)
    else:
        indices = gen.integers(0, max(length, 1), index_shape)
    indices = np.where(gen.random(index_shape) < 0.5, indices - length, indices).astype(np.int64)
    model = scatter_model("ScatterElements", shape, index_shape, index_shape, dtype, axis=axis,
                          reduction=reduction)
    assert_matches(model, {"data": values(shape, dtype, 1), "indices": indices,
                           "updates": values(index_shape, dtype, 2)})


def test_the_last_update_wins_without_a_reduction():
    """Repeated targets: the update latest in index order is the one kept, as ONNX Runtime
    and PyTorch's index_put apply them."""
    model = scatter_model("ScatterND", [6, 3], [7, 1], [7, 3])
    indices = np.array([[1], [4], [1], [-5], [0], [4], [-2]], np.int64)
    updates = np.arange(21, dtype=np.float32).reshape(7, 3)
    want = np.zeros((6, 3), np.float32)
    for k, row in enumerate(indices[:, 0]):
        want[row] = updates[k]
    got = treadle.compile(model)(data=np.zeros((6, 3), np.float32), indices=indices,
                                 updates=updates)
    np.testing.assert_array_equal(got[0], want)


def test_symbolic_sizes_compile_once():
    model = scatter_model("ScatterND", ["n", 5], ["m", 1], ["m", 5], reduction="add")
    compiled = treadle.compile(model)
    for n, m in ((1, 0), (13, 7), (257, 2039), (2, 5)):
        feeds = {"data": values((n, 5), np.float32, n), "indices": nd_indices((n, 5), (m,), 1,
                                                                              False, m),
                 "updates": values((m, 5), np.float32, m)}
        assert_close(compiled(**feeds)[0], run_onnxruntime(model, feeds)[0])


def test_an_index_out_of_range_names_the_node():
    model = scatter_model("ScatterElements", [4, 3], [1, 3], [1, 3], axis=0)
    compiled = treadle.compile(model)
    with pytest.raises(KernelError, match="scatter"):
        compiled(data=np.zeros((4, 3), np.float32), indices=np.array([[0, 4, 1]]),
                 updates=np.ones((1, 3), np.float32))


def kernel_of(op_type, data_shape, index_shape, update_shape, **attrs):
    inputs = [Tensor("data", "float32", data_shape), Tensor("indices", "int64", index_shape),
              Tensor("updates", "float32", update_shape)]
    op = apply(op_type, inputs, attrs)[0].producer
    return scatter._kernel(op, "scatter")


# MViTv2-Tiny's relative-position table: 614k single elements scattered into 614k.
MVIT = (1, 1, 3136, 196)


@pytest.mark.parametrize("op_type, index_shape, update_shape, attrs", [
    ("ScatterND", (3136 * 196, 4), (3136 * 196,), {}),
    ("ScatterElements", MVIT, MVIT, {"axis": 3, "reduction": "add"}),
])
def test_the_work_is_linear(op_type, index_shape, update_shape, attrs):
    kernel = kernel_of(op_type, MVIT, index_shape, update_shape, **attrs)
    elements = int(np.prod(MVIT)) + int(np.prod(update_shape))
    # Each element copied and each update applied once; the bound counts a row's last
    # block of 64 as full (196 as 256). The search it replaces was 614k x 614k.
    assert iterations(kernel.function.body) <= 1.5 * elements


def test_mvit_relative_positions_run():
    """The scatter that took minutes: a permutation of the table, against numpy."""
    size = int(np.prod(MVIT))
    model = scatter_model("ScatterND", MVIT, [size, 4], [size])
    flat = rng(3).permutation(size)
    indices = np.stack(np.unravel_index(flat, MVIT), -1).astype(np.int64)
    updates = rng(4).standard_normal(size).astype(np.float32)
    want = np.zeros(size, np.float32)
    want[flat] = updates
    got = treadle.compile(model)(data=np.zeros(MVIT, np.float32), indices=indices,
                                 updates=updates)
    np.testing.assert_array_equal(got[0], want.reshape(MVIT))


@pytest.mark.parametrize("op_type, attrs", [("ScatterND", {"reduction": "add"}),
                                            ("ScatterElements", {"axis": 1})])
def test_the_cuda_kernel_in_the_simulator(op_type, attrs):
    shape = (5, 7)
    if op_type == "ScatterND":
        indices = nd_indices(shape, (6,), 1, False, 0)
        updates = values((6, 7), np.float32, 2)
    else:
        indices = np.array([[3, -1, 0], [6, 2, -7], [0, 5, 4]], np.int64)
        updates = values((3, 3), np.float32, 2)
    model = scatter_model(op_type, shape, indices.shape, updates.shape, **attrs)
    feeds = {"data": values(shape, np.float32, 1), "indices": indices, "updates": updates}
    got = treadle.compile(model, target="cuda:sm_90").executable.simulate(*feeds.values())
    assert_close(got[0], run_onnxruntime(model, feeds)[0])
