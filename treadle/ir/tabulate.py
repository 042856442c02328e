"""Every element of a compute over constant buffers at once, with numpy.

Schedules that store a constant in another layout (the GEMM template's weight panels) say
so with a compute; the compiler tabulates it once instead of running a kernel. Only the
expressions such layouts need are covered: index arithmetic, loads, casts, the bit
operations that pack bytes into words and the selects that pad them (``tabulable``
tells). Integer ``//`` and ``%`` follow C, as in the kernels.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from treadle.ir import dtypes
from treadle.ir.compute import Compute
from treadle.ir.dtypes import DataType
from treadle.ir.expr import Binary, Buffer, Cast, Const, Expr, Load, Select, Var
from treadle.ir.functor import walk

_BINARY = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "min": np.minimum, "max": np.maximum,
    "//": lambda a, b: _c_divide(a, b), "%": lambda a, b: a - _c_divide(a, b) * b,
    "&": np.bitwise_and, "|": np.bitwise_or, "<<": np.left_shift, "<": np.less,
}


def tabulable(expr: Expr) -> bool:
    """Whether ``tabulate`` can evaluate ``expr``."""
    return all(isinstance(n, (Const, Var, Load, Cast, Select)) or
               (isinstance(n, Binary) and n.op in _BINARY) for n in walk(expr))


def tabulate(c: Compute, arrays: Mapping[Buffer, np.ndarray]) -> np.ndarray:
    """The elements of ``c`` (static shape, no reduction), reading ``arrays``."""
    if c.is_reduction:
        raise TypeError(f"cannot tabulate the reduction {c.name}")
    shape = tuple(int(d.value if isinstance(d, Const) else d) for d in c.shape)
    env = {axis: np.arange(n).reshape([n if k == i else 1 for k in range(len(shape))])
           for i, (axis, n) in enumerate(zip(c.axes, shape))}
    value = _evaluate(c.value, env, arrays)
    return np.broadcast_to(value, shape).astype(c.dtype.numpy)


def _evaluate(e: Expr, env: dict, arrays: Mapping[Buffer, np.ndarray]):
    if isinstance(e, Const):
        return np.asarray(e.value, e.dtype.numpy)
    if isinstance(e, Var):
        return env[e]
    if isinstance(e, Binary) and e.op in _BINARY:
        return _BINARY[e.op](_evaluate(e.a, env, arrays), _evaluate(e.b, env, arrays))
    if isinstance(e, Select):
        return np.where(_evaluate(e.cond, env, arrays), _evaluate(e.then, env, arrays),
                        _evaluate(e.otherwise, env, arrays))
    if isinstance(e, Cast):
        return _cast(_evaluate(e.value, env, arrays), e.value.dtype, e.dtype)
    if isinstance(e, Load) and e.lanes == 1:
        indices = np.broadcast_arrays(*(_evaluate(i, env, arrays) for i in e.indices))
        array = arrays[e.buffer]
        for index, size in zip(indices, array.shape):
            if index.size and (index.min() < 0 or index.max() >= size):
                raise IndexError(f"{e}: an index outside [0, {size})")  # numpy would wrap
        return array[tuple(indices)]
    raise TypeError(f"cannot tabulate {type(e).__name__} {e}")


def _cast(value: np.ndarray, source: DataType, target: DataType) -> np.ndarray:
    """``value`` as ``target``; bfloat16 is held as its bits, which numpy would convert as
    the integers they spell (a weight of 0.5 became 16128)."""
    if source.scalar == dtypes.bfloat16:
        value = dtypes.bfloat16_values(value)
    if target.scalar == dtypes.bfloat16:
        return dtypes.bfloat16_bits(value)
    return value.astype(target.numpy)


def _c_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division rounding toward zero, as C's."""
    quotient = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -quotient, quotient)
