"""The treadle.lang rewrites of the example matmuls, and the softmax, against numpy."""
import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle.examples.lang_matmul import cooperative_matmul, softmax, tiled_matmul
from treadle.runtime.interpret import interpret

SHAPES = [(1, 1, 1), (7, 13, 5), (13, 7, 37), (37, 61, 13), (1, 97, 130), (0, 5, 3), (5, 3, 0)]


@pytest.fixture(scope="module")
def kernels():
    """Each program with symbolic sizes, compiled once for the whole module."""
    return {"tiled": tiled_matmul(), "cooperative": cooperative_matmul()}


def check(kernel, m, n, k, seed=0):
    a, b = random_array((m, k), seed=seed), random_array((k, n), seed=seed + 1)
    c = np.full((m, n), np.nan, np.float32)
    kernel(a, b, c)
    expected = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    assert_close(c, expected, reduction=max(k, 1), context=f"M={m} N={n} K={k}")


@pytest.mark.parametrize("program", ["tiled", "cooperative"])
def test_symbolic_sizes(kernels, program):
    for m, n, k in SHAPES:
        check(kernels[program], m, n, k)


def test_concrete_sizes_with_small_blocks():
    kernel = tiled_matmul(13, 37, 7, threads=3, block_m=12, block_n=16, block_k=8,
                          micro_m=3, micro_n=8)
    assert not kernel.function.symbols
    check(kernel, 13, 37, 7)


def test_cooperative_interpreted_with_barriers_agrees():
    # The interpreter runs the 128 workers as threads meeting at real barriers.
    kernel = cooperative_matmul(7, 13, 5)
    a, b = random_array((7, 5), seed=3), random_array((5, 13), seed=4)
    compiled, interpreted = np.zeros((7, 13), np.float32), np.zeros((7, 13), np.float32)
    kernel(a, b, compiled)
    interpret(kernel.function, a, b, interpreted)
    np.testing.assert_allclose(interpreted, compiled, rtol=1e-6, atol=1e-6)


def softmax_reference(x):
    shifted = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True, initial=-np.inf))
    return (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32)


def test_softmax_matches_numpy():
    kernel = softmax()
    for rows, cols in [(1, 1), (7, 13), (37, 2039), (0, 5), (3, 0)]:
        x = random_array((rows, cols), seed=cols, low=-30, high=30)
        y = np.full_like(x, np.nan)
        kernel(x, y)
        assert_close(y, softmax_reference(x), context=f"{rows}x{cols}")
    large = np.array([[1e4, 1e4 - 1, -1e4]], np.float32)  # exp would overflow unshifted
    y = np.zeros_like(large)
    kernel(large, y)
    assert_close(y, softmax_reference(large))
