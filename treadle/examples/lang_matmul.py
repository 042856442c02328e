"""The matrix multiplications of ``examples/matmul.py`` written in ``treadle.lang``, and a
row-wise softmax.

``tiled_matmul``: threads are the workers of a cyclic mapping over macro-tiles; each
macro-tile packs zero-padded panels of A and B, a register-blocked micro-kernel of SIMD
fused multiply-adds walks them with ``repeat`` mappings, and the write-back treats SIMD
lanes as workers of a ``spatial`` mapping. The same program as the builder version, each
helper an ``@inline`` function parsed into the kernel where it is called.

``cooperative_matmul``: Hidet's Figure 8 on the CPU: 128 workers load a tile of A
cooperatively with ``repeat(4, 1) * spatial(16, 8)``, wait at a barrier, then each
computes its part of the output tile.

``softmax``: each row's maximum, the exponentials of the row shifted by it and their sum,
then the exponentials divided by the sum, one row per parallel iteration.

Sizes are ints, or names of symbols bound from the arguments' shapes at each call.
"""
from __future__ import annotations

import math

from treadle import lang
from treadle.lang import f32, f32x8, repeat, spatial

LANES = 8  # float32 lanes of an AVX2 register


def _sizes(*sizes: int | str) -> list:
    return [lang.symbols(s) if isinstance(s, str) else s for s in sizes]


def tiled_matmul(m: int | str = "M", n: int | str = "N", k: int | str = "K", *,
                 threads: int = 2, block_m: int = 48, block_n: int = 64, block_k: int = 128,
                 micro_m: int = 6, micro_n: int = 16) -> lang.LangKernel:
    """C[M, N] = A[M, K] @ B[K, N] in float32."""
    assert block_m % micro_m == 0 and block_n % micro_n == 0 and micro_n % LANES == 0
    M, N, K = _sizes(m, n, k)

    @lang.kernel
    def tiled_matmul(a: f32[M, K], b: f32[K, N], c: f32[M, N]):
        tiles_n = lang.ceil_div(N, block_n)
        tiles = lang.ceil_div(M, block_m) * tiles_n
        for thread in lang.parallel(threads):
            for tile in (repeat(lang.ceil_div(tiles, threads)) * spatial(threads)).on(thread):
                if tile < tiles:
                    row0 = tile // tiles_n * block_m
                    col0 = tile % tiles_n * block_n
                    acc = lang.buffer(f32, [block_m, block_n])
                    for i, j in repeat(block_m, block_n).on(0):
                        acc[i, j] = 0.0
                    for kb in range(lang.ceil_div(K, block_k)):
                        a_panel = _pack(a, row0, kb * block_k, block_m, block_k)
                        b_panel = _pack(b, kb * block_k, col0, block_k, block_n)
                        _micro_kernels(a_panel, b_panel, acc, block_m, block_n, block_k,
                                       micro_m, micro_n)
                    _write_back(acc, c, row0, col0, block_m, block_n)
    return tiled_matmul


@lang.inline
def _pack(src, row0, col0, block_rows, block_cols):
    """A block of ``src`` copied into a local panel, zero past the edges."""
    rows, cols = src.shape
    panel = lang.buffer(f32, [block_rows, block_cols])
    for i, j in repeat(block_rows, block_cols).on(0):
        inside = row0 + i < rows and col0 + j < cols
        panel[i, j] = lang.select(inside, src[row0 + i, col0 + j], 0.0)
    return panel


