"""The hand-written task-mapping matmuls against numpy, compiled and interpreted."""
import numpy as np
import pytest

from tests.harness import SIZES, assert_close, random_array
from treadle.errors import ArgumentError, DTypeError, ShapeError
from treadle.examples.matmul import cooperative_matmul, tiled_matmul
from treadle.ir.lower import lower
from treadle.runtime.interpret import interpret
from treadle.runtime.build import compile_function
from treadle.target.cpu import host

PROGRAMS = {"tiled": tiled_matmul, "cooperative": cooperative_matmul}
RECTANGULAR = [(1, 257, 7), (97, 1, 61), (61, 97, 1), (128, 7, 257), (7, 128, 97)]


def operands(m, n, k, seed=0):
    return random_array((m, k), seed=seed), random_array((k, n), seed=seed + 1)


def check(kernel, m, n, k):
    a, b = operands(m, n, k)
    c = np.full((m, n), np.nan, np.float32)
    kernel(a, b, c)
    expected = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    assert_close(c, expected, reduction=k, context=f"M={m} N={n} K={k}")


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("size", SIZES)
def test_concrete_square_sizes(program, size):
    check(compile_function(PROGRAMS[program](size, size, size)), size, size, size)


@pytest.mark.parametrize("program", PROGRAMS)
def test_symbolic_sizes_compile_once(program):
    kernel = compile_function(PROGRAMS[program]("M", "N", "K"))
    for size in SIZES:
        check(kernel, size, size, size)
    for m, n, k in RECTANGULAR:
        check(kernel, m, n, k)


def test_mixed_concrete_and_symbolic():
    kernel = compile_function(tiled_matmul("M", 97, 61))
    for m in (1, 7, 257):
        check(kernel, m, 97, 61)


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("sizes", [(7, 13, 5), ("M", "N", "K")])
def test_interpreter_agrees_with_compiled_c(program, sizes):
    func = PROGRAMS[program](*sizes)
    kernel = compile_function(func)
    a, b = operands(7, 13, 5, seed=3)
    compiled, interpreted, lowered = (np.zeros((7, 13), np.float32) for _ in range(3))
    kernel(a, b, compiled)
    interpret(func, a, b, interpreted)       # the program as written, task mappings evaluated
    interpret(lower(func, host()), a, b, lowered)    # after the lowering pipeline
    np.testing.assert_allclose(interpreted, compiled, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(lowered, compiled, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def symbolic_kernel():
    return compile_function(tiled_matmul("M", "N", "K"))


def test_wrong_dtype_names_argument(symbolic_kernel):
    a, b = operands(4, 5, 6)
    with pytest.raises(DTypeError, match="'A'"):
        symbolic_kernel(a.astype(np.float64), b, np.zeros((4, 5), np.float32))


def test_wrong_rank_names_argument(symbolic_kernel):
    a, b = operands(4, 5, 6)
    with pytest.raises(ShapeError, match="'C'"):
        symbolic_kernel(a, b, np.zeros((4, 5, 1), np.float32))


def test_symbol_mismatch_names_argument_and_symbol(symbolic_kernel):
    a, b = operands(4, 5, 6)
    with pytest.raises(ShapeError, match="'B'.*K"):
        symbolic_kernel(a, np.zeros((7, 5), np.float32), np.zeros((4, 5), np.float32))


def test_wrong_concrete_shape_names_argument():
    kernel = compile_function(tiled_matmul(8, 8, 8))
    a, b = operands(8, 8, 8)
    with pytest.raises(ShapeError, match="'C'"):
        kernel(a, b, np.zeros((8, 9), np.float32))


def test_non_contiguous_names_argument(symbolic_kernel):
    a, b = operands(6, 4, 6)
    with pytest.raises(ArgumentError, match="'A'.*contiguous"):
        symbolic_kernel(a.T, b, np.zeros((6, 4), np.float32))


def test_wrong_argument_count(symbolic_kernel):
    a, b = operands(4, 5, 6)
    with pytest.raises(ArgumentError):
        symbolic_kernel(a, b)
