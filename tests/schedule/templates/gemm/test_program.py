"""The GEMM template's programs on computes it was never told about: matmul, batched
matmul with broadcasting, convolution as implicit GEMM, a fused epilogue — against numpy,
over several schedule configs (split_k included)."""

import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle.backend.cpu import generate
from treadle.config import override
from treadle.ir.compute import compute, reduce
from treadle.ir.dtypes import float32
from treadle.ir.expr import Buffer, Const, Var, logical_and, maximum, select
from treadle.ir.functor import evaluate, walk
from treadle.ir.stmt import DeclBuffer, For
from treadle.ir.lower import lower
from treadle.runtime.build import compile_function
from treadle.ir.tabulate import tabulate
from treadle.schedule.templates.gemm import (GemmConfig, match_gemm, match_gemm_output,
                                             schedule_gemm, with_constants)
from treadle.target import cpu
from treadle.target.cpu import host

# The default, small blocks with ragged edges, a 4x24 and a 1x48 register tile, split K.
CONFIGS = [GemmConfig(), GemmConfig(12, 32, 5, 6, 16), GemmConfig(8, 48, 16, 4, 24),
           GemmConfig(3, 96, 64, 1, 48), GemmConfig(12, 16, 8, 6, 16, split_k=2),
           GemmConfig(6, 16, 32, 6, 16, split_k=3)]


def build(inputs, out, cfg=GemmConfig()):
    """The kernel as f(*inputs, output, **symbols)."""
    pattern = match_gemm_output(out)
    assert pattern is not None
    return runner(schedule_gemm("gemm", inputs, pattern, cfg))


def runner(kernel):
    """``kernel`` as f(*arrays, **symbols), its workspaces allocated (full of NaN) per call."""
    function = compile_function(kernel.function)

    def run(*arrays, **symbols):
        scratch = [np.full([evaluate(d) for d in w.shape], np.nan, w.dtype.numpy)
                   for w in kernel.workspaces]
        function(*arrays, *scratch, **symbols)
    run.kernel = kernel
    return run


def symbolic_matmul():
    M, N, K = Var("M"), Var("N"), Var("K")
    a, b = Buffer("a", float32, (M, K)), Buffer("b", float32, (K, N))
    return a, b, reduce("c", [M, N], [K], lambda i, j, r: a[i, r] * b[r, j])


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_matmul_symbolic_sizes(cfg):
    a, b, c = symbolic_matmul()
    kernel = build([a, b], c, cfg)
    for m, n, k in [(1, 1, 1), (7, 61, 97), (97, 7, 257), (128, 128, 128), (3, 5, 0)]:
        x, y = random_array((m, k), seed=1), random_array((k, n), seed=2)
        out = np.full((m, n), np.nan, np.float32)
        kernel(x, y, out)
        assert_close(out, x @ y, reduction=k, context=f"{m}x{n}x{k}")


def test_symbolic_columns_store_whole_panels_in_loops_of_constant_length():
    """With N a symbol, each row's whole micro-panels are stored by loops of micro_n
    (a trip count of min(micro_n, ...) per panel cost attention's T x T products 20%),
    and only the ragged last panel by a loop of what is left."""
    a, b, c = symbolic_matmul()
    cfg = GemmConfig(12, 32, 16, 6, 16)
    kernel = build([a, b], c, cfg)
    extents = [s.extent for s in walk(kernel.kernel.function.body)
               if isinstance(s, For) and s.kind == "vectorize"]
    assert any(isinstance(e, Const) and e.value == 16 for e in extents), extents
    assert any(not isinstance(e, Const) for e in extents), extents
    for n in (16, 47, 61):
        x, y = random_array((7, 9), seed=n), random_array((9, n), seed=n + 1)
        out = np.full((7, n), np.nan, np.float32)
        kernel(x, y, out)
        assert_close(out, x @ y, reduction=9, context=f"N={n}")


