"""widen_half: arithmetic on half-precision values runs in float32 and rounds back.

Every operation whose operands are bfloat16 or float16 scalars (arithmetic, comparisons,
min and max, math calls, accumulation) becomes the same operation on float32 casts of
them, its result cast back. Each operation rounds once, as an ONNX node computing in half
precision does. C has no bfloat16 arithmetic (treadle holds bfloat16 as raw bits: the C
printer refuses any bfloat16 operation left over), and C compilers evaluate _Float16
expressions in float without rounding between operations, so a fused chain of float16
operations would differ from the same operations run one by one.
"""
from __future__ import annotations

from treadle.ir import dtypes
from treadle.ir.compute import combine
from treadle.ir.expr import Binary, Call, Expr, Unary, cast
from treadle.ir.functor import rewrite
from treadle.ir.stmt import Accumulate, Function, Store

__all__ = ["widen_half"]


def widen_half(func: Function) -> Function:
    return func.with_body(rewrite(func.body, _widen))


HALF = (dtypes.bfloat16, dtypes.float16)


def _is_half(e: Expr) -> bool:
    return e.dtype in HALF


def _in_float32(e: Expr, rebuild) -> Expr:
    """``rebuild(widen)`` with ``widen`` casting a half-precision operand to float32, its
    result cast back where ``e`` was half precision."""
    wide = rebuild(lambda x: cast(x, dtypes.float32) if _is_half(x) else x)
    return cast(wide, e.dtype) if _is_half(e) else wide


# Node type -> its widened form, or None when no operand is half precision.
WIDEN = {
    Binary: lambda e: _in_float32(e, lambda w: Binary(e.op, w(e.a), w(e.b)))
    if _is_half(e.a) or _is_half(e.b) else None,
    Unary: lambda e: _in_float32(e, lambda w: Unary(e.op, w(e.a))) if _is_half(e.a) else None,
    Call: lambda e: _in_float32(e, lambda w: Call(e.func, tuple(w(a) for a in e.args)))
    if any(_is_half(a) for a in e.args) and e.func != "prefetch" else None,
    # The printer writes an accumulation as buffer = combine(buffer, value): so does this,
    # widened.
    Accumulate: lambda s: Store(s.buffer, (), _widen_expr(combine(s.op, s.buffer[()], s.value)))
    if s.buffer.dtype in HALF else None,
}


def _widen(node):
    """The widened form of ``node``, or None to keep it."""
    rule = WIDEN.get(type(node))
    return None if rule is None else rule(node)


def _widen_expr(e: Expr) -> Expr:
    widened = _widen(e)
    return e if widened is None else widened
