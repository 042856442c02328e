"""The CPU template for products by constant weights that the weights' bytes bound, not
the multiply-adds: a few rows times a matrix (every product of token-by-token decoding),
and any number of rows times a matrix of a few rows (a tall outer product, K of 4).

A GEMM there spends its time on what pays off only when each weight is used many times:
macro-tiles, a K-blocked accumulator, a prefetch per load. Here the weights are laid
out at compile time in column panels, [N / width][K][width] (``gemm.resolve``'s
layout), so a panel is one contiguous stream, and the next panel a thread takes follows
it in memory; each K position loads one row of the panel (a few vectors) and multiplies
it by every row's element there, broadcast.

Two ways to share the work between threads, by which side is long:

  panels  (M <= MAX_GEMV_ROWS, known at compile time) each task is one panel for
          every row: the weights, read once, split evenly (panels narrow where the
          threads would get unequal numbers of them), and the few rows' K elements
          stay in L1. The accumulators are split into ``chains`` over K positions so
          that a single row still has enough sums in flight to cover the FMA latency.
  rows    (K <= MAX_OUTER_K, any M, also symbolic) each task is a tile of rows for every
          panel: the weights stay in L1 and the output, written once row after row,
          is the traffic. Rows past the last read the last one again and store nothing.
          (Of a 16384 x 4 x 1024 product's time, most goes to the kernel zeroing the
          64 MB of fresh pages each call's output gets, not to this loop.)

Results go from registers to a row buffer in L1 and from there to the output one
element at a time through the epilogue (bias, activation), in a simd loop, as the GEMM
template stores them. Sums run in another order than the compute's.
"""
from __future__ import annotations

import functools
from contextlib import nullcontext
from dataclasses import dataclass, replace

from treadle.graph.operator import Operator
from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import float32, vector
from treadle.ir.expr import Buffer, Expr, broadcast, call, ceil_div, minimum
from treadle.ir.functor import substitute
from treadle.ir.mapping import repeat, unravel
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import canonical_kernel
from treadle.schedule.template import Fixed, FixedTemplate
from treadle.schedule.templates.gemm import match_gemm_output, with_constants
from treadle.schedule.templates.gemm.pattern import (GemmPattern, declare_parameters,
                                                     plain_left, product, role_extents)
from treadle.schedule.templates.gemm.resolve import panel_layout
from treadle.schedule.templates.thresholds import (MAX_GEMV_ROWS, MAX_OUTER_K,
                                                   MIN_GEMM_COLUMNS)
from treadle.target.cpu import CpuTarget

PANEL_VECTORS = 4  # vectors of a panel row: 256 contiguous bytes per K position on AVX-512
OUTER_ROWS = 4  # rows of a task in the rows split
UNROLL = 4  # K positions per iteration of the panels split's loop
SUMS_IN_FLIGHT = 8  # accumulators that cover an FMA's latency (4 cycles, 2 per cycle)
# The most the busiest thread's panels may exceed an even share by (768 columns on 8
# threads: 12 panels of 64 would keep 4 threads idle for half the time).
MAX_IMBALANCE = 1.1


@dataclass(frozen=True)
class Plan:
    """How the kernel is laid out: ``rows`` x ``vectors`` accumulators of ``lanes``
    floats, ``chains`` of them over K, panels of ``vectors * lanes`` columns, and the
    work split by panels or by tiles of rows (``by_rows``)."""
    rows: int
    vectors: int
    lanes: int
    chains: int
    by_rows: bool

    @property
    def width(self) -> int:
        return self.vectors * self.lanes


