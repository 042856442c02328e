"""The CUDA execution-model simulator, checked against numpy references; kernels are
lowered with the CUDA pipeline, as they would be for a GPU."""
import types

import numpy as np
import pytest

from treadle.errors import IRError, KernelError, RaceError
from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import float32, float32x8
from treadle.ir.expr import broadcast, ceil_div, logical_and, select
from treadle.ir.lower import lower
from treadle.ir.mapping import repeat, spatial
from treadle.runtime import simulate as simulate_module
from treadle.runtime.simulate import simulate

CUDA = types.SimpleNamespace(kind="cuda")
RNG = np.random.default_rng(0)


def _rand(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def add_kernel(threads=32):
    with FunctionBuilder("add") as fb:
        n = fb.symbol("n")
        a, b, c = (fb.param(name, float32, [n]) for name in "abc")
        for blk in fb.range(ceil_div(n, threads), kind="blocks", name="blk"):
            for t in fb.range(threads, kind="threads", name="t"):
                i = fb.let("i", blk * threads + t)
                with fb.if_(i < n):
                    c[i] = a[i] + b[i]
    return lower(fb.function, CUDA)


@pytest.mark.parametrize("n", [0, 1, 97])
def test_elementwise_add_over_symbolic_size(n):
    a, b, c = _rand(n), _rand(n), np.full(n, np.nan, np.float32)
    simulate(add_kernel(), a, b, c)
    np.testing.assert_array_equal(c, a + b)  # one float32 add: exact


def block_sum_kernel(threads=64, barriers=True):
    """Each block sums `threads` elements of x into out[block] with a tree in shared memory."""
    with FunctionBuilder("block_sum") as fb:
        n = fb.symbol("n")
        x = fb.param("x", float32, [n])
        out = fb.param("out", float32, [ceil_div(n, threads)])
        for blk in fb.range(ceil_div(n, threads), kind="blocks", name="blk"):
            partial = fb.buffer("partial", float32, [threads], scope="shared")
            for t in fb.range(threads, kind="threads", name="t"):
                i = fb.let("i", blk * threads + t)
                partial[t] = select(i < n, x[i], 0.0)
                stride = threads // 2
                while stride:
                    if barriers:
                        fb.barrier()
                    with fb.if_(t < stride):
                        partial[t] = partial[t] + partial[t + stride]
                    stride //= 2
                with fb.if_(t < 1):
                    out[blk] = partial[0]
    return lower(fb.function, CUDA)


@pytest.mark.parametrize("n", [1, 7, 61, 1000])
def test_block_sum_through_shared_memory(n):
    x = _rand(n)
    out = np.full(-(-n // 64), np.nan, np.float32)
    simulate(block_sum_kernel(), x, out)
    segments = np.pad(x, (0, out.size * 64 - n)).reshape(-1, 64).sum(axis=1)
    np.testing.assert_allclose(out, segments, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.sum(), x.sum(), rtol=1e-5, atol=1e-5)


def matmul_kernel():
    """C = A @ B: a block of 256 threads computes a 16x16 tile of C, one element per thread,
    stepping over K by 8 with a 16x8 tile of A and an 8x16 tile of B in shared memory."""
    with FunctionBuilder("matmul") as fb:
        m, n, k = fb.symbol("M"), fb.symbol("N"), fb.symbol("K")
        a = fb.param("A", float32, [m, k])
        b = fb.param("B", float32, [k, n])
        c = fb.param("C", float32, [m, n])
        cols = ceil_div(n, 16)
        for blk in fb.range(ceil_div(m, 16) * cols, kind="blocks", name="blk"):
            a_tile = fb.buffer("a_tile", float32, [16, 8], scope="shared")
            b_tile = fb.buffer("b_tile", float32, [8, 16], scope="shared")
            for t in fb.range(256, kind="threads", name="t"):
                top, left = fb.let("top", blk // cols * 16), fb.let("left", blk % cols * 16)
                acc = fb.scalar("acc", float32, 0.0)
                for k0 in fb.range(ceil_div(k, 8), name="k0"):
                    with fb.if_(t < 128):  # threads 0-127 load the tile of A ...
                        row, kk = fb.let("row", top + t // 8), fb.let("kk", k0 * 8 + t % 8)
                        a_tile[t // 8, t % 8] = select(logical_and(row < m, kk < k),
                                                       a[row, kk], 0.0)
                    with fb.else_():  # ... and 128-255 the tile of B
                        u = fb.let("u", t - 128)
                        kk, col = fb.let("kk", k0 * 8 + u // 16), fb.let("col", left + u % 16)
                        with fb.if_(logical_and(kk < k, col < n)):
                            b_tile[u // 16, u % 16] = b[kk, col]
                        with fb.else_():
                            b_tile[u // 16, u % 16] = 0.0
                    fb.barrier()
                    for kk in fb.range(8, kind="unroll", name="kk"):
                        fb.accumulate(acc, "sum", a_tile[t // 16, kk] * b_tile[kk, t % 16])
                    fb.barrier()
                row, col = fb.let("row", top + t // 16), fb.let("col", left + t % 16)
                with fb.if_(logical_and(row < m, col < n)):
                    c[row, col] = acc[()]
    return lower(fb.function, CUDA)


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (7, 7, 7), (61, 61, 61), (97, 97, 97),
                                     (7, 97, 61)])
def test_tiled_matmul_with_shared_tiles(m, n, k):
    a, b, c = _rand(m, k), _rand(k, n), np.full((m, n), np.nan, np.float32)
    simulate(matmul_kernel(), a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def test_a_grid_larger_than_one_pass_runs_in_several(monkeypatch):
    monkeypatch.setattr(simulate_module, "PASS_LANES", 128)  # two blocks of 64 per pass
    x, out = _rand(1000), np.full(16, np.nan, np.float32)
    simulate(block_sum_kernel(), x, out)
    np.testing.assert_allclose(out, np.pad(x, (0, 24)).reshape(16, 64).sum(axis=1),
                               rtol=1e-5, atol=1e-5)


def test_global_write_race_between_blocks_of_different_passes(monkeypatch):
    monkeypatch.setattr(simulate_module, "PASS_LANES", 32)  # one block per pass
    with FunctionBuilder("every_block_writes_the_same") as fb:
        out = fb.param("out", float32, [32])
        for blk in fb.range(2, kind="blocks", name="blk"):
            for t in fb.range(32, kind="threads", name="t"):
                out[t] = 1.0
    with pytest.raises(RaceError, match=r"out\[0\]: block 1 thread 0 writes it and block 0 thread 0 writes"):
        simulate(lower(fb.function, CUDA), np.zeros(32, np.float32))


def test_tree_reduction_without_barriers_is_a_shared_memory_race():
    x, out = _rand(100), np.zeros(2, np.float32)
    with pytest.raises(RaceError, match=r"shared buffer partial\[\d+\] in block 0: thread \d+"):
        simulate(block_sum_kernel(barriers=False), x, out)


def test_every_thread_writing_one_global_element_is_a_race():
    with FunctionBuilder("last_writer_wins") as fb:
        x = fb.param("x", float32, [64])
        out = fb.param("out", float32, [1])
        for blk in fb.range(2, kind="blocks", name="blk"):
            for t in fb.range(32, kind="threads", name="t"):
                out[0] = x[blk * 32 + t]
    with pytest.raises(RaceError, match=r"global buffer out\[0\]: block 0 thread 0 writes it "
                                        r"and block \d+ thread \d+ writes it"):
        simulate(lower(fb.function, CUDA), _rand(64), np.zeros(1, np.float32))


def test_unguarded_load_past_the_end_names_buffer_and_thread():
    with FunctionBuilder("unguarded") as fb:
        n = fb.symbol("n")
        x = fb.param("x", float32, [n])
        y = fb.param("y", float32, [ceil_div(n, 32) * 32])
        for blk in fb.range(ceil_div(n, 32), kind="blocks", name="blk"):
            for t in fb.range(32, kind="threads", name="t"):
                y[blk * 32 + t] = x[blk * 32 + t]
    func = lower(fb.function, CUDA)
    with pytest.raises(KernelError, match=r"unguarded: block 1 thread 8 reads x\[40\], "
                                          r"outside its shape \[40\]"):
        simulate(func, _rand(40), np.zeros(64, np.float32))


def test_barrier_inside_a_divergent_branch():
    with FunctionBuilder("divergent") as fb:
        y = fb.param("y", float32, [32])
        for blk in fb.range(1, kind="blocks", name="blk"):
            for t in fb.range(32, kind="threads", name="t"):
                with fb.if_(t < 5):
                    fb.barrier()
                y[t] = 1.0
    with pytest.raises(KernelError, match=r"barrier 1 \(in threads loop t > if t < 5\) is "
                                          r"reached by threads 0-4 of block 0 but not by "
                                          r"threads 5-31"):
        simulate(lower(fb.function, CUDA), np.zeros(32, np.float32))


def transpose_kernel():
    """out = x.T in 16-row slabs: 128 threads load a slab into shared memory with one task
    mapping and write it transposed with another (Hidet's cooperative load)."""
    with FunctionBuilder("transpose") as fb:
        n = fb.symbol("n")
        x = fb.param("x", float32, [n, 16])
        out = fb.param("out", float32, [16, n])
        for blk in fb.range(ceil_div(n, 16), kind="blocks", name="blk"):
            tile = fb.buffer("tile", float32, [16, 16], scope="shared")
            for w in fb.range(128, kind="threads", name="w"):
                for i, j in (repeat(2, 1) * spatial(8, 16)).on(w):
                    row = fb.let("row", blk * 16 + i)
                    tile[i, j] = select(row < n, x[select(row < n, row, 0), j], 0.0)
                fb.barrier()
                for j, i in (spatial(16, 8) * repeat(1, 2)).on(w):
                    with fb.if_(blk * 16 + i < n):
                        out[j, blk * 16 + i] = tile[i, j]
    return lower(fb.function, CUDA)


@pytest.mark.parametrize("n", [1, 16, 37])
def test_task_mappings_over_threads_lowered_for_cuda(n):
    x, out = _rand(n, 16), np.full((16, n), np.nan, np.float32)
    simulate(transpose_kernel(), x, out)
    np.testing.assert_array_equal(out, x.T)


def test_loop_extents_that_differ_between_threads():
    """Thread i sums x[0..i]: lanes leave the loop at different iterations."""
    with FunctionBuilder("prefix") as fb:
        x = fb.param("x", float32, [40])
        y = fb.param("y", float32, [40])
        for blk in fb.range(2, kind="blocks", name="blk"):
            for t in fb.range(32, kind="threads", name="t"):
                i = fb.let("i", blk * 32 + t)
                with fb.if_(i < 40):
                    acc = fb.scalar("acc", float32, 0.0)
                    for j in fb.range(i + 1, name="j"):
                        fb.accumulate(acc, "sum", x[j])
                    y[i] = acc[()]
    x, y = _rand(40), np.full(40, np.nan, np.float32)
    simulate(lower(fb.function, CUDA), x, y)
    np.testing.assert_allclose(y, np.cumsum(x), rtol=1e-5, atol=1e-5)


def test_one_block_kernel_whose_grid_loop_simplify_removed():
    with FunctionBuilder("scale") as fb:
        x = fb.param("x", float32, [8])
        for blk in fb.range(1, kind="blocks", name="blk"):
            for t in fb.range(8, kind="threads", name="t"):
                x[t] = x[t] * 2.0
    func = lower(fb.function, CUDA)
    x = _rand(8)
    expected = 2 * x
    simulate(func, x)
    np.testing.assert_array_equal(x, expected)


def test_failing_assert_reports_its_message_and_value():
    with FunctionBuilder("checked") as fb:
        x = fb.param("x", float32, [32])
        for blk in fb.range(1, kind="blocks", name="blk"):
            for t in fb.range(32, kind="threads", name="t"):
                fb.assert_(x[t] >= 0.0, "x[{value}] is negative", t)
    x = np.abs(_rand(32))
    simulate(lower(fb.function, CUDA), x)
    x[9] = -1.0
    with pytest.raises(KernelError, match=r"x\[9\] is negative"):
        simulate(lower(fb.function, CUDA), x)


@pytest.mark.parametrize("case, message", [
    ("store_outside_threads", "store outside the threads loop"),
    ("vector", "simulator runs scalar CUDA code"),
    ("shared_in_threads", "shared buffer tile_1 must be declared in the blocks loop"),
])
def test_code_that_is_not_cuda_form_is_refused(case, message):
    with FunctionBuilder(case) as fb:
        y = fb.param("y", float32, [8])
        for blk in fb.range(1, kind="blocks", name="blk"):
            tile = fb.buffer("tile", float32, [8], scope="shared")
            if case == "store_outside_threads":
                y[0] = 1.0
            for t in fb.range(8, kind="threads", name="t"):
                if case == "vector":
                    v = fb.buffer("v", float32x8, [1])
                    v[0] = broadcast(1.0, 8)
                if case == "shared_in_threads":
                    fb.buffer("tile", float32, [8], scope="shared")
                tile[t] = 1.0
                fb.barrier()
                y[t] = tile[7 - t]
    with pytest.raises(IRError, match=message):
        simulate(fb.function, np.zeros(8, np.float32))
