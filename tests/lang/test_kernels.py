"""treadle.lang kernels against numpy: each language feature in a kernel of its own,
compiled once per module (a kernel compiles at its first call) and run at odd, prime,
one and zero sizes, with symbolic and concrete dimensions."""
import math

import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle import lang
from treadle.errors import ArgumentError, KernelError
from treadle.ir.stmt import For, ForTask, If
from treadle.ir.functor import walk
from treadle.lang import f32, f64, repeat, spatial
from treadle.runtime.interpret import interpret

M, N, K = lang.symbols("M N K")
WEIGHTS = (0.25, -0.5, 0.125)   # closure constants: unrolled taps of a 1-D convolution
WORKERS = 4
SIZES = (0, 1, 7, 13, 37)


@lang.kernel
def matmul(a: f32[M, K], b: f32[K, N], c: f32[M, N]):
    for i in lang.parallel(M):
        for j in range(N):
            acc = 0.0
            for k in range(K):
                acc += a[i, k] * b[k, j]
            c[i, j] = acc


@lang.kernel
def matmul_7x5(a: f32[7, 5], b: f32[5, 3], c: f32[7, 3]):
    for i, j in repeat(7, 3).on(0):
        acc: f64 = 0
        for k in range(5):
            acc += f64(a[i, k]) * f64(b[k, j])
        c[i, j] = f32(acc)


@pytest.mark.parametrize("m", SIZES)
def test_symbolic_matmul_matches_numpy(m):
    for n, k in [(1, 1), (13, 7), (37, 0), (0, 11), (2, 29)]:
        a, b = random_array((m, k), seed=m), random_array((k, n), seed=n)
        c = np.full((m, n), np.nan, np.float32)
        matmul(a, b, c)
        assert_close(c, a @ b, reduction=k, context=f"M={m} N={n} K={k}")


def test_concrete_sizes_and_annotated_f64_accumulator():
    a, b = random_array((7, 5), seed=1), random_array((5, 3), seed=2)
    c = np.zeros((7, 3), np.float32)
    matmul_7x5(a, b, c)
    assert_close(c, (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32))
    assert not matmul_7x5.function.symbols


@lang.kernel
def cyclic_rows(x: f32[M, N], y: f32[M, N]):
    # Rows dealt to WORKERS threads round-robin, as Hidet's repeat * spatial deals tasks.
    for w in lang.parallel(WORKERS):
        for i, j in (repeat(lang.ceil_div(M, WORKERS), N) * spatial(WORKERS, 1)).on(w):
            if i < M:
                y[i, j] = x[i, j] + i


@pytest.mark.parametrize("m", SIZES)
def test_task_mapping_loop(m):
    x = random_array((m, 13), seed=m)
    y = np.full_like(x, np.nan)
    cyclic_rows(x, y)
    assert_close(y, x + np.arange(m, dtype=np.float32)[:, None])
    assert any(isinstance(s, ForTask) for s in walk(cyclic_rows.function.body))


def test_task_mapping_names_its_variables_after_the_loop():
    (loop,) = [s for s in walk(cyclic_rows.function.body) if isinstance(s, ForTask)]
    assert [v.name for v in loop.vars] == ["i", "j"]
    assert loop.mapping.num_workers == WORKERS


def tile_copy(mapping):
    """A kernel over the closure's task mapping; ``flat`` runs while parsing, on IR values."""
    rows, cols = mapping.task_shape

    def flat(i, j):
        return i * cols + j

    @lang.kernel
    def tile_copy(x: f32[rows * cols], y: f32[rows * cols]):
        for w in lang.parallel(mapping.num_workers):
            for i, j in mapping.on(w):
                y[flat(i, j)] = x[flat(i, j)] * 2.0
    return tile_copy


def test_closure_task_mapping_and_python_helper():
    mapping = repeat(4, 1) * spatial(2, 8)  # Hidet's Figure 8 shape, smaller: 16 workers
    kernel = tile_copy(mapping)
    (loop,) = [s for s in walk(kernel.function.body) if isinstance(s, ForTask)]
    assert loop.mapping == mapping
    x = random_array((64,), seed=3)
    y = np.full_like(x, np.nan)
    kernel(x, y)
    assert_close(y, x * 2)


@lang.kernel
def axpy_vectors(x: f32[N, 8], y: f32[N, 8], alpha: f32):
    for i in range(N):
        scaled = lang.broadcast(alpha, 8)
        acc = y.vload((i, 0), 8)
        acc = lang.fma(scaled, x.vload((i, 0), 8), acc)
        y[i, 0] = acc  # a vector fills consecutive elements


def test_simd_vectors():
    for n in (0, 1, 7):
        x, y = random_array((n, 8), seed=n), random_array((n, 8), seed=n + 1)
        expected = 3 * x + y
        axpy_vectors(x, y, 3.0)
        assert_close(y, expected)


@lang.kernel
def piecewise(x: f32[N], y: f32[N], lo: f32, hi: f32):
    for i in range(N):
        v = x[i]
        if v < lo:
            y[i] = lo - 1.0
        elif v < hi and not v == 0.0:
            y[i] = math.exp(v) if v > 0.0 else -v
        else:
            y[i] = min(max(v, lo), hi) * 2.0


