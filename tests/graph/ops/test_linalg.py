"""Inverse against numpy.linalg.inv: batches of odd, prime, one-element and empty matrices,
float32 and float64, symbolic batch and matrix sizes, matrices that need row swaps, the
info result of singular ones, the errors, and the CUDA kernel in the simulator."""
from __future__ import annotations

import numpy as np
import pytest

import treadle
from tests.harness import rng, run_graph
from treadle.errors import ShapeError, TreadleError, UnsupportedOpError
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.tensor import Tensor

# Tolerances for matrices of condition number below about 100 (see ``invertible``).
TOLERANCE = {np.float32: (2e-5, 1e-6), np.float64: (1e-12, 1e-14)}


def invertible(shape, dtype=np.float32, seed=0) -> np.ndarray:
    """Random matrices plus n times the identity: well conditioned, yet with a larger
    element below the diagonal than on it now and then, which partial pivoting swaps up."""
    n = shape[-1]
    return (rng(seed).standard_normal(shape) * 2 + n * np.eye(n) / 2).astype(dtype)


def inverse_graph(shape, dtype="float32"):
    x = Tensor("x", dtype, shape)
    return x, apply("Inverse", [x], {})


def invert(a: np.ndarray, shape=None) -> list[np.ndarray]:
    x, outputs = inverse_graph(shape or a.shape, a.dtype.name)
    return run_graph([(x, a)], outputs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (2, 5, 5), (4, 2, 13, 13), (31, 31),
                                   (0, 3, 3), (2, 0, 0)])
def test_inverse_matches_numpy(shape, dtype):
    a = invertible(shape, dtype)
    y, info = invert(a)
    rtol, atol = TOLERANCE[dtype]
    np.testing.assert_allclose(y, np.linalg.inv(a), rtol=rtol, atol=atol)
    assert info.dtype == np.int32 and info.shape == shape[:-2] and not info.any()


def test_row_swaps():
    """Zeros on the diagonal, where elimination without pivoting divides by zero."""
    a = np.array([[[0, 1, 0], [0, 0, 1], [1, 0, 0]], [[0, 2, 1], [3, 0, 0], [1, 1, 0]]],
                 np.float32)
    y, info = invert(a)
    np.testing.assert_allclose(y, np.linalg.inv(a), rtol=1e-6, atol=1e-7)
    assert not info.any()


def test_symbolic_batch_and_matrix_sizes():
    x, outputs = inverse_graph(("batch", "n", "n"))
    compiled = treadle.compile(Graph.from_outputs([x], outputs))
    for shape in [(3, 7, 7), (1, 2, 2), (0, 5, 5), (2, 1, 1)]:
        a = invertible(shape)
        y, info = compiled(a)
        np.testing.assert_allclose(y, np.linalg.inv(a), rtol=2e-5, atol=1e-6)
        assert info.shape == shape[:1] and not info.any()


def test_info_names_the_first_zero_pivot():
    """As LAPACK's getrf has it: 1 + the first column with no nonzero pivot left."""
    a = np.array([np.eye(3), [[1, 2, 3], [2, 4, 6], [0, 0, 1]], np.zeros((3, 3)),
                  [[1, 0, 0], [0, 1, 0], [0, 0, 0]]], np.float32)
    y, info = invert(a)
    assert info.tolist() == [0, 2, 1, 3]
    np.testing.assert_array_equal(y[0], np.eye(3))
    assert not np.isfinite(y[1:]).all(axis=(1, 2)).any()


def test_errors():
    with pytest.raises(ShapeError, match="square matrices, got 3 x 4"):
        inverse_graph((2, 3, 4))
    with pytest.raises(ShapeError, match="rank 2 or more"):
        inverse_graph((3,))
    with pytest.raises(UnsupportedOpError, match="int32 matrices"):
        inverse_graph((3, 3), "int32")
    x, outputs = inverse_graph(("m", "n"))
    compiled = treadle.compile(Graph.from_outputs([x], outputs))
    with pytest.raises(TreadleError, match="square matrices"):
        compiled(np.ones((2, 3), np.float32))


def test_the_cuda_kernel_in_the_simulator():
    a = invertible((3, 6, 6))
    x, outputs = inverse_graph(a.shape)
    compiled = treadle.compile(Graph.from_outputs([x], outputs), target="cuda:sm_90")
    y, info = compiled.executable.simulate(a)
    np.testing.assert_allclose(y, np.linalg.inv(a), rtol=2e-5, atol=1e-6)
    assert not info.any()
