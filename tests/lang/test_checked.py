"""Checked kernels: ``@lang.kernel(checked=True)`` (or TREADLE_CHECK_BOUNDS=1) fails a call
that would load or store outside a tensor with a KernelError naming the tensor, the index
and the size, before the access; kernels whose accesses stay inside compute what numpy
does; unchecked kernels compile as they always did."""
import numpy as np
import pytest

from tests.harness import assert_close, random_array
from tests.lang.test_kernels import matmul
from treadle import lang
from treadle.config import override
from treadle.errors import KernelError
from treadle.ir.functor import walk
from treadle.ir.lower import lower
from treadle.ir.stmt import Assert
from treadle.lang import f32
from treadle.target.cpu import host

M, N, K = lang.symbols("M N K")
SIZES = (0, 1, 7, 13)


@lang.kernel(checked=True)
def fill_past(y: f32[M]):
    for i in range(M + 1000):
        y[i] = 1.0


@lang.kernel(checked=True)
def read_past(x: f32[M], y: f32[M]):
    for i in range(M):
        y[i] = x[i + 2]


def test_a_write_past_the_tensor_fails_before_it_overwrites_the_callers_memory():
    memory = np.zeros(1004, np.float32)
    with pytest.raises(KernelError, match=r"kernel fill_past: store to y\[i\]: index 4 on axis "
                                          r"0 is outside its size M \(M = 4\)"):
        fill_past(memory[:4])
    np.testing.assert_array_equal(memory, np.r_[np.ones(4), np.zeros(1000)])


def test_a_read_past_the_tensor_fails_naming_it():
    x, y = np.arange(5, dtype=np.float32), np.zeros(5, np.float32)
    with pytest.raises(KernelError, match=r"load from x\[i \+ 2\]: index 5 on axis 0 is "
                                          r"outside its size M \(M = 5\)"):
        read_past(x, y)
    with pytest.raises(KernelError, match=r"load from x\[i \+ 2\]: index 2 "):
        read_past(x[:2], y[:2])


# The unchecked kernel's own source, parsed again in checked mode.
checked_matmul = lang.kernel(checked=True)(matmul.__wrapped__)


@pytest.mark.parametrize("m", SIZES)
def test_a_checked_matmul_matches_numpy(m):
    for n, k in [(1, 1), (13, 7), (5, 0), (0, 3)]:
        a, b = random_array((m, k), seed=m), random_array((k, n), seed=n)
        c = np.full((m, n), np.nan, np.float32)
        checked_matmul(a, b, c)
        assert_close(c, a @ b, reduction=k, context=f"M={m} N={n} K={k}")


@lang.kernel(checked=True)
def checked_neighbours(x: f32[N], y: f32[N]):
    """y[i] = x[i - 1] + x[i + 1], zero past either end: guarded loads, checked where read."""
    for i in range(N):
        left = x[i - 1] if i > 0 else 0.0
        y[i] = left + (x[i + 1] if i + 1 < N and i >= 0 else 0.0)


@lang.kernel(checked=True)
def checked_axpy_vectors(x: f32[N, 8], y: f32[N, 8], alpha: f32):
    for i in range(N):
        y[i, 0] = lang.fma(lang.broadcast(alpha, 8), x.vload((i, 0), 8), y.vload((i, 0), 8))


@pytest.mark.parametrize("n", SIZES + (2039,))
def test_checked_guarded_and_vector_accesses_match_numpy(n):
    x = random_array(n, seed=n)
    y = np.full_like(x, np.nan)
    checked_neighbours(x, y)
    padded = np.pad(x, 1)
    assert_close(y, padded[:-2] + padded[2:])
    x, y = random_array((n, 8), seed=1), random_array((n, 8), seed=2)
    expected = np.float32(3) * x + y
    checked_axpy_vectors(x, y, 3.0)
    assert_close(y, expected)


def test_a_vector_reaching_past_the_row_fails():
    @lang.kernel(checked=True)
    def wide(x: f32[N, 8], y: f32[N, 8]):
        for i in range(N):
            y[i, 0] = x.vload((i, 1), 8)
    with pytest.raises(KernelError, match=r"load from x\[i, 1\]: index 1 \(a vector of 8 "
                                          r"elements\) on axis 1 is outside its size 8"):
        wide(np.zeros((2, 8), np.float32), np.zeros((2, 8), np.float32))


def test_the_knob_checks_kernels_that_do_not_say_and_unchecked_ones_are_unchanged():
    def copy(x: f32[N], y: f32[N]):
        for i in range(N + 1):
            y[i] = x[i]
    with override(check_bounds=True):
        knob = lang.kernel(copy)
        with pytest.raises(KernelError, match=r"load from x\[i\]: index 3 .* size N \(N = 3\)"):
            knob(np.ones(3, np.float32), np.zeros(3, np.float32))
        plain = lang.kernel(checked=False)(copy)
        assert plain.compiled.function == lower(plain.function, host())
    default = lang.kernel(copy)
    assert default.compiled.function == lower(default.function, host())
    assert not any(isinstance(s, Assert) for s in walk(default.compiled.function.body))