@pytest.mark.parametrize("cfg", CONFIGS[:2] + CONFIGS[4:5], ids=str)
def test_matmul_prime_constant_sizes(cfg):
    m, n, k = 2039, 23, 131
    a, b = Buffer("a", float32, (m, k)), Buffer("b", float32, (k, n))
    c = reduce("c", [m, n], [k], lambda i, j, r: a[i, r] * b[r, j])
    x, y = random_array((m, k), seed=1), random_array((k, n), seed=2)
    out = np.zeros((m, n), np.float32)
    build([a, b], c, cfg)(x, y, out)
    assert_close(out, x @ y, reduction=k)


@pytest.mark.parametrize("cfg", [GemmConfig(), CONFIGS[4]], ids=str)
def test_gemv_long_k(cfg):
    a, b = Buffer("a", float32, (1, 2039)), Buffer("b", float32, (2039, 37))
    c = reduce("c", [1, 37], [2039], lambda i, j, r: a[i, r] * b[r, j])
    x, y = random_array((1, 2039), seed=9), random_array((2039, 37), seed=10)
    out = np.zeros((1, 37), np.float32)
    kernel = build([a, b], c, cfg)
    kernel(x, y, out)
    assert_close(out, x @ y, reduction=2039)
    # One row of accumulators cannot cover the FMA latency: K is split over several sums.
    vector_sets = [s.buffer.shape for s in walk(kernel.kernel.function.body)
                   if isinstance(s, DeclBuffer) and s.buffer.dtype.is_vector]
    assert any(len(shape) == 3 and shape[0].value >= 1 for shape in vector_sets), vector_sets


@pytest.mark.parametrize("cfg", [GemmConfig(), CONFIGS[5]], ids=str)
def test_fused_bias_relu_epilogue(cfg):
    a, b, c = symbolic_matmul()
    bias = Buffer("bias", float32, (c.shape[1],))
    out = compute("out", c.shape, lambda i, j: maximum(c[i, j] + bias[j], 0.0))
    kernel = build([a, b, bias], out, cfg)
    x, y, z = random_array((13, 29), seed=1), random_array((29, 19), seed=2), random_array(19)
    result = np.zeros((13, 19), np.float32)
    kernel(x, y, z, result)
    assert_close(result, np.maximum(x @ y + z, 0), reduction=29)


@pytest.mark.parametrize("flags", [("avx2", "fma"), ("avx2", "fma", "avx512f", "avx512vl")])
def test_register_tile_in_the_widest_vectors_a_row_fills(monkeypatch, flags):
    """Rows of 16 and 48 floats go in 512-bit registers where the CPU has them, rows of 24
    in 256-bit ones; the numbers are the same either way."""
    if not set(flags) <= set(host().features):
        pytest.skip(f"the CPU lacks {set(flags) - set(host().features)}")
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: set(flags))
    cpu.host.cache_clear()
    try:
        m, n, k = 37, 101, 29
        a, b = Buffer("a", float32, (m, k)), Buffer("b", float32, (k, n))
        c = reduce("c", [m, n], [k], lambda i, j, r: a[i, r] * b[r, j])
        x, y = random_array((m, k), seed=3), random_array((k, n), seed=4)
        for cfg in (GemmConfig(12, 32, 16, 6, 16), GemmConfig(8, 48, 16, 4, 24),
                    GemmConfig(3, 96, 8, 1, 48)):
            kernel = build([a, b], c, cfg)
            wide = "avx512f" in flags and cfg.micro_n % 16 == 0
            source = generate([lower(kernel.kernel.function, host())])
            assert ("_mm512_fmadd_ps" in source) == wide, cfg
            assert ("_mm256_fmadd_ps" in source) != wide, cfg
            out = np.full((m, n), np.nan, np.float32)
            kernel(x, y, out)
            assert_close(out, x @ y, reduction=k, context=str(cfg))
    finally:
        monkeypatch.undo()
        cpu.host.cache_clear()