def match_gemv(op: Operator) -> GemmPattern | None:
    """A float32 product of a plain left matrix by constant weights, at least a GEMM's
    narrowest tile wide, with at most MAX_GEMV_ROWS rows or at most MAX_OUTER_K
    positions along K, whose output rows are its columns in memory (a channels-first
    1 x 1 convolution's are not: its stores would be strided)."""
    if len(op.definition) != 1:
        return None
    pattern = match_gemm_output(op.definition[0])
    if pattern is None or pattern.batch_axes or not pattern.n_axes or not plain_left(pattern) \
            or pattern.compute.axes[-1] != pattern.n_axes[-1]:
        return None
    pattern = with_constants(pattern, op.constant_inputs)
    extents = role_extents(pattern)
    rows, k = product(extents["m"]), product(extents["k"])
    if not (pattern.constant_right and pattern.output.dtype == float32
            and product(extents["n"]) >= MIN_GEMM_COLUMNS and k >= 1
            and (_few_rows(rows) or k <= MAX_OUTER_K)):
        return None
    return replace(pattern, inputs=tuple(op.input_buffers), checks=tuple(op.checks))


def _few_rows(rows) -> bool:
    return isinstance(rows, int) and 1 <= rows <= MAX_GEMV_ROWS


class GemvTemplate(FixedTemplate):
    name = "gemv"

    def match(self, op: Operator) -> GemmPattern | None:
        return match_gemv(op)

    def emit(self, resolved: Fixed, name: str) -> Kernel:
        return schedule_gemv(resolved.pattern, name, resolved.target)


GEMV = GemvTemplate()


