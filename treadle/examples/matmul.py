"""Two hand-written matrix multiplications in the task-mapping paradigm.

``tiled_matmul``: the CPU way. Threads are the workers of a cyclic mapping over macro-tiles
(``repeat(rounds) * spatial(threads)``); each macro-tile packs zero-padded panels of A and
B (so partial tiles need no bounds checks in the inner loop), then a register-blocked
micro-kernel of SIMD fused multiply-adds walks the panel with ``repeat`` mappings; the
write-back treats SIMD lanes as workers of a ``spatial`` mapping.

``cooperative_matmul``: the GPU way of Hidet's Figure 8, run on the CPU. 128 workers load
a tile of A cooperatively with ``repeat(4, 1) * spatial(16, 8)``, wait at a barrier, then
each computes its part of the output tile; ``split_barriers`` turns the barriers into
loop boundaries.

Both accept concrete sizes or symbol names for M, N and K.
"""
from __future__ import annotations

from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import float32, float32x8
from treadle.ir.expr import broadcast, call, ceil_div, logical_and, select
from treadle.ir.mapping import repeat, spatial
from treadle.ir.stmt import Function

LANES = 8  # float32 lanes of an AVX2 register


def _sizes(fb: FunctionBuilder, m, n, k):
    return [fb.symbol(s) if isinstance(s, str) else s for s in (m, n, k)]


def tiled_matmul(m: int | str, n: int | str, k: int | str, *, threads: int = 2,
                 block_m: int = 48, block_n: int = 64, block_k: int = 128,
                 micro_m: int = 6, micro_n: int = 16) -> Function:
    """C[M, N] = A[M, K] @ B[K, N] in float32."""
    assert block_m % micro_m == 0 and block_n % micro_n == 0 and micro_n % LANES == 0
    with FunctionBuilder("tiled_matmul") as fb:
        M, N, K = _sizes(fb, m, n, k)
        A = fb.param("A", float32, [M, K])
        B = fb.param("B", float32, [K, N])
        C = fb.param("C", float32, [M, N])
        tiles_n = ceil_div(N, block_n)
        tiles = ceil_div(M, block_m) * tiles_n
        for thread in fb.range(threads, kind="parallel", name="thread"):
            for (tile,) in (repeat(ceil_div(tiles, threads)) * spatial(threads)).on(thread):
                with fb.if_(tile < tiles):
                    row0 = fb.let("row0", tile // tiles_n * block_m)
                    col0 = fb.let("col0", tile % tiles_n * block_n)
                    acc = fb.buffer("acc", float32, [block_m, block_n])
                    for i, j in repeat(block_m, block_n).on(0):
                        acc[i, j] = 0.0
                    for kb in fb.range(ceil_div(K, block_k), name="kb"):
                        k0 = fb.let("k0", kb * block_k)
                        a_panel = _pack(fb, A, row0, k0, M, K, block_m, block_k, "a_panel")
                        b_panel = _pack(fb, B, k0, col0, K, N, block_k, block_n, "b_panel")
                        _micro_kernels(fb, a_panel, b_panel, acc, micro_m, micro_n)
                    _write_back(fb, acc, C, row0, col0, M, N)
    return fb.function


def _pack(fb, src, row0, col0, rows, cols, block_rows, block_cols, name):
    """Copies a block of ``src`` into a local panel, zero-filling past the edges."""
    panel = fb.buffer(name, float32, [block_rows, block_cols])
    for i, j in repeat(block_rows, block_cols).on(0):
        inside = logical_and(row0 + i < rows, col0 + j < cols)
        panel[i, j] = select(inside, src[row0 + i, col0 + j], 0.0)
    return panel


def _micro_kernels(fb, a_panel, b_panel, acc, micro_m, micro_n):
    block_m, block_k = a_panel.shape
    vectors = micro_n // LANES
    for mi, ni in repeat(block_m.value // micro_m, acc.shape[1].value // micro_n).on(0):
        regs = fb.buffer("regs", float32x8, [micro_m, vectors])
        for r, v in repeat(micro_m, vectors, kind="unroll").on(0):
            regs[r, v] = acc.vload((mi * micro_m + r, ni * micro_n + v * LANES), LANES)
        for kk in fb.range(block_k, name="kk"):
            for r, v in repeat(micro_m, vectors, kind="unroll").on(0):
                a = broadcast(a_panel[mi * micro_m + r, kk], LANES)
                b = b_panel.vload((kk, ni * micro_n + v * LANES), LANES)
                regs[r, v] = call("fma", a, b, regs[r, v])
        for r, v in repeat(micro_m, vectors, kind="unroll").on(0):
            acc[mi * micro_m + r, ni * micro_n + v * LANES] = regs[r, v]


def _write_back(fb, acc, C, row0, col0, M, N):
    block_m, block_n = (d.value for d in acc.shape)
    for lane in fb.range(LANES, kind="vectorize", name="lane"):
        for i, j in (repeat(block_m, block_n // LANES) * spatial(1, LANES)).on(lane):
            with fb.if_(logical_and(row0 + i < M, col0 + j < N)):
                C[row0 + i, col0 + j] = acc[i, j]


def cooperative_matmul(m: int | str, n: int | str, k: int | str) -> Function:
    """C = A @ B with 64x16 output tiles, each computed by 128 cooperating workers."""
    tile_m, tile_n, tile_k, workers = 64, 16, 8, 128
    with FunctionBuilder("cooperative_matmul") as fb:
        M, N, K = _sizes(fb, m, n, k)
        A = fb.param("A", float32, [M, K])
        B = fb.param("B", float32, [K, N])
        C = fb.param("C", float32, [M, N])
        smem_a = fb.buffer("smem_a", float32, [tile_m, tile_k], scope="shared")
        smem_b = fb.buffer("smem_b", float32, [tile_k, tile_n], scope="shared")
        tiles_n = ceil_div(N, tile_n)
        for tile in fb.range(ceil_div(M, tile_m) * tiles_n, name="tile"):
            row0 = fb.let("row0", tile // tiles_n * tile_m)
            col0 = fb.let("col0", tile % tiles_n * tile_n)
            for w in fb.range(workers, kind="parallel", name="w"):
                regs = fb.buffer("regs", float32, [4, 2])
                for i, j in repeat(4, 2).on(0):
                    regs[i, j] = 0.0
                for kb in fb.range(ceil_div(K, tile_k), name="kb"):
                    # Hidet Figure 8: 64x8 elements of A over 128 workers, 4 each.
                    for i, kk in (repeat(4, 1) * spatial(16, 8)).on(w):
                        inside = logical_and(row0 + i < M, kb * tile_k + kk < K)
                        smem_a[i, kk] = select(inside, A[row0 + i, kb * tile_k + kk], 0.0)
                    for kk, j in spatial(tile_k, tile_n).on(w):
                        inside = logical_and(kb * tile_k + kk < K, col0 + j < N)
                        smem_b[kk, j] = select(inside, B[kb * tile_k + kk, col0 + j], 0.0)
                    fb.barrier()
                    for i, j in (spatial(16, 8) * repeat(4, 2)).on(w):
                        for kk in fb.range(tile_k, kind="unroll", name="kk"):
                            slot = (i % 4, j % 2)
                            regs[slot] = regs[slot] + smem_a[i, kk] * smem_b[kk, j]
                    fb.barrier()
                for i, j in (spatial(16, 8) * repeat(4, 2)).on(w):
                    with fb.if_(logical_and(row0 + i < M, col0 + j < N)):
                        C[row0 + i, col0 + j] = regs[i % 4, j % 2]
    return fb.function
