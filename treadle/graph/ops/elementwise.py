"""Element-wise operators: unary math, binary arithmetic and comparison with broadcasting,
variadic Max/Min/Sum/Mean, Where, Cast, Clip and the parametrised activations.

Each op is one row of a table from ONNX name to the scalar expression it applies, so the
whole family shares one definition of broadcasting and one of dtype checking.
"""
from __future__ import annotations

from typing import Callable

from treadle.graph.operator import OpContext, register
from treadle.graph.ops.common import broadcast_load, broadcast_shape, onnx_dtype, same_dtype
from treadle.ir import dtypes
from treadle.ir.compute import compute
from treadle.ir.expr import (Const, Expr, as_expr, call, cast, eq, logical_and, maximum,
                             minimum, ne, select)


def _c(value, like: Expr) -> Const:
    return Const(value, like.dtype)


def _float_only(fn: Callable) -> Callable:
    fn.float_only = True
    return fn


def _sigmoid(x):
    return _c(1.0, x) / (_c(1.0, x) + call("exp", -x))


def _softplus(x):
    # log(1 + exp(x)) overflows for large x, where it equals x.
    return select(x > _c(20.0, x), x, call("log", _c(1.0, x) + call("exp", x)))


def _gelu_erf(x):
    return _c(0.5, x) * x * (_c(1.0, x) + call("erf", x * _c(0.7071067811865476, x)))


def _gelu_tanh(x):
    inner = _c(0.7978845608028654, x) * (x + _c(0.044715, x) * x * x * x)
    return _c(0.5, x) * x * (_c(1.0, x) + call("tanh", inner))


def _sign(x):
    return select(x > _c(0, x), _c(1, x), select(x < _c(0, x), _c(-1, x), _c(0, x)))


# Unary ops: ONNX name -> f(x, attrs). Float-only ones reject integer inputs by name.
UNARY: dict[str, Callable] = {
    "Relu": lambda x, a: maximum(x, _c(0, x)),
    "Neg": lambda x, a: -x,
    "Abs": lambda x, a: call("abs", x),
    "Sign": lambda x, a: _sign(x),
    "Identity": lambda x, a: x,
    "Not": lambda x, a: ~x,
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
    "Mish": _float_only(lambda x, a: x * call("tanh", _softplus(x))),
    "Gelu": _float_only(lambda x, a: _gelu_tanh(x) if a.get("approximate", "none") == "tanh" else _gelu_erf(x)),
}


def _div(a, b):
    return a / b if a.dtype.is_float else a // b


def _mod(a, b, attrs):
    if attrs.get("fmod", 0):
        # C's remainder takes the dividend's sign, which is fmod's rule.
        return _fmod(a, b) if a.dtype.is_float else a % b
    if a.dtype.is_float:
        return a - call("floor", a / b) * b
    # Python-style modulo: a non-zero result takes the divisor's sign.
    r = a % b
    return select(logical_and(ne(r, _c(0, r)), ne(r < _c(0, r), b < _c(0, b))), r + b, r)


def _fmod(a, b):
    q = a / b
    return a - select(q < _c(0.0, q), call("ceil", q), call("floor", q)) * b


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
    "PRelu": lambda a, b, t: select(a < _c(0, a), a * b, a),
}

# Variadic ops: ONNX name -> (combine two values, finish(total, count)).
VARIADIC: dict[str, tuple[Callable, Callable]] = {
    "Max": (maximum, lambda t, n: t),
    "Min": (minimum, lambda t, n: t),
    "Sum": (lambda a, b: a + b, lambda t, n: t),
    "Mean": (lambda a, b: a + b, lambda t, n: t / _c(float(n), t)),
}


def _define_unary(op: str, fn: Callable):
    def define(ctx: OpContext):
        x = ctx.input(0)
        if getattr(fn, "float_only", False) and not x.dtype.is_float:
            raise ctx.error(f"needs a float input, got {x.dtype}")
        return [compute("y", x.shape, lambda *i: fn(x[i], ctx.attrs))]
    register(op)(define)


def _define_binary(op: str, fn: Callable):
    def define(ctx: OpContext):
        a, b = ctx.input(0), ctx.input(1)
        if op != "PRelu":
            same_dtype(ctx, a, b)
        shape = broadcast_shape(ctx, a.shape, b.shape)
        return [compute("y", shape, lambda *i: fn(broadcast_load(a, i, shape),
                                                  broadcast_load(b, i, shape), ctx.attrs))]
    register(op)(define)


def _define_variadic(op: str, combine: Callable, finish: Callable):
    def define(ctx: OpContext):
        xs = [ctx.input(k) for k in range(ctx.num_inputs)]
        same_dtype(ctx, *xs)
        shape = broadcast_shape(ctx, *(x.shape for x in xs))

        def element(*i):
            value = broadcast_load(xs[0], i, shape)
            for x in xs[1:]:
                value = combine(value, broadcast_load(x, i, shape))
            return finish(value, len(xs))
        return [compute("y", shape, element)]
    register(op)(define)


for _name, _fn in UNARY.items():
    _define_unary(_name, _fn)
for _name, _fn in BINARY.items():
    _define_binary(_name, _fn)
for _name, (_combine, _finish) in VARIADIC.items():
    _define_variadic(_name, _combine, _finish)


@register("Pow")
def power(ctx: OpContext):
    a, b = ctx.input(0), ctx.input(1)
    if not a.dtype.is_float:
        raise ctx.unsupported(f"Pow of {a.dtype} base")
    shape = broadcast_shape(ctx, a.shape, b.shape)
    power = _small_integer(ctx.data(1))

    def element(*i):
        base = broadcast_load(a, i, shape)
        exponent = cast(broadcast_load(b, i, shape), a.dtype)
        if power is None:
            return call("pow", base, exponent)
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
        if low is not None:
            value = maximum(value, low[(0,) * low.rank])
        if high is not None:
            value = minimum(value, high[(0,) * high.rank])
        return value
    return [compute("y", x.shape, element)]

# The ops whose every output element reads the inputs only at its own (broadcast) index:
# they commute with a transposition of all their inputs (see passes.channels_last).
ELEMENTWISE = frozenset({*UNARY, *BINARY, *VARIADIC, "Pow", "Where", "Cast", "Clip"})
