"""A numpy evaluator of IR expressions and of compute definitions.

Values are numpy scalars of the IR dtype (vectors are arrays of lanes), so float32
arithmetic stays float32, integer ``//`` and ``%`` follow C, and casts convert as C does:
the values are those generated code computes. The IR interpreter evaluates its
statements' expressions here, and graph-level constant folding evaluates operators'
compute definitions here, so both follow one meaning of each expression.

Evaluating a compute definition runs its expression once per element (and per reduce
point), so callers bound the work with ``work`` / ``evaluate_computes``'s ``limit``.
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from treadle.errors import IRError, KernelError, ShapeError, UnsupportedOpError
from treadle.ir import dtypes
from treadle.ir.compute import Compute, combine, identity_of
from treadle.ir.dtypes import DataType
from treadle.ir.expr import (Binary, Broadcast, Buffer, Call, Cast, Const, Expr, Load, Select,
                             Unary, Var)
from treadle.ir.functor import walk
from treadle.ir.primitives import PRIMITIVES
from treadle.ir.tabulate import tabulable, tabulate

# Variables map to numpy scalars or lane arrays, buffers to numpy arrays.
Env = dict[Union[Var, Buffer], Any]


def evaluate_expr(expr: Expr, env: Env):
    """The value of ``expr`` with the variables and buffers of ``env``."""
    run = EXPR_EVAL.get(type(expr))
    if run is None:
        raise TypeError(f"evaluator table EXPR_EVAL has no entry for {type(expr).__name__}")
    return run(expr, env)


def numpy_type(dtype: DataType) -> np.dtype:
    if dtype.scalar == dtypes.bfloat16:
        raise UnsupportedOpError("the evaluator has no bfloat16 values: numpy stores "
                                 "bfloat16 as raw uint16 bits, so arithmetic would be wrong")
    return dtype.numpy


def convert(value, dtype: DataType):
    """``value`` as ``dtype`` with C conversion rules: a numpy scalar, or a fresh array of
    lanes for a vector type (a scalar is repeated over the lanes)."""
    target = numpy_type(dtype)
    if dtype.is_vector:
        return np.broadcast_to(value, dtype.lanes).astype(target)
    return target.type(value)


# ---- memory ----------------------------------------------------------------------------

def lookup(key: Union[Var, Buffer], env: Env):
    try:
        return env[key]
    except KeyError:
        kind = "buffer" if isinstance(key, Buffer) else "variable"
        raise IRError(f"{kind} {key.name} is not defined here (a declaration is visible only "
                      "in the rest of its sequence, and never after a barrier)") from None


def element_index(buffer: Buffer, array: np.ndarray, indices: Sequence[Expr], lanes: int,
                  env: Env) -> tuple:
    """The numpy index of an access, checked against the bounds: numpy would wrap negative
    indices around where C reads the wrong memory."""
    if len(indices) != buffer.rank:
        raise IRError(f"buffer {buffer.name} has rank {buffer.rank}, accessed with "
                      f"{len(indices)} indices")
    index = [int(evaluate_expr(i, env)) for i in indices]
    # An element of a vector-typed buffer is a whole vector; a vector access to a scalar
    # buffer covers `lanes` consecutive elements along the last dimension.
    span = 1 if buffer.dtype.is_vector else lanes
    if span > 1 and buffer.rank == 0:
        raise IRError(f"{span}-lane access to scalar buffer {buffer.name}")
    last = [i + (span - 1 if axis == buffer.rank - 1 else 0) for axis, i in enumerate(index)]
    shape = array.shape[:buffer.rank]
    if not all(0 <= i and j < n for i, j, n in zip(index, last, shape)):
        what = f"{span}-lane access at index" if span > 1 else "index"
        raise ShapeError(f"buffer {buffer.name}: {what} {index} is out of bounds for shape "
                         f"{list(shape)}")
    if span > 1:
        return (*index[:-1], slice(index[-1], index[-1] + span))
    return tuple(index)


# ---- expressions -----------------------------------------------------------------------

def _as(expr: Expr, dtype: DataType, env: Env):
    value = evaluate_expr(expr, env)
    return value if expr.dtype == dtype else convert(value, dtype)


def _c_div(a, b):
    """Integer division rounding toward zero, element-wise."""
    return (np.abs(a) // np.abs(b)) * (np.sign(a) * np.sign(b))


def _c_mod(a, b):
    """The remainder of ``_c_div``: it takes the sign of the dividend."""
    return a - _c_div(a, b) * b


NUMPY_BINARY: dict[str, Callable] = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide,
    "//": _c_div, "%": _c_mod, "min": np.minimum, "max": np.maximum,
    "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
    "==": np.equal, "!=": np.not_equal, "and": np.logical_and, "or": np.logical_or,
    "&": np.bitwise_and, "|": np.bitwise_or, "^": np.bitwise_xor,
    "<<": np.left_shift, ">>": np.right_shift,
}
NUMPY_UNARY: dict[str, Callable] = {"neg": np.negative, "not": np.logical_not, "~": np.invert}


def _binary(e: Binary, env: Env):
    common = dtypes.promote(e.a.dtype, e.b.dtype).scalar
    a = _as(e.a, common.with_lanes(e.a.dtype.lanes), env)
    # Scalar `and` / `or` short-circuit as in C: `i < n and A[i] > 0` must not load A[n].
    if e.op in ("and", "or") and np.ndim(a) == 0 and bool(a) == (e.op == "or"):
        return a
    b = _as(e.b, common.with_lanes(e.b.dtype.lanes), env)
    if e.op in ("//", "%") and np.any(b == 0):
        raise KernelError(f"integer division by zero in {e}")
    return NUMPY_BINARY[e.op](a, b)


def _select(e: Select, env: Env):
    cond = evaluate_expr(e.cond, env)
    if np.ndim(cond) == 0:  # like C's `?:`, evaluate only the chosen side
        return _as(e.then if cond else e.otherwise, e.dtype, env)
    return np.where(cond, _as(e.then, e.dtype, env), _as(e.otherwise, e.dtype, env))


def _load(e: Load, env: Env):
    array = lookup(e.buffer, env)
    value = array[element_index(e.buffer, array, e.indices, e.lanes, env)]
    # A vector is a value, not a view: a later store must not change it.
    return value.copy() if isinstance(value, np.ndarray) else value


def _call(e: Call, env: Env):
    args = [evaluate_expr(a, env) for a in e.args]
    return convert(PRIMITIVES[e.func].numpy(*args), e.dtype)


EXPR_EVAL: dict[type, Callable[[Any, Env], Any]] = {
    Var: lookup,
    Const: lambda e, env: convert(e.value, e.dtype),
    Binary: _binary,
    Unary: lambda e, env: NUMPY_UNARY[e.op](evaluate_expr(e.a, env)),
    Select: _select,
    Cast: lambda e, env: convert(evaluate_expr(e.value, env), e.dtype),
    Broadcast: lambda e, env: convert(evaluate_expr(e.value, env), e.dtype),
    Load: _load,
    Call: _call,
}


# ---- compute definitions ---------------------------------------------------------------

def work(computes: Sequence[Compute]) -> Optional[int]:
    """How many times ``evaluate_computes`` evaluates an element's expression: each
    element of the computes and of the computes they read, times its reduce points; None
    where a size is not a constant."""
    total = 0
    for c in _in_order(computes):
        sizes = _sizes(c.shape + c.reduce_extents)
        if sizes is None:
            return None
        total += math.prod(sizes)
    return total


def evaluate_computes(computes: Sequence[Compute], inputs: Mapping[Buffer, np.ndarray],
                      limit: int) -> Optional[list[np.ndarray]]:
    """The contents of ``computes`` given those of the input buffers they read, element
    by element; the computes they read (their ``sources``) are evaluated first. None
    where that is more than ``limit`` element evaluations (``work``) or a size is not a
    constant. Raises what the expressions raise (an index out of range, a division by
    zero, a bfloat16 value) as the interpreter does."""
    amount = work(computes)
    if amount is None or amount > limit:
        return None
    for buffer in inputs:  # refuse unsupported dtypes before evaluating
        numpy_type(buffer.dtype)
    env: Env = dict(inputs)
    with np.errstate(all="ignore"):  # C arithmetic: overflow gives inf, integers wrap
        for c in _in_order(computes):
            env[c.buffer] = _evaluate_compute(c, env)
    return [env[c.buffer] for c in computes]


def _in_order(computes: Sequence[Compute]) -> list[Compute]:
    """The computes and every compute they read, each after those it reads."""
    order: dict[Compute, None] = {}

    def visit(c: Compute) -> None:
        if c not in order:
            for source in c.sources:
                visit(source)
            order[c] = None
    for c in computes:
        visit(c)
    return list(order)


def _sizes(dims: Sequence[Expr]) -> Optional[list[int]]:
    if not all(isinstance(d, Const) for d in dims):
        return None
    return [int(d.value) for d in dims]


def _evaluate_compute(c: Compute, env: Env) -> np.ndarray:
    if _whole_arrays(c):
        try:
            return tabulate(c, env)
        except IndexError:
            pass  # element by element, which reports the index
    shape = _sizes(c.shape)
    out = np.empty(shape, numpy_type(c.dtype))
    element = _reduction(c) if c.is_reduction else (lambda s: evaluate_expr(c.value, s))
    scope = dict(env)
    for index in np.ndindex(*shape):
        scope.update(_bind(c.axes, index))
        out[index] = element(scope)
    return out


def _whole_arrays(c: Compute) -> bool:
    """Whether numpy can evaluate ``c`` on whole arrays at once (``tabulate``), with the
    values element by element evaluation gives: no reduction; index arithmetic, loads,
    casts and selects only, divisions by non-zero constants; no 16-bit float, whose C
    arithmetic rounds once where numpy's rounds every operation (a reshape of a folded
    weight: 0.9 s element by element, 1 ms so)."""
    if c.is_reduction or not tabulable(c.value):
        return False
    for node in walk(c.value):
        if node.dtype.scalar in (dtypes.float16, dtypes.bfloat16):
            return False
        if isinstance(node, Binary) and node.op in ("//", "%") and not (
                isinstance(node.b, Const) and node.b.value != 0):
            return False
    return True


def _bind(axes: Sequence[Var], index: Sequence[int]):
    return zip(axes, (convert(i, a.dtype) for i, a in zip(index, axes)))


def _reduction(c: Compute) -> Callable[[Env], Any]:
    """One element of a reduction: the identity combined with each reduce point's value
    in order, in the compute's dtype, as generated code accumulates."""
    accumulator = Var("reduce.accumulator", c.dtype)
    step = combine(c.reduce_op, accumulator, c.value)
    identity = identity_of(c.reduce_op, c.dtype)
    points = list(itertools.product(*(range(n) for n in _sizes(c.reduce_extents))))

    def element(scope: Env):
        scope[accumulator] = evaluate_expr(identity, scope)
        for point in points:
            scope.update(_bind(c.reduce_axes, point))
            scope[accumulator] = evaluate_expr(step, scope)
        return scope[accumulator]
    return element
