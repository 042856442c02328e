"""The GEMM template on computes it was never told about: matmul, batched matmul with
broadcasting, and convolution as implicit GEMM — against numpy."""
import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle.ir.compute import compute, reduce
from treadle.ir.dtypes import float32
from treadle.ir.expr import Buffer, Var, logical_and, select
from treadle.runtime.module import compile_function
from treadle.schedule.templates.matmul_cpu import match_gemm, schedule_gemm


def build(inputs, out):
    pattern = match_gemm(out)
    assert pattern is not None
    return compile_function(schedule_gemm("gemm", inputs, pattern).function)


def test_roles_of_axes():
    a, b = Buffer("a", float32, (4, 5)), Buffer("b", float32, (5, 6))
    c = reduce("c", [4, 6], [5], lambda i, j, k: a[i, k] * b[k, j])
    p = match_gemm(c)
    assert p.m_axes == (c.axes[0],) and p.n_axes == (c.axes[1],) and p.batch_axes == ()
    relu = compute("r", [4], lambda i: a[i, 0])
    assert match_gemm(relu) is None


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (7, 61, 97), (97, 7, 257), (128, 128, 128)])
def test_matmul(m, n, k):
    M, N, K = Var("M"), Var("N"), Var("K")
    a, b = Buffer("a", float32, (M, K)), Buffer("b", float32, (K, N))
    c = reduce("c", [M, N], [K], lambda i, j, r: a[i, r] * b[r, j])
    kernel = build([a, b], c)
    x, y = random_array((m, k), seed=1), random_array((k, n), seed=2)
    out = np.zeros((m, n), np.float32)
    kernel(x, y, out)
    assert_close(out, x @ y, reduction=k)


def test_batched_matmul_with_broadcast_right_operand():
    a, b = Buffer("a", float32, (3, 13, 17)), Buffer("b", float32, (17, 11))
    c = reduce("c", [3, 13, 11], [17], lambda t, i, j, r: a[t, i, r] * b[r, j])
    x, y = random_array((3, 13, 17), seed=3), random_array((17, 11), seed=4)
    out = np.zeros((3, 13, 11), np.float32)
    build([a, b], c)(x, y, out)
    assert_close(out, x @ y, reduction=17)


def test_batched_matmul_shared_batch_axis():
    a, b = Buffer("a", float32, (5, 7, 9)), Buffer("b", float32, (5, 9, 3))
    c = reduce("c", [5, 7, 3], [9], lambda t, i, j, r: a[t, i, r] * b[t, r, j])
    x, y = random_array((5, 7, 9), seed=5), random_array((5, 9, 3), seed=6)
    out = np.zeros((5, 7, 3), np.float32)
    build([a, b], c)(x, y, out)
    assert_close(out, x @ y, reduction=9)


def conv_reference(x, w, stride, pad):
    n, ci, h, wd = x.shape
    co, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, co, oh, ow), np.float64)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out.astype(np.float32)


@pytest.mark.parametrize("stride, pad", [(1, 1), (2, 0), (2, 1)])
def test_convolution_as_implicit_gemm(stride, pad):
    n, ci, h, wd, co, k = 2, 3, 11, 7, 5, 3
    x, w = Buffer("x", float32, (n, ci, h, wd)), Buffer("w", float32, (co, ci, k, k))
    oh, ow = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1

    def element(b, o, i, j, c, p, q):
        hi, wi = i * stride + p - pad, j * stride + q - pad
        inside = logical_and(hi >= 0, hi < h, wi >= 0, wi < wd)
        return select(inside, x[b, c, hi, wi], 0.0) * w[o, c, p, q]
    out = reduce("conv", [n, co, oh, ow], [ci, k, k], element)
    pattern = match_gemm(out)
    assert [len(a) for a in (pattern.batch_axes, pattern.m_axes, pattern.n_axes)] == [0, 3, 1]
    xv, wv = random_array((n, ci, h, wd), seed=7), random_array((co, ci, k, k), seed=8)
    result = np.zeros((n, co, oh, ow), np.float32)
    build([x, w], out)(xv, wv, result)
    assert_close(result, conv_reference(xv, wv, stride, pad), reduction=ci * k * k)
