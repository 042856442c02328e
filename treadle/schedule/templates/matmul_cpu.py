"""The CPU matrix-multiplication template, for every operator whose compute is a sum of
products of two operands (MatMul, Gemm, batched matmul, convolution).

``match_gemm`` reads the roles of the axes off the compute definition: output axes that
only the left factor uses are M, only the right factor N, both "batch"; the reduce axes
are K. The template never learns which operator it serves: it packs panels by evaluating
the factors at unravelled (batch, m, k) and (batch, k, n) positions, so a convolution's
im2col addressing happens inside the packing step and no im2col buffer exists.

Work distribution: threads are the workers of a cyclic mapping over macro-tiles
``repeat(rounds) * spatial(threads)``; a macro-tile packs zero-padded panels of both
factors (local padding: the micro-kernel never checks bounds), then a register-blocked
micro-kernel of AVX2 fused multiply-adds walks them with ``repeat`` mappings.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from treadle.config import config
from treadle.ir.builder import FunctionBuilder
from treadle.ir.compute import Compute, producer_of
from treadle.ir.dtypes import float32, float32x8
from treadle.ir.expr import (Binary, Buffer, Cast, Expr, Load, Var, broadcast, call, ceil_div,
                             logical_and, select)
from treadle.ir.functor import free_vars, rewrite, substitute, walk
from treadle.ir.mapping import repeat, spatial, unravel
from treadle.schedule.rules import Inliner, Kernel, canonical_kernel, reachable

LANES = 8


@dataclass(frozen=True)
class GemmConfig:
    """One point of the schedule space: macro-tile (block_*), register tile (micro_*), and
    how many parts the K loop is split into (split_k, for small M x N)."""
    block_m: int = 48
    block_n: int = 64
    block_k: int = 128
    micro_m: int = 6
    micro_n: int = 16
    split_k: int = 1


@dataclass(frozen=True)
class GemmPattern:
    compute: Compute
    left: Expr
    right: Expr
    batch_axes: tuple[Var, ...]
    m_axes: tuple[Var, ...]
    n_axes: tuple[Var, ...]
    # An element-wise compute applied to each result before it is stored (a bias, a
    # rounding cast), which reads the product at its own index.
    epilogue: Compute | None = None

    @property
    def output(self) -> Compute:
        return self.epilogue or self.compute

    def store_value(self, acc: Expr, index: tuple) -> Expr:
        if self.epilogue is None:
            return acc
        value = substitute(self.epilogue.value, dict(zip(self.epilogue.axes, index)))
        return rewrite(value, lambda n: acc if isinstance(n, Load)
                       and n.buffer == self.compute.buffer else None)


def match_gemm(c: Compute) -> GemmPattern | None:
    """The GEMM roles of a float32 ``sum(left * right)`` compute, or None."""
    if c.reduce_op != "sum" or c.dtype != float32:
        return None
    value = c.value
    if not (isinstance(value, Binary) and value.op == "*"):
        return None
    left, right = value.a, value.b
    used_left, used_right = free_vars(left), free_vars(right)
    if not (_loads_only_inputs(left) and _loads_only_inputs(right)):
        return None
    batch = tuple(a for a in c.axes if a in used_left and a in used_right)
    m = tuple(a for a in c.axes if a in used_left and a not in used_right)
    n = tuple(a for a in c.axes if a not in used_left)
    if not m and not n:
        return None
    return GemmPattern(c, left, right, batch, m, n)


def match_gemm_output(out: Compute) -> GemmPattern | None:
    """A GEMM for ``out`` itself, or for the one product ``out`` maps element-wise."""
    if out.is_reduction:
        return match_gemm(out)
    value = Inliner(reachable([out]))(out.value)
    products = {n.buffer for n in walk(value) if isinstance(n, Load)
                and producer_of(n.buffer) is not None}
    if len(products) != 1:
        return None
    product = producer_of(products.pop())
    loads = [n for n in walk(value) if isinstance(n, Load) and n.buffer == product.buffer]
    if product.shape != out.shape or any(n.indices != out.axes for n in loads):
        return None
    pattern = match_gemm(product)
    if pattern is None:
        return None
    epilogue = Compute(out.buffer, out.axes, value)
    return replace(pattern, epilogue=epilogue)


def _loads_only_inputs(e: Expr) -> bool:
    return all(producer_of(n.buffer) is None for n in walk(e) if isinstance(n, Load))


def _extents(c: Compute, axes: Sequence[Var]) -> list[Expr]:
    return [c.shape[c.axes.index(a)] for a in axes]


def _product(values: Sequence) -> Expr | int:
    total = 1
    for v in values:
        total = total * v
    return total


def schedule_gemm(name: str, inputs: Sequence[Buffer | None], pattern: GemmPattern,
                  cfg: GemmConfig = GemmConfig()) -> Kernel:
    c = pattern.compute
    batch_ext, m_ext, n_ext = (_extents(c, axes) for axes in
                               (pattern.batch_axes, pattern.m_axes, pattern.n_axes))
    k_ext = list(c.reduce_extents)
    batch, M, N, K = (_product(e) for e in (batch_ext, m_ext, n_ext, k_ext))
    threads = config.num_threads

    def at(expr: Expr, b, m, n, k) -> Expr:
        """``expr`` with the axes replaced by the unravelled flat positions."""
        values = {}
        for axes, ext, flat in ((pattern.batch_axes, batch_ext, b), (pattern.m_axes, m_ext, m),
                                (pattern.n_axes, n_ext, n), (c.reduce_axes, k_ext, k)):
            if axes and flat is not None:
                values.update(zip(axes, unravel(flat, ext)))
        return substitute(expr, values)

    with FunctionBuilder(name) as fb:
        sources = [pattern.left, pattern.right]
        if pattern.epilogue is not None:
            sources.append(pattern.epilogue.value)
        used = {n.buffer for e in sources for n in walk(e) if isinstance(n, Load)}
        for buffer in inputs:
            if buffer is not None and buffer in used:
                fb.add_param(buffer)
        out = fb.add_param(pattern.output.buffer)
        for var in sorted({v for p in fb.params for d in p.shape for v in free_vars(d)},
                          key=lambda v: v.name):
            fb.add_param(var)
        tiles_m, tiles_n = ceil_div(M, cfg.block_m), ceil_div(N, cfg.block_n)
        tiles = batch * tiles_m * tiles_n
        for thread in fb.range(threads, kind="parallel", name="thread"):
            for (tile,) in (repeat(ceil_div(tiles, threads)) * spatial(threads)).on(thread):
                with fb.if_(tile < tiles):
                    b = fb.let("b", tile // (tiles_m * tiles_n))
                    row0 = fb.let("row0", tile % (tiles_m * tiles_n) // tiles_n * cfg.block_m)
                    col0 = fb.let("col0", tile % tiles_n * cfg.block_n)
                    acc = fb.buffer("acc", float32, [cfg.block_m, cfg.block_n])
                    for i, j in repeat(cfg.block_m, cfg.block_n).on(0):
                        acc[i, j] = 0.0
                    for kb in fb.range(ceil_div(K, cfg.block_k), name="kb"):
                        k0 = fb.let("k0", kb * cfg.block_k)
                        a_panel = fb.buffer("a_panel", float32, [cfg.block_m, cfg.block_k])
                        for i, kk in repeat(cfg.block_m, cfg.block_k).on(0):
                            inside = logical_and(row0 + i < M, k0 + kk < K)
                            a_panel[i, kk] = select(inside, _f32(at(pattern.left, b, row0 + i, None, k0 + kk)), 0.0)
                        b_panel = fb.buffer("b_panel", float32, [cfg.block_k, cfg.block_n])
                        for kk, j in repeat(cfg.block_k, cfg.block_n).on(0):
                            inside = logical_and(k0 + kk < K, col0 + j < N)
                            b_panel[kk, j] = select(inside, _f32(at(pattern.right, b, None, col0 + j, k0 + kk)), 0.0)
                        _micro_kernels(fb, a_panel, b_panel, acc, cfg)
                    for i, j in repeat(cfg.block_m, cfg.block_n).on(0):
                        with fb.if_(logical_and(row0 + i < M, col0 + j < N)):
                            index = _output_index(pattern, batch_ext, m_ext, n_ext, b,
                                                  row0 + i, col0 + j)
                            out[index] = pattern.store_value(acc[i, j], index)
    return canonical_kernel(fb.function, inputs, 1)


def _f32(e: Expr) -> Expr:
    return e if e.dtype == float32 else Cast(e, float32)


def _output_index(pattern: GemmPattern, batch_ext, m_ext, n_ext, b, m, n) -> tuple:
    values = {}
    for axes, ext, flat in ((pattern.batch_axes, batch_ext, b), (pattern.m_axes, m_ext, m),
                            (pattern.n_axes, n_ext, n)):
        if axes:
            values.update(zip(axes, unravel(flat, ext)))
    return tuple(values[a] for a in pattern.compute.axes)


def _micro_kernels(fb: FunctionBuilder, a_panel, b_panel, acc, cfg: GemmConfig) -> None:
    vectors = cfg.micro_n // LANES
    tiles = repeat(cfg.block_m // cfg.micro_m, cfg.block_n // cfg.micro_n)
    registers = repeat(cfg.micro_m, vectors, kind="unroll")
    for mi, ni in tiles.on(0):
        regs = fb.buffer("regs", float32x8, [cfg.micro_m, vectors])
        for r, v in registers.on(0):
            regs[r, v] = acc.vload((mi * cfg.micro_m + r, ni * cfg.micro_n + v * LANES), LANES)
        for kk in fb.range(cfg.block_k, name="kk"):
            for r, v in registers.on(0):
                a = broadcast(a_panel[mi * cfg.micro_m + r, kk], LANES)
                bv = b_panel.vload((kk, ni * cfg.micro_n + v * LANES), LANES)
                regs[r, v] = call("fma", a, bv, regs[r, v])
        for r, v in registers.on(0):
            acc[mi * cfg.micro_m + r, ni * cfg.micro_n + v * LANES] = regs[r, v]