@lang.inline
def _micro_kernels(a_panel, b_panel, acc, block_m, block_n, block_k, micro_m, micro_n):
    vectors = micro_n // LANES
    for mi, ni in repeat(block_m // micro_m, block_n // micro_n).on(0):
        regs = lang.buffer(f32x8, [micro_m, vectors])
        for r, v in repeat(micro_m, vectors, kind="unroll").on(0):
            regs[r, v] = acc.vload((mi * micro_m + r, ni * micro_n + v * LANES), LANES)
        for kk in range(block_k):
            for r, v in repeat(micro_m, vectors, kind="unroll").on(0):
                regs[r, v] = lang.fma(lang.broadcast(a_panel[mi * micro_m + r, kk], LANES),
                                      b_panel.vload((kk, ni * micro_n + v * LANES), LANES),
                                      regs[r, v])
        for r, v in repeat(micro_m, vectors, kind="unroll").on(0):
            acc[mi * micro_m + r, ni * micro_n + v * LANES] = regs[r, v]


@lang.inline
def _write_back(acc, c, row0, col0, block_m, block_n):
    rows, cols = c.shape
    for lane in lang.vectorize(LANES):
        for i, j in (repeat(block_m, block_n // LANES) * spatial(1, LANES)).on(lane):
            if row0 + i < rows and col0 + j < cols:
                c[row0 + i, col0 + j] = acc[i, j]


TILE_M, TILE_N, TILE_K, WORKERS = 64, 16, 8, 128


def cooperative_matmul(m: int | str = "M", n: int | str = "N", k: int | str = "K"
                       ) -> lang.LangKernel:
    """C = A @ B with 64x16 output tiles, each computed by 128 cooperating workers."""
    M, N, K = _sizes(m, n, k)

    @lang.kernel
    def cooperative_matmul(a: f32[M, K], b: f32[K, N], c: f32[M, N]):
        smem_a = lang.buffer(f32, [TILE_M, TILE_K], scope="shared")
        smem_b = lang.buffer(f32, [TILE_K, TILE_N], scope="shared")
        tiles_n = lang.ceil_div(N, TILE_N)
        for tile in range(lang.ceil_div(M, TILE_M) * tiles_n):
            row0 = tile // tiles_n * TILE_M
            col0 = tile % tiles_n * TILE_N
            for w in lang.parallel(WORKERS):
                regs = lang.buffer(f32, [4, 2])
                for i, j in repeat(4, 2).on(0):
                    regs[i, j] = 0.0
                for kb in range(lang.ceil_div(K, TILE_K)):
                    k0 = kb * TILE_K
                    # Hidet Figure 8: 64x8 elements of A over 128 workers, 4 each.
                    for i, kk in (repeat(4, 1) * spatial(16, 8)).on(w):
                        inside = row0 + i < M and k0 + kk < K
                        smem_a[i, kk] = lang.select(inside, a[row0 + i, k0 + kk], 0.0)
                    for kk, j in spatial(TILE_K, TILE_N).on(w):
                        inside = k0 + kk < K and col0 + j < N
                        smem_b[kk, j] = lang.select(inside, b[k0 + kk, col0 + j], 0.0)
                    lang.barrier()
                    for i, j in (spatial(16, 8) * repeat(4, 2)).on(w):
                        for kk in lang.unroll(TILE_K):
                            regs[i % 4, j % 2] += smem_a[i, kk] * smem_b[kk, j]
                    lang.barrier()
                for i, j in (spatial(16, 8) * repeat(4, 2)).on(w):
                    if row0 + i < M and col0 + j < N:
                        c[row0 + i, col0 + j] = regs[i % 4, j % 2]
    return cooperative_matmul


def softmax(rows: int | str = "R", cols: int | str = "C") -> lang.LangKernel:
    """y[r, :] = exp(x[r, :] - max(x[r, :])) / sum(exp(x[r, :] - max(x[r, :])))."""
    R, C = _sizes(rows, cols)

    @lang.kernel
    def softmax(x: f32[R, C], y: f32[R, C]):
        for r in lang.parallel(R):
            peak = -math.inf
            for j in range(C):
                peak = max(peak, x[r, j])
            total = 0.0
            for j in range(C):
                e = lang.exp(x[r, j] - peak)
                y[r, j] = e
                total += e
            for j in range(C):
                y[r, j] = y[r, j] / total
    return softmax