def test_batched_matmul_with_broadcast_right_operand():
    a, b = Buffer("a", float32, (3, 13, 17)), Buffer("b", float32, (17, 11))
    c = reduce("c", [3, 13, 11], [17], lambda t, i, j, r: a[t, i, r] * b[r, j])
    x, y = random_array((3, 13, 17), seed=3), random_array((17, 11), seed=4)
    out = np.zeros((3, 13, 11), np.float32)
    build([a, b], c, CONFIGS[4])(x, y, out)
    assert_close(out, x @ y, reduction=17)


def test_batched_matmul_shared_batch_axis():
    a, b = Buffer("a", float32, (5, 7, 9)), Buffer("b", float32, (5, 9, 3))
    c = reduce("c", [5, 7, 3], [9], lambda t, i, j, r: a[t, i, r] * b[t, r, j])
    x, y = random_array((5, 7, 9), seed=5), random_array((5, 9, 3), seed=6)
    out = np.zeros((5, 7, 3), np.float32)
    build([a, b], c)(x, y, out)
    assert_close(out, x @ y, reduction=9)


def convolution(x: Buffer, w: Buffer, stride: int, pad: int):
    """The compute of an NCHW convolution of ``x`` by the OIHW filters ``w``, zero-padded."""
    (n, ci, h, wd), (co, _, k, _) = ((d.value for d in b.shape) for b in (x, w))
    oh, ow = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1

    def element(b, o, i, j, c, p, q):
        hi, wi = i * stride + p - pad, j * stride + q - pad
        inside = logical_and(hi >= 0, hi < h, wi >= 0, wi < wd)
        return select(inside, x[b, c, hi, wi], 0.0) * w[o, c, p, q]
    return reduce("conv", [n, co, oh, ow], [ci, k, k], element)


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


@pytest.mark.parametrize("stride, pad, cfg", [(1, 1, GemmConfig()), (2, 0, CONFIGS[1]),
                                              (2, 1, CONFIGS[5])], ids=str)
def test_convolution_as_implicit_gemm(stride, pad, cfg):
    n, ci, h, wd, co, k = 2, 3, 11, 7, 5, 3
    x, w = Buffer("x", float32, (n, ci, h, wd)), Buffer("w", float32, (co, ci, k, k))
    out = convolution(x, w, stride, pad)
    pattern = match_gemm(out)
    assert [len(a) for a in (pattern.batch_axes, pattern.m_axes, pattern.n_axes)] == [0, 3, 1]
    xv, wv = random_array((n, ci, h, wd), seed=7), random_array((co, ci, k, k), seed=8)
    result = np.zeros([d.value for d in out.shape], np.float32)
    build([x, w], out, cfg)(xv, wv, result)
    assert_close(result, conv_reference(xv, wv, stride, pad), reduction=ci * k * k)


@pytest.mark.parametrize("batch, channels, cfg", [
    (Var("n"), 37, GemmConfig(12, 32, 16, 6, 16)),  # blocks of 16 across rows of 37
    (1, 24, GemmConfig(12, 16, 16, 6, 16)),        # every other block straddles two rows
    (1, 20, GemmConfig(12, 16, 64, 6, 16)),        # blocks of whole rows (64 -> 60)
    (Var("n"), 24, GemmConfig(12, 16, 8, 6, 16, split_k=3)),  # parts of K start mid-row
], ids=str)
def test_channels_last_convolution_k_blocks_across_rows(batch, channels, cfg):
    """Packing walks K as stretches of rows of input channels; a block may start and end
    anywhere in a row."""
    h, wd, co, k = 7, 5, 19, 3
    x = Buffer("x", float32, (batch, h, wd, channels))
    w = Buffer("w", float32, (k, k, channels, co))
    out = reduce("conv", [batch, h - k + 1, wd - k + 1, co], [k, k, channels],
                 lambda b, i, j, o, p, q, c: x[b, i + p, j + q, c] * w[p, q, c, o])
    n = 1 if batch == 1 else 2
    xv, wv = random_array((n, h, wd, channels), seed=3), random_array((k, k, channels, co), seed=4)
    result = np.full((n, h - k + 1, wd - k + 1, co), np.nan, np.float32)
    build([x, w], out, cfg)(xv, wv, result)
    expected = conv_reference(xv.transpose(0, 3, 1, 2), wv.transpose(3, 2, 0, 1), 1, 0)
    assert_close(result, expected.transpose(0, 2, 3, 1), reduction=channels * k * k)