def plan(pattern: GemmPattern, target: CpuTarget) -> Plan:
    """The register tile that fits ``target``'s registers (accumulators, a panel row of
    weights and the rows' broadcast elements), its panels narrower where that shares
    them more evenly between the threads. (A panel is one contiguous stretch however
    wide: the width only sets how many multiply-adds share each broadcast.)"""
    extents = role_extents(pattern)
    rows, columns = product(extents["m"]), product(extents["n"])
    by_rows = not _few_rows(rows)
    tile_rows = OUTER_ROWS if by_rows else rows
    lanes = target.widest_simd_bytes // 4
    vectors = PANEL_VECTORS
    registers = target.vector_registers
    while vectors > 1 and (tile_rows * vectors + vectors + tile_rows > registers
                           or not by_rows and _imbalance(columns, vectors * lanes,
                                                         target.cores) > MAX_IMBALANCE):
        vectors //= 2
    tile = tile_rows * vectors
    chains = max(1, min(SUMS_IN_FLIGHT // tile, (registers - vectors - tile_rows) // tile))
    return Plan(tile_rows, vectors, lanes, 1 if by_rows else chains, by_rows)


def _imbalance(columns: int, width: int, threads: int) -> float:
    """The busiest thread's panels over an even share of them."""
    panels = -(-columns // width)
    return -(-panels // threads) * threads / panels


def schedule_gemv(pattern: GemmPattern, name: str, target: CpuTarget) -> Kernel:
    p = plan(pattern, target)
    panels = panel_layout(pattern, p.width)
    extents = role_extents(pattern)
    M, N = product(extents["m"]), product(extents["n"])
    full, ragged = divmod(N, p.width)
    with FunctionBuilder(name) as fb:
        declare_parameters(fb, pattern, False, [panels.buffer])
        panel = functools.partial(_panel, fb, pattern, p, panels.buffer)
        if p.by_rows:
            for tile in fb.range(ceil_div(M, p.rows), kind="parallel", name="tile"):
                rows = _rows(fb, pattern, tile * p.rows, p.rows, M, clamped=True)
                for q in fb.range(full, name="panel"):
                    panel(rows, q, p.width)
                if ragged:
                    panel(rows, full, ragged)
        else:
            for q in fb.range(ceil_div(N, p.width), kind="parallel", name="panel"):
                rows = _rows(fb, pattern, 0, M, M, clamped=False)
                with fb.if_(q < full) if ragged else nullcontext():
                    panel(rows, q, p.width)
                if ragged:
                    with fb.else_():
                        panel(rows, q, ragged)
    return canonical_kernel(fb.function, pattern.inputs, 1, (panels,))


@dataclass(frozen=True)
class Row:
    """A row of the register tile: the M coordinates it reads at (bound by lets), and
    whether it stores (the rows split's last tile reads its last row again)."""
    coords: dict
    stores: Expr | None


def _rows(fb: FunctionBuilder, pattern: GemmPattern, first, count: int, M,
          clamped: bool) -> list[Row]:
    """Rows first .. first + count - 1; ``clamped``: those past M - 1 read that row."""
    extents = role_extents(pattern)["m"]
    rows = []
    for r in range(count):
        flat = first + r
        row = fb.let("row", minimum(flat, M - 1)) if clamped else flat
        coords = {a: fb.let(a.name, v) for a, v in zip(pattern.m_axes, unravel(row, extents))}
        rows.append(Row(coords, flat < M if clamped else None))
    return rows


def _panel(fb: FunctionBuilder, pattern: GemmPattern, p: Plan, weights: Buffer,
           rows: list[Row], q, columns: int) -> None:
    """Output columns [q * width, q * width + columns) of every row: the register tile
    summed over K, then stored through the epilogue."""
    regs = fb.buffer("regs", vector(float32, p.lanes), [p.chains, len(rows), p.vectors])
    for c, r, v in repeat(p.chains, len(rows), p.vectors, kind="unroll").on(0):
        regs[c, r, v] = broadcast(0.0, p.lanes)
    _multiply_add(fb, pattern, p, weights, rows, q, regs)
    for c, r, v in repeat(p.chains - 1, len(rows), p.vectors, kind="unroll").on(0):
        regs[0, r, v] = regs[0, r, v] + regs[c + 1, r, v]
    out = fb.buffer("results", float32, [p.width])
    for r, row in enumerate(rows):
        for v in range(p.vectors):
            out[v * p.lanes] = regs[0, r, v]
        with fb.if_(row.stores) if row.stores is not None else nullcontext():
            _store_row(fb, pattern, row, q * p.width, out, columns)


def _multiply_add(fb: FunctionBuilder, pattern: GemmPattern, p: Plan, weights: Buffer,
                  rows: list[Row], q, regs: Buffer) -> None:
    """regs[chain, r, v] += left(r, k) * weights[q, k, v] for every K position k, chain
    k % chains: UNROLL positions (or one per chain) per iteration, all of K where it is
    that short."""
    K = product(role_extents(pattern)["k"])
    step = min(K, max(UNROLL, p.chains))  # chains is a power of two: it divides the step
    for k0 in fb.range(K // step, name="k"):
        for u in range(step):
            _position(fb, pattern, p, weights, rows, q, k0 * step + u, regs, u % p.chains)
    for u in range(K % step):
        _position(fb, pattern, p, weights, rows, q, K // step * step + u, regs, 0)


def _position(fb: FunctionBuilder, pattern: GemmPattern, p: Plan, weights: Buffer,
              rows: list[Row], q, k, regs: Buffer, chain: int) -> None:
    w = [fb.let("w", weights.vload((q, k, v * p.lanes), p.lanes)) for v in range(p.vectors)]
    c = pattern.compute
    at_k = dict(zip(c.reduce_axes, unravel(k, role_extents(pattern)["k"])))
    for r, row in enumerate(rows):
        left = substitute(pattern.left, {**row.coords, **at_k})
        x = fb.let("x", broadcast(pattern.element(left), p.lanes))
        for v in range(p.vectors):
            regs[chain, r, v] = call("fma", x, w[v], regs[chain, r, v])


def _store_row(fb: FunctionBuilder, pattern: GemmPattern, row: Row, col0, values: Buffer,
               columns: int) -> None:
    """One row's results from ``values`` to the output, in a simd loop (see
    gemm.program._store_rows for why one)."""
    extents = role_extents(pattern)["n"]
    for j in fb.range(columns, kind="vectorize", name="j"):
        coords = {**row.coords, **dict(zip(pattern.n_axes, unravel(col0 + j, extents)))}
        index = tuple(coords[a] for a in pattern.compute.axes)
        pattern.output.buffer[index] = pattern.store_value(values[j], index)

