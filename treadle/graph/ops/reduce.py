"""Reductions over axes: the ReduceXxx family, ArgMax and ArgMin.

A ReduceXxx op is one row of a table: a map applied to each element, a combiner (sum,
prod, max, min) over the reduced axes, and a map applied to the combined value with the
number of elements it combined (Mean divides by it, L2 takes the square root). Reducing
over no axes (``noop_with_empty_axes``) is the same definition with an empty reduce
domain, which is exactly ONNX's meaning: ReduceSumSquare squares, ReduceL1 takes |x|.

Half-precision inputs accumulate in float32; the final map of an integer input runs in
float64 and rounds back. ``reduce_axes`` and ``project`` are the index bookkeeping other
families (softmax, normalisations, pooling) share.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from treadle.graph.operator import OpContext, register
from treadle.graph.ops.common import normalize_axes, normalize_axis
from treadle.graph.tensor import normalize_dim
from treadle.ir import dtypes
from treadle.ir.compute import Compute, compute, reduce
from treadle.ir.dtypes import DataType
from treadle.ir.expr import Buffer, Const, Expr, as_expr, call, cast, eq, ne, select


def accumulator(dtype: DataType) -> DataType:
    """The dtype sums of ``dtype`` values run in: float32 for half precision."""
    return dtypes.float32 if dtype in (dtypes.float16, dtypes.bfloat16) else dtype


def project(index: Sequence[Expr], axes: Sequence[int], keepdims: bool) -> tuple[Expr, ...]:
    """The element of a reduction over ``axes`` that the full index ``index`` falls in."""
    if keepdims:
        return tuple(as_expr(0) if d in axes else v for d, v in enumerate(index))
    return tuple(v for d, v in enumerate(index) if d not in axes)


def reduce_axes(name: str, shape: Sequence[Expr], axes: Sequence[int], keepdims: bool,
                fvalue: Callable[[tuple[Expr, ...]], Expr], op: str,
                dtype: Optional[DataType] = None) -> Compute:
    """Combines ``fvalue(index)`` with ``op`` over ``axes`` of a tensor of ``shape``; the
    reduced axes become 1 (keepdims) or disappear."""
    axes = sorted(axes)
    out_shape = [as_expr(1) if d in axes else n for d, n in enumerate(shape)
                 if keepdims or d not in axes]

    def element(*idx):
        out, red = list(idx[:len(out_shape)]), iter(idx[len(out_shape):])
        kept = iter(v for d, v in enumerate(out) if not (keepdims and d in axes))
        return fvalue(tuple(next(red) if d in axes else next(kept) for d in range(len(shape))))
    return reduce(name, out_shape, [shape[d] for d in axes], element, op, dtype)


def count(shape: Sequence[Expr], axes: Sequence[int]) -> Expr:
    total = as_expr(1)
    for d in axes:
        total = total * shape[d]
    return as_expr(normalize_dim(total))


@dataclass(frozen=True)
class Reduction:
    combiner: str
    pre: Callable[[Expr], Expr] = lambda x: x
    post: Optional[Callable[[Expr, Expr], Expr]] = None  # (combined value, element count)


REDUCTIONS: dict[str, Reduction] = {
    "ReduceSum": Reduction("sum"),
    "ReduceMean": Reduction("sum", post=lambda s, n: s / n),
    "ReduceMax": Reduction("max"),
    "ReduceMin": Reduction("min"),
    "ReduceProd": Reduction("prod"),
    "ReduceL1": Reduction("sum", pre=lambda x: call("abs", x)),
    "ReduceL2": Reduction("sum", pre=lambda x: x * x, post=lambda s, n: call("sqrt", s)),
    "ReduceSumSquare": Reduction("sum", pre=lambda x: x * x),
    "ReduceLogSum": Reduction("sum", post=lambda s, n: call("log", s)),
}


def _finish(value: Expr, dtype: DataType, fn: Callable[[Expr], Expr]) -> Expr:
    """``fn`` (a float formula) of an accumulated value, rounded to the output ``dtype``."""
    work = value.dtype if value.dtype.is_float else dtypes.float64
    return cast(fn(cast(value, work)), dtype)


def reduce_tensor(op: str, x: Buffer, axes: Sequence[int], keepdims: bool) -> Compute:
    """The ``op`` row of REDUCTIONS (or ReduceLogSumExp) over ``axes`` of ``x``."""
    if op == "ReduceLogSumExp":
        return _log_sum_exp(x, axes, keepdims)
    rule, acc = REDUCTIONS[op], accumulator(x.dtype)
    combined = reduce_axes(op.lower(), x.shape, axes, keepdims,
                           lambda j: rule.pre(cast(x[j], acc)), rule.combiner)
    if rule.post is None and acc == x.dtype:
        return combined
    n = count(x.shape, axes)
    post = rule.post or (lambda s, n: s)
    return compute(op.lower(), combined.shape,
                   lambda *i: _finish(combined[i], x.dtype, lambda s: post(s, cast(n, s.dtype))))


def _log_sum_exp(x: Buffer, axes: Sequence[int], keepdims: bool) -> Compute:
    """log(sum(exp(x - m))) + m with m the maximum, so exp never overflows; an infinite
    or empty maximum shifts by 0 instead (inf - inf would be NaN)."""
    work = accumulator(x.dtype) if x.dtype.is_float else dtypes.float64
    high = reduce_axes("lse_max", x.shape, axes, keepdims, lambda j: cast(x[j], work), "max")

    def shift(i):
        m = high[i]
        return select(call("abs", m) < Const(float("inf"), work), m, Const(0.0, work))
    total = reduce_axes("lse_sum", x.shape, axes, keepdims,
                        lambda j: call("exp", cast(x[j], work) - shift(project(j, axes, keepdims))),
                        "sum")
    return compute("reducelogsumexp", total.shape,
                   lambda *i: cast(call("log", total[i]) + shift(i), x.dtype))


def _axes(ctx: OpContext, rank: int) -> list[int]:
    """Axes from the attribute (older opsets) or input 1 (ReduceSum 13+, the rest 18+);
    none given means all, or none at all with ``noop_with_empty_axes``."""
    if ctx.attr("axes") is not None:
        axes = [int(a) for a in ctx.attr("axes")]
    elif ctx.has_input(1):
        axes = ctx.known(1, "axes")
        if not all(isinstance(a, int) for a in axes):
            raise ctx.unsupported(f"axes {[str(a) for a in axes]} depend on symbolic sizes")
    else:
        axes = []
    if not axes:
        return [] if ctx.attr("noop_with_empty_axes", 0) else list(range(rank))
    return normalize_axes(ctx, axes, rank)


def _define_reduction(op: str):
    def define(ctx: OpContext):
        x = ctx.input(0)
        axes, keepdims = _axes(ctx, x.rank), bool(ctx.attr("keepdims", 1))
        if not x.dtype.is_bool:
            return [reduce_tensor(op, x, axes, keepdims)]
        if op not in ("ReduceMax", "ReduceMin"):
            raise ctx.unsupported(f"{op} of a bool tensor")
        return [_reduce_bool(op, x, axes, keepdims)]
    register(op)(define)


def _reduce_bool(op: str, x: Buffer, axes: Sequence[int], keepdims: bool) -> Compute:
    """The maximum of bools is any, the minimum all: the reduction of their bytes, whose
    identities (0 and 255) make an empty maximum false and an empty minimum true."""
    combined = reduce_axes(op.lower(), x.shape, axes, keepdims,
                           lambda j: cast(x[j], dtypes.uint8), REDUCTIONS[op].combiner)
    return compute(op.lower(), combined.shape, lambda *i: cast(combined[i], dtypes.boolean))


for _name in (*REDUCTIONS, "ReduceLogSumExp"):
    _define_reduction(_name)


def arg_reduce(x: Buffer, axis: int, keepdims: bool, largest: bool, last: bool) -> Compute:
    """The int64 position of the largest (or smallest) element along ``axis``: the first
    or the ``last`` one where it occurs. Two reductions: the extreme value, then the
    smallest (largest) position holding it; the fallback keeps a result in range.

    A NaN counts as the extreme, as in numpy's argmax (ONNX Runtime's position of a NaN
    depends on where it stands): the extreme is then NaN, which equals nothing, so the
    positions holding it are those of the NaNs."""
    extreme = reduce_axes("extreme", x.shape, [axis], True, lambda j: x[j],
                          "max" if largest else "min")
    fallback = as_expr(0) if last else x.shape[axis] - 1

    def position(j):
        holds = eq(x[j], extreme[project(j, [axis], True)])
        if x.dtype.is_float:
            holds = holds | ne(x[j], x[j])
        return select(holds, j[axis], fallback)
    return reduce_axes("arg", x.shape, [axis], keepdims, position, "max" if last else "min")


def _define_arg(op: str, largest: bool):
    def define(ctx: OpContext):
        x = ctx.input(0)
        if x.rank == 0:
            raise ctx.error("needs an input of rank 1 or more")
        axis = normalize_axis(ctx, int(ctx.attr("axis", 0)), x.rank)
        if normalize_dim(x.shape[axis]) == 0:
            raise ctx.error(f"axis {axis} has size 0, so there is no {op[3:].lower()}imum")
        return [arg_reduce(x, axis, bool(ctx.attr("keepdims", 1)), largest,
                           bool(ctx.attr("select_last_index", 0)))]
    register(op)(define)


_define_arg("ArgMax", True)
_define_arg("ArgMin", False)
