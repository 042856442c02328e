"""Primitive functions callable from tensor programs.

One table holds each primitive's arity, result type and numpy meaning; the C printer has
its own table of spellings keyed by the same names, and fails naming the primitive when a
spelling is missing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from treadle.errors import UnsupportedOpError
from treadle.ir.dtypes import DataType, int32, vector


@dataclass(frozen=True)
class Primitive:
    name: str
    arity: int
    numpy: Callable  # element-wise (or lane-wise) meaning, used by the IR interpreter
    result: str = "same"  # "same": type of the first argument; "scalar": its element type

    def result_dtype(self, args) -> DataType:
        if len(args) != self.arity:
            raise TypeError(f"primitive {self.name} takes {self.arity} arguments, got {len(args)}")
        first = args[0].dtype
        if self.name in FLOAT_ONLY and not first.scalar.is_float:
            raise TypeError(f"primitive {self.name} needs a float argument, got {first}")
        return first.scalar if self.result == "scalar" else first


def _erf(x):
    from math import erf
    return np.vectorize(erf, otypes=[np.asarray(x).dtype])(x)


def _dot_u8s8(acc, a, b):
    """acc plus, in each int32 lane, the products of its four bytes: a's unsigned, b's
    signed (VNNI's vpdpbusd, wrapping as it does)."""
    acc, a, b = (np.asarray(v, np.int32) for v in (acc, a, b))
    products = (a[..., None].view(np.uint8).astype(np.int64)
                * b[..., None].view(np.int8).astype(np.int64))
    return (acc + products.reshape(*acc.shape, 4).sum(-1)).astype(np.int32)


def _dot_s16(acc, a, b):
    """acc plus, in each int32 lane, the products of its two signed 16-bit halves
    (vpmaddwd, then an add)."""
    acc, a, b = (np.asarray(v, np.int32) for v in (acc, a, b))
    products = (a[..., None].view(np.int16).astype(np.int64)
                * b[..., None].view(np.int16).astype(np.int64))
    return (acc + products.reshape(*acc.shape, 2).sum(-1)).astype(np.int32)


# AMX's tiles as the IR holds them: 16 rows of 16 int32 words, one row after the other.
TILE_ROWS = TILE_WORDS = 16
TILE = vector(int32, TILE_ROWS * TILE_WORDS)


def _tile_dot_u8s8(acc, a, b):
    """acc plus a times b on tiles (AMX's tdpbusd, wrapping as it does): acc[m, n] plus,
    for every k < 16, the products of the four unsigned bytes of word a[m, k] with the
    four signed bytes of word b[k, n] (B's rows are words of four consecutive K positions,
    the layout of words.py)."""
    acc, a, b = (np.ascontiguousarray(v, np.int32) for v in (acc, a, b))
    left = a.view(np.uint8).reshape(TILE_ROWS, 4 * TILE_WORDS).astype(np.int64)
    right = b.view(np.int8).reshape(TILE_WORDS, TILE_WORDS, 4).transpose(0, 2, 1)
    products = left @ right.reshape(4 * TILE_WORDS, TILE_WORDS).astype(np.int64)
    return (acc.reshape(TILE_ROWS, TILE_WORDS) + products).astype(np.int32).reshape(acc.shape)


def _warp_only(*args):
    raise UnsupportedOpError("shfl_xor exchanges values between the threads of a GPU warp; "
                             "it runs on CUDA and in the CUDA simulator only")


PRIMITIVES = {p.name: p for p in (
    Primitive("exp", 1, np.exp),
    Primitive("log", 1, np.log),
    Primitive("sqrt", 1, np.sqrt),
    Primitive("tanh", 1, np.tanh),
    Primitive("erf", 1, _erf),
    Primitive("sin", 1, np.sin),
    Primitive("cos", 1, np.cos),
    Primitive("tan", 1, np.tan),
    Primitive("asin", 1, np.arcsin),
    Primitive("acos", 1, np.arccos),
    Primitive("atan", 1, np.arctan),
    Primitive("sinh", 1, np.sinh),
    Primitive("cosh", 1, np.cosh),
    Primitive("asinh", 1, np.arcsinh),
    Primitive("acosh", 1, np.arccosh),
    Primitive("atanh", 1, np.arctanh),
    Primitive("abs", 1, np.abs),
    Primitive("floor", 1, np.floor),
    Primitive("ceil", 1, np.ceil),
    Primitive("round", 1, np.rint),
    Primitive("pow", 2, np.power),
    # The remainder of the quotient truncated toward zero, computed exactly (C's fmod):
    # a - trunc(a / b) * b in floating point loses it once a / b passes the mantissa.
    Primitive("fmod", 2, np.fmod),
    Primitive("fma", 3, lambda a, b, c: a * b + c),
    # Integer products of packed lanes (see _dot_u8s8, _dot_s16): acc, a, b of int32 type.
    Primitive("dot_u8s8", 3, _dot_u8s8),
    Primitive("dot_s16", 3, _dot_s16),
    # Tiles (int32 vectors of TILE_ROWS x TILE_WORDS lanes), which the CPU backend keeps in
    # AMX's tile registers: see _tile_dot_u8s8. A thread configures its tile registers,
    # every one ``rows`` rows of 64 bytes, before it uses them (tile_begin: 0 where it
    # may, -1 where the operating system refuses) and releases them after (tile_end);
    # neither changes a value.
    Primitive("tile_dot_u8s8", 3, _tile_dot_u8s8),
    Primitive("tile_begin", 1, lambda rows: np.zeros_like(rows)),
    Primitive("tile_end", 1, lambda x: np.zeros_like(x)),
    Primitive("reduce_add", 1, lambda v: np.sum(v, dtype=v.dtype), "scalar"),
    Primitive("reduce_max", 1, np.max, "scalar"),
    Primitive("reduce_min", 1, np.min, "scalar"),
    # A hint that the element a load would read is needed soon; its value is the load's.
    Primitive("prefetch", 1, lambda x: x),
    # The first argument's value in the thread of a GPU warp whose number is this thread's
    # xor the second; only the CUDA simulator (runtime.simulate) runs it.
    Primitive("shfl_xor", 2, _warp_only),
)}

FLOAT_ONLY = {"exp", "log", "sqrt", "tanh", "erf", "sin", "cos", "floor", "ceil", "round",
              "pow", "fmod", "fma", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh",
              "acosh", "atanh"}


def lookup(name: str) -> Primitive:
    if name not in PRIMITIVES:
        raise KeyError(f"unknown primitive function {name!r}; known: {', '.join(sorted(PRIMITIVES))}")
    return PRIMITIVES[name]
