"""The CPU template for products to a few columns (fewer than a GEMM tile's narrowest)
whose left factor runs along K in memory: a convolution to a few channels over a
channels-last image (an image model's last layer, back to 3 colours), a tall matrix
times a few constant columns (a regression or a two-class head).

A GEMM tile is mostly padding there, and a window over N x C x spatial loads each input
vector at a tap's offset, split across two cache lines, for a single multiply-add (a 9 x
9 convolution from 32 channels to 3 ran at half the machine's peak). Here the product is
dot products along K: a register tile of ``rows`` consecutive rows by every column holds
one vector of partial sums each; at each position of K's outer axes the vectors of the
innermost one (an image's channels, contiguous and aligned with the rows) are loaded once
for all the columns, the weights (laid out at compile time as N rows of K) once for all
the rows, and the lanes are summed at the end. Where the rows run out, the last tile reads
the last one again and stores only its own.

Sums run in another order than the compute's, as in any vectorised GEMM.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from treadle.graph.operator import Operator
from treadle.ir.builder import FunctionBuilder
from treadle.ir.compute import Compute, compute
from treadle.ir.dtypes import float32, vector
from treadle.ir.expr import Buffer, Expr, Load, broadcast, call, ceil_div, minimum
from treadle.ir.functor import free_vars, substitute
from treadle.ir.mapping import unravel
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import canonical_kernel
from treadle.schedule.template import Fixed, FixedTemplate
from treadle.schedule.templates.gemm import match_gemm_output, with_constants
from treadle.schedule.templates.gemm.pattern import (GemmPattern, declare_parameters, f32,
                                                     left_value, product, role_extents)
from treadle.schedule.templates.thresholds import MIN_GEMM_COLUMNS, VECTOR_ELEMENTS
from treadle.target.cpu import CpuTarget

MAX_ROWS = 7  # of a register tile: 8 rows by 3 columns spilled (3x slower)


@dataclass(frozen=True)
class DotPattern:
    """A narrow GEMM whose left factor is ``left`` with K's innermost axis as its last
    index, and whose right factor reads only constants."""
    gemm: GemmPattern
    left: Load


def match_dot(op: Operator) -> DotPattern | None:
    if len(op.definition) != 1:
        return None
    pattern = match_gemm_output(op.definition[0])
    if pattern is None or pattern.batch_axes or not pattern.n_axes:
        return None
    pattern = with_constants(pattern, op.constant_inputs)
    extents = role_extents(pattern)
    columns = extents["n"]
    inner = pattern.compute.reduce_axes[-1] if pattern.compute.reduce_axes else None
    left = left_value(pattern)
    if not (pattern.constant_right and all(isinstance(n, int) for n in columns)
            and 0 < math.prod(columns) < MIN_GEMM_COLUMNS
            and pattern.output.dtype == float32 and isinstance(left, Load)
            and left.dtype == float32 and left.indices and left.indices[-1] == inner
            and not any(inner in free_vars(i) for i in left.indices[:-1])
            and extents["k"][-1] % VECTOR_ELEMENTS == 0):
        return None
    return DotPattern(replace(pattern, inputs=tuple(op.input_buffers),
                              checks=tuple(op.checks)), left)


class DotTemplate(FixedTemplate):
    name = "dot"

    def match(self, op: Operator) -> DotPattern | None:
        return match_dot(op)

    def emit(self, resolved: Fixed, name: str) -> Kernel:
        return schedule_dot(resolved.pattern, name, resolved.target)


DOT = DotTemplate()


def weight_rows(pattern: GemmPattern) -> Compute:
    """The constant right factor as N rows of K, in K's row-major order."""
    extents = role_extents(pattern)
    c = pattern.compute

    def element(n, k):
        coords = {**dict(zip(pattern.n_axes, unravel(n, extents["n"]))),
                  **dict(zip(c.reduce_axes, unravel(k, extents["k"])))}
        return f32(substitute(pattern.right, coords))
    return compute("weight_rows", [product(extents["n"]), product(extents["k"])], element)


def schedule_dot(dot: DotPattern, name: str, target: CpuTarget) -> Kernel:
    pattern = dot.gemm
    extents = role_extents(pattern)
    columns, inner = product(extents["n"]), extents["k"][-1]
    lanes = target.register_lanes(inner)
    rows = max(1, min(MAX_ROWS, (target.vector_registers - columns - 2) // columns))
    weights = weight_rows(pattern)
    with FunctionBuilder(name) as fb:
        declare_parameters(fb, pattern, False, [weights.buffer])
        m = product(extents["m"])
        for tile in fb.range(ceil_div(m, rows), kind="parallel", name="tile"):
            # Rows past the last read it again, so the tail tile needs no loop of its own.
            at = [_row_coords(fb, pattern, extents, tile * rows + r, m) for r in range(rows)]
            regs = fb.buffer("regs", vector(float32, lanes), [rows, columns])
            for r in range(rows):
                for n in range(columns):
                    regs[r, n] = broadcast(0.0, lanes)
            _multiply_add(fb, dot, extents, weights.buffer, at, regs, lanes)
            for r in range(rows):
                # Each result is stored once: an epilogue may read what the store replaces.
                with fb.if_(tile * rows + r < m):
                    for n in range(columns):
                        _store(fb, pattern, extents, at[r], n, call("reduce_add", regs[r, n]))
    return canonical_kernel(fb.function, pattern.inputs, 1, (weights,))


def _row_coords(fb: FunctionBuilder, pattern: GemmPattern, extents: dict, flat, m) -> dict:
    """The M axes at row ``flat`` (the last row past the end), bound once by lets."""
    row = fb.let("row", minimum(flat, m - 1))
    return {a: fb.let(a.name, v) for a, v in zip(pattern.m_axes, unravel(row, extents["m"]))}


def _multiply_add(fb: FunctionBuilder, dot: DotPattern, extents: dict, weights: Buffer,
                  at: list[dict], regs: Buffer, lanes: int) -> None:
    """regs[r, n] += left(row r) * weights[n] over K, a vector of the innermost axis at a
    time: each left vector loaded once for every column, each weight vector once for
    every row."""
    c = dot.gemm.compute
    *outer_axes, inner_axis = c.reduce_axes
    *outer, inner = extents["k"]
    columns = regs.shape[1].value
    for k_outer in fb.range(product(outer), name="k_outer"):
        coords = dict(zip(outer_axes, unravel(k_outer, outer)))
        for v in fb.range(inner // lanes, name="v"):
            k = k_outer * inner + v * lanes
            w = [fb.let("w", weights.vload((n, k), lanes)) for n in range(columns)]
            for r, row in enumerate(at):
                index = [substitute(i, {**row, **coords, inner_axis: v * lanes})
                         for i in dot.left.indices]
                x = fb.let("x", dot.left.buffer.vload(tuple(index), lanes))
                for n in range(columns):
                    regs[r, n] = call("fma", x, w[n], regs[r, n])


def _store(fb: FunctionBuilder, pattern: GemmPattern, extents: dict, m: dict, n: int,
           value: Expr) -> None:
    coords = {**m, **dict(zip(pattern.n_axes, unravel(n, extents["n"])))}
    index = tuple(coords[a] for a in pattern.compute.axes)
    pattern.output.buffer[index] = pattern.store_value(value, index)