def test_symbolic_condition_becomes_a_kernel_assert():
    from treadle.errors import KernelError
    from treadle.ir.expr import eq
    M, K, K2 = Var("M"), Var("K"), Var("K2")
    a, b = Buffer("a", float32, (M, K)), Buffer("b", float32, (K2, 8))
    c = reduce("c", [M, 8], [K], lambda i, j, r: a[i, r] * b[r, j])
    kernel = schedule_gemm("checked", [a, b], match_gemm(c), checks=[(eq(K, K2), "K == K2")])
    compiled = compile_function(kernel.function)
    x, y = random_array((3, 5), seed=1), random_array((5, 8), seed=2)
    out = np.zeros((3, 8), np.float32)
    compiled(x, y, out)
    assert_close(out, x @ y, reduction=5)
    with pytest.raises(KernelError, match="K == K2"):
        compiled(x, random_array((4, 8), seed=3), out)


@pytest.mark.parametrize("m,n,k,cfg", [
    (61, 257, 131, GemmConfig(66, 32, 16, 6, 16)),   # ragged K blocks, ragged N tiles
    (13, 200, 50, GemmConfig(18, 48, 16, 6, 16)),    # a ragged micro-panel of rows
    (100, 384, 77, GemmConfig(102, 96, 32, 6, 16)),  # whole N tiles, ragged K
    (128, 768, 64, GemmConfig(144, 192, 32, 4, 24)),  # a BERT-like row of tiles
])
def test_left_packed_once_for_a_row_of_tiles(m, n, k, cfg):
    """Constant M within one block: the threads pack A for all of K once, together, into
    a workspace, and every tile reads those panels."""
    a, b = Buffer("a", float32, (m, k)), Buffer("b", float32, (k, n))
    c = reduce("c", [m, n], [k], lambda i, j, r: a[i, r] * b[r, j])
    kernel = schedule_gemm("gemm", [a, b], match_gemm(c), cfg)
    # The panels of every K block: [blocks, panels of rows, rows of a panel, block_k + pad].
    (workspace,) = kernel.workspaces
    blocks, panels, rows, depth = [evaluate(d) for d in workspace.shape]
    assert blocks * depth >= k and panels * rows >= m
    x, y = random_array((m, k), seed=m), random_array((k, n), seed=n)
    out = np.full((m, n), np.nan, np.float32)
    runner(kernel)(x, y, out)
    assert_close(out, x @ y, reduction=k)


def _laid_out_once(inputs, out, constants, cfg):
    """The kernel of ``out`` whose constant right factor ``constants`` (buffer -> array)
    is laid out at compile time, and the tabulated layout it reads."""
    pattern = with_constants(match_gemm_output(out), list(constants))
    assert pattern.constant_right
    kernel = schedule_gemm("gemm", inputs, pattern, cfg)
    assert len(kernel.derived) == 1
    assert not set(constants) & set(kernel.function.buffers)  # read via the layout only
    assert "prefetch(" in str(kernel.function)  # the next micro-panel, one line per step
    return runner(kernel), tabulate(kernel.derived[0], constants)


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("transposed", [False, True])
def test_constant_right_factor_laid_out_once(cfg, transposed):
    """Weights in panel order from compile time (none packed at run time): symbolic and
    prime M, N and K not multiples of the register tile, a transposed weight."""
    M, n, k = Var("M"), 37, 131
    a = Buffer("a", float32, (M, k))
    shape = (n, k) if transposed else (k, n)
    w = Buffer("w", float32, shape)
    c = reduce("c", [M, n], [k],
               lambda i, j, r: a[i, r] * (w[j, r] if transposed else w[r, j]))
    wv = random_array(shape, seed=5)
    kernel, panels = _laid_out_once([a, w], c, {w: wv}, cfg)
    for m in (1, 7, 61):
        x = random_array((m, k), seed=m)
        out = np.full((m, n), np.nan, np.float32)
        kernel(x, out, panels)
        assert_close(out, x @ (wv.T if transposed else wv), reduction=k, context=f"M={m}")


