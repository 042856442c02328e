"""Inverse: the inverse of each square matrix of a batch ``[..., n, n]`` (ONNX Runtime's
``com.microsoft`` Inverse, PyTorch's ``linalg_inv_ex``).

Inverting is no compute definition (every element depends on every other through a chain
of n eliminations), so the operator brings its own kernel, one matrix a parallel
iteration: Gauss-Jordan elimination with partial pivoting, which takes a copy of the
matrix to the identity by row operations while the same operations take the identity to
the inverse. The matrices it serves (a matrix power's, a model's small transforms) are
small, and the n^3 steps of each run serially.

A second result says, as LAPACK's ``info`` does, whether each matrix was invertible: 0
if so, else k + 1 for the first column k whose pivot, the largest in magnitude at or
below the diagonal, is exactly zero. The inverse of such a matrix holds infinities or NaN.
"""
from __future__ import annotations

from treadle.graph.operator import OpContext, Operator, register
from treadle.graph.tensor import normalize_dim, num_elements
from treadle.ir import dtypes
from treadle.ir.builder import FunctionBuilder
from treadle.ir.compute import Compute, compute
from treadle.ir.expr import Buffer, Load, as_expr, call, cast, eq, logical_and, ne, select
from treadle.ir.mapping import unravel
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import canonical_kernel

FLOATS = (dtypes.float32, dtypes.float64)


def _kernel(op: Operator, name: str) -> Kernel:
    (a,) = op.input_buffers
    y, info = (c.buffer for c in op.definition)
    batch, n = a.shape[:-2], a.shape[-1]
    count = num_elements(batch) if batch else 1
    with FunctionBuilder(name) as fb:
        for b in (a, y, info):
            fb.add_param(b)
        for cond, message in op.checks:  # square matrices of symbolic sizes
            fb.assert_(cond, message)
        work = fb.param("work", a.dtype, [count, n, n])
        for m in fb.range(count, kind="parallel", name="matrix"):
            lead = unravel(m, batch) if batch else ()
            _start(fb, a, work, y, info, lead, m, n)
            for k in fb.range(n, name="k"):
                _eliminate_column(fb, work, y, info, lead, m, k, n)
        fb.add_size_symbols(a.shape)
    return canonical_kernel(fb.function, op.input_buffers, 2)


def _start(fb: FunctionBuilder, a: Buffer, work: Buffer, y: Buffer, info: Buffer,
           lead: tuple, m, n) -> None:
    """Matrix ``m`` copied into the workspace, the identity into its inverse, info 0."""
    one, zero = as_expr(1.0, a.dtype), as_expr(0.0, a.dtype)
    for r in fb.range(n, name="r"):
        for c in fb.range(n, name="c"):
            fb.store(work, (m, r, c), a[(*lead, r, c)])
            fb.store(y, (*lead, r, c), select(eq(r, c), one, zero))
    fb.store(info, lead, as_expr(0, dtypes.int32))


def _eliminate_column(fb: FunctionBuilder, work: Buffer, y: Buffer, info: Buffer,
                      lead: tuple, m, k, n) -> None:
    """Column ``k`` made that of the identity: the pivot's row swapped into row k and
    divided by the pivot, then its multiples taken from every other row."""
    pivot = _pivot_row(fb, work, m, k, n)
    for c in fb.range(n, name="c"):
        for buffer, at in ((work, lambda r: (m, r, c)), (y, lambda r: (*lead, r, c))):
            held = fb.let("held", buffer[at(k)])
            fb.store(buffer, at(k), buffer[at(pivot)])
            fb.store(buffer, at(pivot), held)
    p = fb.let("pivot", work[m, k, k])
    with fb.if_(logical_and(eq(p, 0.0), eq(info[lead], 0))):
        fb.store(info, lead, cast(k + 1, dtypes.int32))
    for c in fb.range(n, name="c"):
        fb.store(work, (m, k, c), work[m, k, c] / p)
        fb.store(y, (*lead, k, c), y[(*lead, k, c)] / p)
    for r in fb.range(n, name="r"):
        with fb.if_(ne(r, k)):
            factor = fb.let("factor", work[m, r, k])
            for c in fb.range(n, name="c"):
                fb.store(work, (m, r, c), work[m, r, c] - factor * work[m, k, c])
                fb.store(y, (*lead, r, c), y[(*lead, r, c)] - factor * y[(*lead, k, c)])


def _pivot_row(fb: FunctionBuilder, work: Buffer, m, k, n):
    """The row at or below ``k`` whose element in column k is largest in magnitude (the
    first of equal ones; row k where all are NaN)."""
    best = fb.scalar("best", work.dtype, -1.0)
    row = fb.scalar("row", dtypes.index_type, k)
    for t in fb.range(as_expr(n) - k, name="t"):
        size = fb.let("size", call("abs", work[m, k + t, k]))
        with fb.if_(size > best[()]):
            fb.store(best, (), size)
            fb.store(row, (), k + t)
    return fb.let("pivot_row", row[()])


@register("Inverse", kernel=_kernel)
def inverse(ctx: OpContext) -> list[Compute]:
    """The inverse of each matrix ``[..., n, n]`` and an int32 ``[...]``, 0 where the
    matrix is invertible (see the module's note)."""
    a = ctx.input(0)
    if a.rank < 2:
        raise ctx.error(f"needs a batch of matrices, rank 2 or more, got rank {a.rank}")
    if a.dtype not in FLOATS:
        raise ctx.unsupported(f"{a.dtype.name} matrices (float32 and float64 are)")
    rows, columns = (normalize_dim(d) for d in a.shape[-2:])
    if isinstance(rows, int) and isinstance(columns, int):
        if rows != columns:
            raise ctx.error(f"needs square matrices, got {rows} x {columns}")
    elif rows != columns:
        ctx.require(eq(as_expr(rows), as_expr(columns)),
                    f"needs square matrices, got {rows} x {columns}")
    results = (Buffer("Inverse:y", a.dtype, a.shape),
               Buffer("Inverse:info", dtypes.int32, a.shape[:-2]))
    return [compute(name, b.shape, lambda *i, b=b: Load(b, i))
            for name, b in zip(("y", "info"), results)]