def piecewise_reference(x, lo, hi):
    return np.where(x < lo, lo - 1, np.where((x < hi) & (x != 0),
                                             np.where(x > 0, np.exp(x), -x),
                                             np.clip(x, lo, hi) * 2)).astype(np.float32)


@pytest.mark.parametrize("n", SIZES)
def test_if_elif_else_and_scalar_parameters(n):
    x = random_array((n,), seed=n)
    x[: n // 3] = 0.0
    y = np.full_like(x, np.nan)
    piecewise(x, y, -0.5, 0.5)
    assert_close(y, piecewise_reference(x, -0.5, 0.5))


def test_interpreter_agrees_with_compiled_kernel():
    x = random_array((13,), seed=4)
    compiled, interpreted = np.zeros_like(x), np.zeros_like(x)
    piecewise(x, compiled, -0.25, 0.75)
    interpret(piecewise.function, x, interpreted, lo=-0.25, hi=0.75)
    np.testing.assert_allclose(interpreted, compiled, rtol=1e-6)


@lang.inline
def dot_taps(x, i):
    total = 0.0
    for t in lang.static_range(len(WEIGHTS)):
        total += x[i + t] * WEIGHTS[t]
    return total


@lang.kernel
def convolve(x: f32[N], y: f32[N - 2]):
    for i in range(N - 2):
        y[i] = dot_taps(x, i)


def test_static_range_unrolls_closure_constants():
    loops = [s for s in walk(convolve.function.body) if isinstance(s, For)]
    assert len(loops) == 1  # the taps are copies of the body, not a loop
    for n in (3, 4, 37):
        x = random_array((n,), seed=n)
        y = np.full((n - 2,), np.nan, np.float32)
        convolve(x, y)
        assert_close(y, np.convolve(x, WEIGHTS[::-1], "valid").astype(np.float32), reduction=3)


COMPILE_TIME_BRANCH = False


@lang.kernel
def strided(x: f32[N], y: f32[N]):
    for i in range(1, N, 3):
        if COMPILE_TIME_BRANCH:
            y[i] = 0.0
        else:
            y[i] = x[i - 1]
    for i in range(0, N, 3):
        y[i] = -x[i]
    for i in range(2, N, 3):
        y[i] = x[i] * 10.0


def test_range_with_start_and_step_and_a_compile_time_if():
    assert not any(isinstance(s, If) for s in walk(strided.function.body))
    for n in (0, 1, 2, 7, 13):
        x = random_array((n,), seed=n)
        y = np.full_like(x, np.nan)
        strided(x, y)
        i = np.arange(n)
        expected = np.select([i % 3 == 1, i % 3 == 2], [x[np.maximum(i - 1, 0)], x * 10], -x)
        assert_close(y, expected)


@lang.inline
def pairwise_sum(x, row, start, count):
    """Recurses while compiling: each call with count > 1 expands into two halves."""
    half = count // 2
    return x[row, start] if count == 1 else \
        pairwise_sum(x, row, start, half) + pairwise_sum(x, row, start + half, count - half)


@lang.kernel
def row_sums(x: f32[M, 13], y: f32[M]):
    for i in range(M):
        y[i] = pairwise_sum(x, i, 0, 13)


def test_a_recursive_helper_ending_while_compiling_expands():
    for m in (0, 1, 7):
        x = random_array((m, 13), seed=m)
        y = np.full(m, np.nan, np.float32)
        row_sums(x, y)
        assert_close(y, x.sum(axis=1), reduction=13)


@lang.kernel
def checked_copy(x: f32[N], y: f32[N]):
    assert N >= 2, "needs two elements"
    for i in range(N):
        y[i] = x[i]


def test_assert_fails_at_run_time_with_the_source_line():
    checked_copy(np.ones(2, np.float32), np.zeros(2, np.float32))
    with pytest.raises(KernelError, match=r"test_kernels.py:\d+: assertion failed: needs two"):
        checked_copy(np.ones(1, np.float32), np.zeros(1, np.float32))


def test_torch_tensors_are_written_in_place():
    torch = pytest.importorskip("torch")
    a, b = torch.rand(7, 5), torch.rand(5, 13)
    c = torch.full((7, 13), float("nan"))
    matmul(a, b, c)
    assert_close(c.numpy(), (a @ b).numpy(), reduction=5)
    with pytest.raises(ArgumentError, match="'a'.*contiguous"):
        matmul(torch.rand(5, 7).T, b, c)


def test_parsed_program_reads_like_the_source():
    assert str(matmul.function) == "\n".join([
        "def matmul(a: float32[M, K], b: float32[K, N], c: float32[M, N], M: int64, K: int64, "
        "N: int64):",
        "  for i in range(M) parallel:",
        "    for j in range(N):",
        "      local acc: float32[]",
        "      acc[] = 0.0",
        "      for k in range(K):",
        "        acc[] = acc[] + a[i, k] * b[k, j]",
        "      c[i, j] = acc[]",
    ])