def test_constant_convolution_filter_laid_out_once():
    """A convolution's filter, K = (rows, columns, channels), laid out as one matrix."""
    n, ci, h, wd, co, k = 2, 3, 11, 7, 5, 3
    x, w = Buffer("x", float32, (n, ci, h, wd)), Buffer("w", float32, (co, ci, k, k))
    out = reduce("conv", [n, co, h - 2, wd - 2], [k, k, ci],
                 lambda b, o, i, j, p, q, c: x[b, c, i + p, j + q] * w[o, c, p, q])
    xv, wv = random_array((n, ci, h, wd), seed=7), random_array((co, ci, k, k), seed=8)
    kernel, panels = _laid_out_once([x, w], out, {w: wv}, GemmConfig())
    result = np.full((n, co, h - 2, wd - 2), np.nan, np.float32)
    kernel(xv, result, panels)
    assert_close(result, conv_reference(xv, wv, 1, 0), reduction=ci * k * k)


def test_right_factor_with_a_batch_axis_or_input_is_packed_per_call():
    a, b, c = symbolic_matmul()
    pattern = match_gemm(c)
    assert not with_constants(pattern, []).constant_right  # b is an input
    assert not with_constants(pattern, [b]).constant_right  # N and K are symbolic
    x, y = Buffer("x", float32, (4, 3, 5)), Buffer("y", float32, (4, 5, 6))
    batched = reduce("bmm", [4, 3, 6], [5], lambda i, j, l, r: x[i, j, r] * y[i, r, l])
    assert not with_constants(match_gemm(batched), [y]).constant_right


@pytest.mark.parametrize("m", [1, 3])
def test_constant_right_factor_streamed_in_one_pass(m):
    """A GEMV-like product over laid-out weights takes all of a long, prime K in one block."""
    k, n = 1031, 53
    a, w = Buffer("a", float32, (m, k)), Buffer("w", float32, (k, n))
    c = reduce("c", [m, n], [k], lambda i, j, r: a[i, r] * w[r, j])
    wv = random_array((k, n), seed=3)
    kernel, panels = _laid_out_once([a, w], c, {w: wv}, GemmConfig())
    # One K block: the left factor's panels are [1 block, 1 micro-panel, m, K + a line].
    assert f"float32[1, 1, {m}, {k + 16}]" in str(kernel.kernel.function)
    x = random_array((m, k), seed=4)
    out = np.full((m, n), np.nan, np.float32)
    kernel(x, out, panels)
    assert_close(out, x @ wv, reduction=k)


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_symbolic_rows_over_constant_columns(cfg):
    """M symbolic and N known, on two threads: the row blocks, evened out at run time
    (resolve.tile_rows), cover every M once."""
    M = Var("M")
    a, b = Buffer("a", float32, (M, 40)), Buffer("b", float32, (40, 72))
    c = reduce("c", [M, 72], [40], lambda i, j, r: a[i, r] * b[r, j])
    with override(num_threads=2):
        kernel = build([a, b], c, cfg)
        for m in (0, 1, 7, 61, 97, 127, 196, 400):
            x, y = random_array((m, 40), seed=m), random_array((40, 72), seed=2)
            out = np.full((m, 72), np.nan, np.float32)
            kernel(x, y, out)
            assert_close(out, x @ y, reduction=40, context=f"M = {m}")
