"""widen_bfloat16: arithmetic on bfloat16 values runs in float32 and rounds back.

C has no bfloat16 arithmetic (treadle holds bfloat16 as raw bits), so every operation
whose operands are bfloat16 scalars (arithmetic, comparisons, min and max, math calls,
accumulation) becomes the same operation on float32 casts of them, its bfloat16 result
cast back. Each operation rounds once, as an ONNX node computing in bfloat16 does; the
C printer refuses any bfloat16 operation left over.
"""
from __future__ import annotations

from treadle.ir import dtypes
from treadle.ir.compute import combine
from treadle.ir.expr import Binary, Call, Expr, Unary, cast
from treadle.ir.functor import rewrite
from treadle.ir.stmt import Accumulate, Function, Store

__all__ = ["widen_bfloat16"]


def widen_bfloat16(func: Function) -> Function:
    return func.with_body(rewrite(func.body, _widen))


def _is_bfloat16(e: Expr) -> bool:
    return e.dtype == dtypes.bfloat16


def _in_float32(e: Expr, rebuild) -> Expr:
    """``rebuild(widen)`` with ``widen`` casting a bfloat16 operand to float32, its result
    cast back to bfloat16 where ``e`` was bfloat16."""
    wide = rebuild(lambda x: cast(x, dtypes.float32) if _is_bfloat16(x) else x)
    return cast(wide, dtypes.bfloat16) if _is_bfloat16(e) else wide


# Node type -> its widened form, or None when no operand is bfloat16.
WIDEN = {
    Binary: lambda e: _in_float32(e, lambda w: Binary(e.op, w(e.a), w(e.b)))
    if _is_bfloat16(e.a) or _is_bfloat16(e.b) else None,
    Unary: lambda e: _in_float32(e, lambda w: Unary(e.op, w(e.a))) if _is_bfloat16(e.a) else None,
    Call: lambda e: _in_float32(e, lambda w: Call(e.func, tuple(w(a) for a in e.args)))
    if any(_is_bfloat16(a) for a in e.args) and e.func != "prefetch" else None,
    # The printer writes an accumulation as buffer = combine(buffer, value): so does this,
    # widened.
    Accumulate: lambda s: Store(s.buffer, (), _widen_expr(combine(s.op, s.buffer[()], s.value)))
    if s.buffer.dtype == dtypes.bfloat16 else None,
}


def _widen(node):
    """The widened form of ``node``, or None to keep it."""
    rule = WIDEN.get(type(node))
    return None if rule is None else rule(node)


def _widen_expr(e: Expr) -> Expr:
    widened = _widen(e)
    return e if widened is None else widened
