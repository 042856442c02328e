"""Element-wise operators: unary math, binary arithmetic and comparison with broadcasting,
variadic Max/Min/Sum/Mean, Where, Cast, Clip and the parametrised activations.

Each op is one row of a table from ONNX name to the scalar expression it applies, so the
whole family shares one definition of broadcasting and one of dtype checking.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from treadle.errors import DTypeError, ModelError
from treadle.graph.operator import OpContext, register
from treadle.graph.ops.common import (broadcast_load, broadcast_shape, normalize_axis,
                                      onnx_dtype, same_dtype)
from treadle.graph.tensor import normalize_dim
from treadle.ir import dtypes
from treadle.ir.compute import compute
from treadle.ir.expr import (Buffer, Const, Expr, as_expr, call, cast, eq, logical_and,
                             maximum, minimum, ne, select)


def _c(value, like: Expr) -> Const:
    return Const(value, like.dtype)


def _bits_only(fn: Callable) -> Callable:
    """Marks an op of bool or integer inputs (complementing bits means nothing for floats)."""
    fn.bits_only = True
    return fn


def _float_only(fn: Callable) -> Callable:
    fn.float_only = True
    return fn


def _sigmoid(x):
    return _c(1.0, x) / (_c(1.0, x) + call("exp", -x))


def _softplus(x):
    # log(1 + exp(x)) overflows for large x, where it equals x.
    return select(x > _c(20.0, x), x, call("log", _c(1.0, x) + call("exp", x)))


def _mish(x):
    # x tanh(log(1 + e)) = x n / (n + 2) with n = e (e + 2), e = exp(x): exact algebra,
    # one exponential (vectorised, unlike libm's log). Above 20 it is x to float32
    # precision, and n would overflow further up.
    e = call("exp", x)
    n = e * (e + _c(2.0, x))
    return select(x > _c(20.0, x), x, x * n / (n + _c(2.0, x)))


def _gelu_erf(x):
    return _c(0.5, x) * x * (_c(1.0, x) + call("erf", x * _c(0.7071067811865476, x)))


def _gelu_tanh(x):
    inner = _c(0.7978845608028654, x) * (x + _c(0.044715, x) * x * x * x)
    return _c(0.5, x) * x * (_c(1.0, x) + call("tanh", inner))


def _is_inf(x, attrs):
    found = Const(False, dtypes.boolean)
    for key, infinity in (("detect_positive", float("inf")), ("detect_negative", float("-inf"))):
        if attrs.get(key, 1):
            found = found | eq(x, _c(infinity, x))
    return found


def _celu(x, alpha):
    return maximum(_c(0.0, x), x) + minimum(_c(0.0, x), _c(alpha, x) * (
        call("exp", x / _c(alpha, x)) - _c(1.0, x)))


def _shrink(x, attrs):
    bias, lambd = attrs.get("bias", 0.0), attrs.get("lambd", 0.5)
    return select(x < _c(-lambd, x), x + _c(bias, x),
                  select(x > _c(lambd, x), x - _c(bias, x), _c(0, x)))


def _sign(x: Expr) -> Expr:
    sign = select(x > _c(0, x), _c(1, x), select(x < _c(0, x), _c(-1, x), _c(0, x)))
    # NaN stays NaN, as in ONNX's reference (numpy.sign) and ONNX Runtime.
    return select(ne(x, x), x, sign) if x.dtype.is_float else sign


# Unary ops: ONNX name -> f(x, attrs). Float-only ones reject integer inputs by name.
UNARY: dict[str, Callable] = {
    "Relu": lambda x, a: maximum(x, _c(0, x)),
    "Neg": lambda x, a: -x,
    "Abs": lambda x, a: call("abs", x),
    "Sign": lambda x, a: _sign(x),
    "Identity": lambda x, a: x,
    "Not": _bits_only(lambda x, a: ~x),
    "Exp": _float_only(lambda x, a: call("exp", x)),
    "Log": _float_only(lambda x, a: call("log", x)),
    "Sqrt": _float_only(lambda x, a: call("sqrt", x)),
    "Reciprocal": _float_only(lambda x, a: _c(1.0, x) / x),
    "Tanh": _float_only(lambda x, a: call("tanh", x)),
    "Sigmoid": _float_only(lambda x, a: _sigmoid(x)),
    "Erf": _float_only(lambda x, a: call("erf", x)),
    "Sin": _float_only(lambda x, a: call("sin", x)),
    "Cos": _float_only(lambda x, a: call("cos", x)),
    "Floor": _float_only(lambda x, a: call("floor", x)),
    "Ceil": _float_only(lambda x, a: call("ceil", x)),
    "Round": _float_only(lambda x, a: call("round", x)),
    "Softplus": _float_only(lambda x, a: _softplus(x)),
    "Softsign": _float_only(lambda x, a: x / (_c(1.0, x) + call("abs", x))),
    "LeakyRelu": _float_only(lambda x, a: select(x < _c(0.0, x), x * _c(a.get("alpha", 0.01), x), x)),
    "Elu": _float_only(lambda x, a: select(x < _c(0.0, x), _c(a.get("alpha", 1.0), x) * (call("exp", x) - _c(1.0, x)), x)),
    "Selu": _float_only(lambda x, a: _c(a.get("gamma", 1.0507009873554805), x) * select(
        x > _c(0.0, x), x, _c(a.get("alpha", 1.6732632423543772), x) * (call("exp", x) - _c(1.0, x)))),
    "HardSigmoid": _float_only(lambda x, a: maximum(_c(0.0, x), minimum(_c(1.0, x), x * _c(a.get("alpha", 0.2), x) + _c(a.get("beta", 0.5), x)))),
    "HardSwish": _float_only(lambda x, a: x * maximum(_c(0.0, x), minimum(_c(1.0, x), x * _c(1 / 6, x) + _c(0.5, x)))),
    "ThresholdedRelu": _float_only(lambda x, a: select(x > _c(a.get("alpha", 1.0), x), x, _c(0.0, x))),
    "Mish": _float_only(lambda x, a: _mish(x)),
    "Gelu": _float_only(lambda x, a: _gelu_tanh(x) if a.get("approximate", "none") == "tanh" else _gelu_erf(x)),
    "Celu": _float_only(lambda x, a: _celu(x, a.get("alpha", 1.0))),
    "Swish": _float_only(lambda x, a: x * _sigmoid(x * _c(a.get("alpha", 1.0), x))),
    "Shrink": _shrink,
    # NaN is the one value unequal to itself (kernels keep IEEE semantics, no fast-math).
    "IsNaN": _float_only(lambda x, a: ne(x, x)),
    "IsInf": _float_only(_is_inf),
    "BitwiseNot": _bits_only(lambda x, a: ~x),
    **{op: _float_only(lambda x, a, f=op.lower(): call(f, x))
       for op in ("Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh")},
}


def _div(a, b):
    return a / b if a.dtype.is_float else a // b


def _mod(a, b, attrs):
    # The truncated remainder, with the dividend's sign (fmod's rule): C's % for integers,
    # the exact fmod for floats, whatever the size of the quotient.
    r = call("fmod", a, b) if a.dtype.is_float else a % b
    if attrs.get("fmod", 0):
        return r
    # Python-style modulo, as numpy.mod: a non-zero result takes the divisor's sign. Against
    # an infinite divisor a finite dividend of the other sign so becomes the divisor
    # (opset 28).
    return select(logical_and(ne(r, _c(0, r)), ne(r < _c(0, r), b < _c(0, b))), r + b, r)


def _bit_shift(a, b, left: bool):
    # A negative amount, or one of the type's width or more (undefined in C), leaves only
    # the sign fill: -1 for a right shift of a negative signed value, else 0.
    beyond = (b < _c(0, b)) | (b >= _c(a.dtype.bits, b))
    amount = select(beyond, _c(0, b), b)
    if left:
        return select(beyond, _c(0, a), a << amount)
    fill = select(a < _c(0, a), _c(-1, a), _c(0, a)) if a.dtype.kind == "int" else _c(0, a)
    return select(beyond, fill, a >> amount)


# Binary ops: ONNX name -> f(a, b, attrs).
BINARY: dict[str, Callable] = {
    "Add": lambda a, b, t: a + b,
    "Sub": lambda a, b, t: a - b,
    "Mul": lambda a, b, t: a * b,
    "Div": lambda a, b, t: _div(a, b),
    "Mod": _mod,
    "Equal": lambda a, b, t: eq(a, b),
    "Less": lambda a, b, t: a < b,
    "LessOrEqual": lambda a, b, t: a <= b,
    "Greater": lambda a, b, t: a > b,
    "GreaterOrEqual": lambda a, b, t: a >= b,
    "And": lambda a, b, t: a & b,
    "Or": lambda a, b, t: a | b,
    "Xor": lambda a, b, t: ne(a, b),
    "BitwiseAnd": lambda a, b, t: a & b,
    "BitwiseOr": lambda a, b, t: a | b,
    "BitwiseXor": lambda a, b, t: a ^ b,
    "BitShift": lambda a, b, t: _bit_shift(a, b, t["direction"] == "LEFT"),
    "PRelu": lambda a, b, t: select(a < _c(0, a), a * b, a),
}

# Variadic ops: ONNX name -> (combine two values, finish(total, count)).
VARIADIC: dict[str, tuple[Callable, Callable]] = {
    "Max": (maximum, lambda t, n: t),
    "Min": (minimum, lambda t, n: t),
    "Sum": (lambda a, b: a + b, lambda t, n: t),
    "Mean": (lambda a, b: a + b, lambda t, n: t / _c(float(n), t)),
}


def _in_float32(fn: Callable, *values: Expr) -> Expr:
    """``fn(*values)``, where bfloat16 values are worked on in float32 and the result is
    rounded back once, as ONNX Runtime computes a bfloat16 node (C has no bfloat16
    arithmetic; ``ir.passes.widen_half`` widens what other ops leave, per operation)."""
    if all(v.dtype != dtypes.bfloat16 for v in values):
        return fn(*values)
    result = fn(*(cast(v, dtypes.float32) if v.dtype == dtypes.bfloat16 else v
                  for v in values))
    return cast(result, dtypes.bfloat16) if result.dtype == dtypes.float32 else result


def _define_unary(op: str, fn: Callable):
    def define(ctx: OpContext):
        x = ctx.input(0)
        if getattr(fn, "float_only", False) and not x.dtype.is_float:
            raise ctx.error(f"needs a float input, got {x.dtype}")
        if getattr(fn, "bits_only", False) and x.dtype.is_float:
            raise ctx.error(f"needs a bool or integer input, got {x.dtype}", DTypeError)
        return [compute("y", x.shape, lambda *i: _in_float32(lambda v: fn(v, ctx.attrs), x[i]))]
    register(op)(define)


def _define_binary(op: str, fn: Callable):
    def define(ctx: OpContext):
        a, b = ctx.input(0), ctx.input(1)
        if op != "PRelu":
            same_dtype(ctx, a, b)
        shape = broadcast_shape(ctx, a.shape, b.shape)
        return [compute("y", shape, lambda *i: _in_float32(
            lambda u, v: fn(u, v, ctx.attrs), broadcast_load(a, i, shape),
            broadcast_load(b, i, shape)))]
    register(op)(define)


def _define_variadic(op: str, combine: Callable, finish: Callable):
    def define(ctx: OpContext):
        xs = [ctx.input(k) for k in range(ctx.num_inputs)]
        same_dtype(ctx, *xs)
        shape = broadcast_shape(ctx, *(x.shape for x in xs))

        def fold(*values):
            total = values[0]
            for value in values[1:]:
                total = combine(total, value)
            return finish(total, len(values))
        return [compute("y", shape, lambda *i: _in_float32(
            fold, *(broadcast_load(x, i, shape) for x in xs)))]
    register(op)(define)


for _name, _fn in UNARY.items():
    _define_unary(_name, _fn)
for _name, _fn in BINARY.items():
    _define_binary(_name, _fn)
for _name, (_combine, _finish) in VARIADIC.items():
    _define_variadic(_name, _combine, _finish)


@register("Pow")
def power(ctx: OpContext):
    """base ** exponent in the base's dtype. An integer base is raised in float64 and
    truncated toward zero, as ONNX Runtime does (2 ** -1 is 0, 7 ** 0.5 is 2)."""
    a, b = ctx.input(0), ctx.input(1)
    if not (a.dtype.is_float or a.dtype in (dtypes.int32, dtypes.int64)):
        raise ctx.unsupported(f"Pow of {a.dtype} base")
    shape = broadcast_shape(ctx, a.shape, b.shape)
    power = _small_integer(ctx.data(1))
    work = a.dtype if a.dtype.is_float else dtypes.float64

    def element(*i):
        base = broadcast_load(a, i, shape)
        if power is None:
            exponent = cast(broadcast_load(b, i, shape), work)
            return cast(call("pow", cast(base, work), exponent), a.dtype)
        # A known small integer power as products: the loop stays vectorisable (GPT-2's
        # GELU computes x ** 3 for every activation), as ONNX Runtime does for 2 and 3.
        product = base
        for _ in range(power - 1):
            product = product * base
        return product
    return [compute("y", shape, element)]


def _small_integer(exponent) -> int | None:
    """The exponent when it is one known value among 1..4, else None."""
    if exponent is None or exponent.size != 1:
        return None
    value = float(exponent.reshape(()))
    return int(value) if value in (1.0, 2.0, 3.0, 4.0) else None


@register("Where")
def where(ctx: OpContext):
    cond, a, b = ctx.input(0), ctx.input(1), ctx.input(2)
    same_dtype(ctx, a, b)
    if cond.dtype != dtypes.boolean:
        raise ctx.error(f"condition must be bool, got {cond.dtype}")
    shape = broadcast_shape(ctx, cond.shape, a.shape, b.shape)
    return [compute("y", shape, lambda *i: select(broadcast_load(cond, i, shape),
                                                  broadcast_load(a, i, shape),
                                                  broadcast_load(b, i, shape)))]


@register("Cast")
def cast_op(ctx: OpContext):
    x = ctx.input(0)
    target = onnx_dtype(ctx, ctx.required_attr("to"))
    return [compute("y", x.shape, lambda *i: _convert(x[i], target))]


@register("CastLike")
def cast_like(ctx: OpContext):
    x, like = ctx.input(0), ctx.input(1)
    return [compute("y", x.shape, lambda *i: _convert(x[i], like.dtype))]


def _convert(value: Expr, target) -> Expr:
    # Float to bool is "not zero", as in C and ONNX.
    if target == dtypes.boolean and not value.dtype.is_bool:
        return ne(value, _c(0, value))
    return cast(value, target)


@register("Clip")
def clip(ctx: OpContext):
    x = ctx.input(0)
    low = ctx.buffers[1] if ctx.has_input(1) else None
    high = ctx.buffers[2] if ctx.has_input(2) else None
    for bound in (low, high):
        if bound is not None and bound.rank != 0 and bound.shape != (as_expr(1),):
            raise ctx.error("min and max must be scalars")

    def element(*i):
        value = x[i]
        # A missing bound is the type's most extreme finite value (ONNX's default, as in
        # ONNX Runtime): a float infinity clips to it; NaN passes through either way.
        if low is not None:
            value = maximum(value, low[(0,) * low.rank])
        elif x.dtype.is_float:
            value = maximum(value, _c(-_largest(x.dtype), value))
        if high is not None:
            value = minimum(value, high[(0,) * high.rank])
        elif x.dtype.is_float:
            value = minimum(value, _c(_largest(x.dtype), value))
        return value
    return [compute("y", x.shape, element)]


def _largest(dtype: dtypes.DataType) -> float:
    """The largest finite value of a float type (numpy has no bfloat16)."""
    if dtype == dtypes.bfloat16:
        return float.fromhex("0x1.fep127")
    return float(np.finfo(dtype.numpy).max)

# ---- linear quantization ------------------------------------------------------------------
# The integer types a QuantizeLinear may produce, with the range it saturates to.
QUANTIZED = {t: (float(np.iinfo(t.numpy).min), float(np.iinfo(t.numpy).max))
             for t in (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16)}


def _scale_index(ctx: OpContext, x: Buffer, scale: Buffer) -> Callable[[tuple], tuple]:
    """Where element i of x finds its scale (and zero point): one for the whole tensor,
    one per index along ``axis``, or with ``block_size`` one per block along it."""
    block = int(ctx.attr("block_size", 0))
    if scale.rank == 0:
        return lambda i: ()
    if scale.rank == 1 and normalize_dim(scale.shape[0]) == 1 and not block:
        return lambda i: (as_expr(0),)
    axis = normalize_axis(ctx, int(ctx.attr("axis", 1)), x.rank)
    if not block:
        if scale.rank != 1:
            raise ctx.error(f"a per-axis scale must be 1-D, got rank {scale.rank}")
        length, size = normalize_dim(scale.shape[0]), normalize_dim(x.shape[axis])
        if isinstance(length, int) and isinstance(size, int):
            if length != size:
                raise ctx.error(f"a per-axis scale needs {size} values, one per index "
                                f"along axis {axis}, got {length}")
        else:
            ctx.require(eq(as_expr(length), as_expr(size)),
                        f"a per-axis scale has one value per index along axis {axis}")
        return lambda i: (i[axis],)
    if scale.rank != x.rank:
        raise ctx.error(f"a blocked scale must have x's rank {x.rank}, got {scale.rank}")
    return lambda i: tuple(v // block if a == axis else v for a, v in enumerate(i))


@register("QuantizeLinear")
def quantize_linear(ctx: OpContext):
    """saturate(round(x / scale) + zero point), rounding half to even (C's rint), in the
    scale's precision unless ``precision`` names another."""
    x, scale = ctx.input(0), ctx.input(1)
    _usable_scales(ctx)
    zero = ctx.input(2) if ctx.has_input(2) else None
    out = zero.dtype if zero is not None else onnx_dtype(ctx, ctx.attr("output_dtype") or 2)
    if out not in QUANTIZED:
        raise ctx.unsupported(f"quantizing to {out}")
    work = onnx_dtype(ctx, ctx.attr("precision")) if ctx.attr("precision") else scale.dtype
    where, (low, high) = _scale_index(ctx, x, scale), QUANTIZED[out]

    def element(*i):
        q = call("round", cast(x[i], work) / cast(scale[where(i)], work))
        # Saturate in float32 at least: a float16 cannot hold 65535.
        q = cast(q, dtypes.promote(work, dtypes.float32))
        if zero is not None:
            q = q + cast(zero[where(i)], q.dtype)
        return cast(minimum(maximum(q, Const(low, q.dtype)), Const(high, q.dtype)), out)
    return [compute("y", x.shape, element)]


def _usable_scales(ctx: OpContext) -> None:
    """A constant scale must be finite and not zero: dividing by it gives no step."""
    scale = ctx.data(1)
    if scale is not None and scale.dtype != np.uint16:  # bfloat16 bits, not values
        bad = ~np.isfinite(scale) | (scale == 0)
        if bad.any():
            raise ctx.error(f"scale {scale.reshape(-1)[np.argmax(bad.reshape(-1))]} is not a "
                            "finite non-zero number", ModelError)


@register("DequantizeLinear")
def dequantize_linear(ctx: OpContext):
    """(x - zero point) * scale, in the output type: the scale's unless ``output_dtype``."""
    x, scale = ctx.input(0), ctx.input(1)
    _usable_scales(ctx)
    zero = ctx.input(2) if ctx.has_input(2) else None
    if not x.dtype.is_integer:
        raise ctx.unsupported(f"dequantizing {x.dtype}")
    out = onnx_dtype(ctx, ctx.attr("output_dtype")) if ctx.attr("output_dtype") else scale.dtype
    where = _scale_index(ctx, x, scale)

    def element(*i):
        value = cast(x[i], out)
        if zero is not None:
            value = value - cast(zero[where(i)], out)
        return value * cast(scale[where(i)], out)
    return [compute("y", x.shape, element)]


# The ops whose every output element reads the inputs only at its own (broadcast) index:
# they commute with a transposition of all their inputs (see passes.channels_last).
ELEMENTWISE = frozenset({*UNARY, *BINARY, *VARIADIC, "Pow", "Where", "Cast", "Clip"})
