"""Integer products on the GEMM template: 8-bit factors summed in int32, exactly, on VNNI
(four bytes per lane) and on the 16-bit path every AVX2 CPU has (two halves per lane)."""
from dataclasses import replace

import numpy as np
import pytest

from tests.schedule.templates.gemm.test_program import CONFIGS, runner
from treadle.ir.compute import reduce
from treadle.ir.dtypes import int8, int32, uint8
from treadle.ir.expr import Buffer, Var, cast
from treadle.ir.tabulate import tabulate
from treadle.schedule.templates.gemm import match_gemm_output, with_constants
from treadle.schedule.templates.gemm.program import emit
from treadle.schedule.templates.gemm.resolve import resolve
from treadle.target.cpu import host

AVX2 = replace(host(), features=("avx2", "fma"), vector_registers=16)
# Odd, prime and zero sizes, K not a multiple of a word's four bytes.
SHAPES = [(1, 1, 1), (7, 61, 97), (97, 7, 257), (13, 33, 6), (3, 5, 0), (0, 4, 9),
          (64, 48, 128)]


def _product(left=uint8, right=int8, transposed=False):
    M, N, K = Var("M"), Var("N"), Var("K")
    a = Buffer("a", left, (M, K))
    b = Buffer("b", right, (N, K) if transposed else (K, N))
    return a, b, reduce("c", [M, N], [K], lambda i, j, r: cast(a[i, r], int32) * cast(
        b[j, r] if transposed else b[r, j], int32))


def _values(dtype, shape, seed):
    info = np.iinfo(dtype.numpy)  # the type's whole range, its limits included
    values = np.random.default_rng(seed).integers(info.min, info.max + 1, shape)
    values.flat[:2] = [info.min, info.max][:values.size]
    return values.astype(dtype.numpy)


def _kernel(pattern, target, cfg, name="words"):
    return emit(resolve(pattern, cfg, target), name)


def _check(kernel, a, b, shapes, transposed=False, panels=None):
    run = runner(kernel)
    for m, n, k in shapes:
        x = _values(a.dtype, (m, k), seed=m + 1)
        y = _values(b.dtype, (n, k) if transposed else (k, n), seed=n + 2)
        out = np.full((m, n), -7, np.int32)
        operands = (x, out, panels(y)) if panels else (x, y, out)
        run(*operands, M=m, N=n, K=k) if not panels else run(*operands, M=m)
        expected = x.astype(np.int64) @ (y.T if transposed else y).astype(np.int64)
        np.testing.assert_array_equal(out, expected, err_msg=f"{m}x{n}x{k}")


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("target", [host(), AVX2], ids=["host", "avx2"])
def test_unsigned_by_signed_bytes_exact(cfg, target):
    a, b, c = _product()
    pattern = replace(match_gemm_output(c, integer=True), inputs=(a, b))
    kernel = _kernel(pattern, target, cfg)
    expected = "dot_u8s8" if target.int8_dot(kernel_lanes(pattern, cfg, target)) else "dot_s16"
    assert expected in str(kernel.function)
    _check(kernel, a, b, SHAPES)


def kernel_lanes(pattern, cfg, target):
    return resolve(pattern, cfg, target).lanes


@pytest.mark.parametrize("left, right", [(int8, int8), (uint8, uint8), (int8, uint8)])
def test_other_signedness_takes_sixteen_bit_halves(left, right):
    a, b, c = _product(left, right)
    kernel = _kernel(replace(match_gemm_output(c, integer=True), inputs=(a, b)), host(),
                     CONFIGS[1])
    assert "dot_s16" in str(kernel.function) and "dot_u8s8" not in str(kernel.function)
    _check(kernel, a, b, SHAPES)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("target", [host(), AVX2], ids=["host", "avx2"])
def test_constant_weights_laid_out_in_words_once(transposed, target):
    """Weights packed into words at compile time (tabulated with numpy), K = 131 ragged."""
    M, n, k = Var("M"), 37, 131
    a = Buffer("a", uint8, (M, k))
    b = Buffer("b", int8, (n, k) if transposed else (k, n))
    c = reduce("c", [M, n], [k], lambda i, j, r: cast(a[i, r], int32) * cast(
        b[j, r] if transposed else b[r, j], int32))
    pattern = replace(with_constants(match_gemm_output(c, integer=True), [b]), inputs=(a, b))
    assert pattern.constant_right
    kernel = _kernel(pattern, target, CONFIGS[0])
    assert len(kernel.derived) == 1 and kernel.derived[0].dtype == int32
    _check(kernel, a, b, [(m, n, k) for m in (1, 7, 61, 0)], transposed,
           panels=lambda y: tabulate(kernel.derived[0], {b: y}))


def test_fused_epilogue_reads_the_int32_sums():
    """Corrections and a scale applied to each sum as it is stored, in float32."""
    a, b, c = _product()
    from treadle.ir.compute import compute
    from treadle.ir.dtypes import float32
    out = compute("y", c.shape, lambda i, j: cast(c[i, j] - 3, float32) * 0.5)
    pattern = match_gemm_output(out, integer=True)
    assert pattern is not None and pattern.epilogue is not None
    run = runner(_kernel(replace(pattern, inputs=(a, b)), host(), CONFIGS[2]))
    x, y = _values(uint8, (19, 45), 1), _values(int8, (45, 23), 2)
    result = np.zeros((19, 23), np.float32)
    run(x, y, result, M=19, N=23, K=45)
    expected = (x.astype(np.int64) @ y.astype(np.int64) - 3).astype(np.float32) * 0.5
    np.testing.assert_array_equal(result, expected)


def test_float_and_wider_integer_products_are_not_word_products():
    M, K = Var("M"), Var("K")
    a, b = Buffer("a", int32, (M, K)), Buffer("b", int32, (K, M))
    c = reduce("c", [M, M], [K], lambda i, j, r: a[i, r] * b[r, j])
    assert match_gemm_output(c, integer=True) is None
    _, _, bytes_product = _product()
    assert match_gemm_output(bytes_product) is None  # only where the template asks
