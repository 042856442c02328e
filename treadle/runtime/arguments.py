"""Checking a kernel call's arguments against the function's parameters.

Every executor (the numpy interpreter, the C runtime) binds arguments the same way, so a
bad call fails identically everywhere, before any kernel code runs:

* positional arrays are the buffer parameters in order; they must be C-contiguous numpy
  arrays of the buffer's dtype and rank, and writeable where the function stores to them;
* a symbol takes its value from the first array whose shape has it as a bare dimension,
  or from a keyword; a symbol that occurs only inside compound dimensions (``2*n``) cannot
  be solved for and must be passed explicitly;
* every dimension expression is then evaluated and compared with the array's shape, which
  also catches two arrays disagreeing about one symbol.
"""
from __future__ import annotations

import operator
from typing import Mapping, Sequence

import numpy as np

from treadle.errors import ArgumentError, DTypeError, IRError, ShapeError
from treadle.ir.expr import Buffer, Var
from treadle.ir.functor import evaluate, free_vars, walk
from treadle.ir.printer import format_expr
from treadle.ir.stmt import Function, Store

Value = int | float | bool


def bind_arguments(func: Function, arrays: Sequence[np.ndarray],
                   symbols: Mapping[str, Value]) -> dict[Var, Value]:
    """Checks a call of ``func`` and returns the value of every symbol parameter."""
    buffers = func.buffers
    if len(arrays) != len(buffers):
        raise ArgumentError(f"{func.name} takes {len(buffers)} arrays "
                            f"({', '.join(b.name for b in buffers)}), got {len(arrays)}")
    values, origin = _keyword_symbols(func, symbols)
    stored = {s.buffer for s in walk(func.body) if isinstance(s, Store)}
    for position, (buffer, array) in enumerate(zip(buffers, arrays), 1):
        where = _describe(func, position, buffer)
        _check_array(where, buffer, array, writes=buffer in stored)
        for axis, dim in enumerate(buffer.shape):
            unknown = free_vars(dim) - set(func.symbols)
            if unknown:
                raise IRError(f"{where}: dimension {format_expr(dim)} uses "
                              f"{', '.join(sorted(v.name for v in unknown))}, which are not "
                              f"symbol parameters of {func.name}")
            if isinstance(dim, Var) and dim not in values:
                values[dim] = _symbol_value(func, dim, array.shape[axis])
                origin[dim] = f"argument {buffer.name!r} dim {axis}"
    missing = [s.name for s in func.symbols if s not in values]
    if missing:
        raise ArgumentError(f"{func.name}: no value for symbol(s) {', '.join(missing)}; a "
                            "symbol that is not a bare dimension of some array must be passed "
                            f"by keyword, e.g. {missing[0]}=...")
    for position, (buffer, array) in enumerate(zip(buffers, arrays), 1):
        _check_shape(_describe(func, position, buffer), buffer, array, values, origin)
    return values


def _describe(func: Function, position: int, buffer: Buffer) -> str:
    return f"argument {buffer.name!r} (param {position} of {func.name})"


def _keyword_symbols(func: Function, symbols: Mapping[str, Value]):
    by_name = {s.name: s for s in func.symbols}
    values: dict[Var, Value] = {}
    origin: dict[Var, str] = {}
    for name, value in symbols.items():
        if name not in by_name:
            raise ArgumentError(f"{func.name} has no symbol parameter {name!r}; its symbols "
                                f"are: {', '.join(by_name) or 'none'}")
        values[by_name[name]] = _symbol_value(func, by_name[name], value)
        origin[by_name[name]] = "keyword"
    return values, origin


def _symbol_value(func: Function, symbol: Var, value) -> Value:
    dtype = symbol.dtype
    try:
        if dtype.is_float:
            return float(value)
        if dtype.is_bool:
            return bool(value)
        value = operator.index(value)
    except TypeError:
        raise ArgumentError(f"symbol {symbol.name!r} of {func.name} is {dtype}, "
                            f"got {value!r}") from None
    limits = np.iinfo(dtype.numpy)
    if not limits.min <= value <= limits.max:
        raise ArgumentError(f"symbol {symbol.name!r} of {func.name}: {value} does not fit "
                            f"in {dtype}")
    return value


def _check_array(where: str, buffer: Buffer, array, writes: bool) -> None:
    if not isinstance(array, np.ndarray):
        raise ArgumentError(f"{where}: expected a numpy array, got {type(array).__name__}")
    if array.dtype != buffer.dtype.numpy:
        raise DTypeError(f"{where}: expected dtype {buffer.dtype.numpy}, got {array.dtype}")
    if array.ndim != buffer.rank:
        raise ShapeError(f"{where}: expected rank {buffer.rank} {_shape_text(buffer)}, got "
                         f"rank {array.ndim} with shape {array.shape}")
    if not array.flags.c_contiguous:
        raise ArgumentError(f"{where}: array is not C-contiguous (strides {array.strides}); "
                            "pass np.ascontiguousarray(...)")
    if writes and not array.flags.writeable:
        raise ArgumentError(f"{where}: array is read-only but the function writes to it")


def _check_shape(where: str, buffer: Buffer, array: np.ndarray, values: dict[Var, Value],
                 origin: dict[Var, str]) -> None:
    expected = [evaluate(dim, values) for dim in buffer.shape]
    if tuple(expected) == array.shape:
        return
    used = sorted({v for dim in buffer.shape for v in free_vars(dim)}, key=lambda v: v.name)
    sources = "; ".join(f"{v.name} = {values[v]} from {origin[v]}" for v in used)
    raise ShapeError(f"{where}: expected shape {_shape_text(buffer)} = {expected}, got "
                     f"{array.shape}" + (f" ({sources})" if sources else ""))


def _shape_text(buffer: Buffer) -> str:
    return f"[{', '.join(format_expr(d) for d in buffer.shape)}]"
