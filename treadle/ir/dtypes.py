"""Data types of the tensor-program IR.

A scalar type knows its storage size, its kind (float / int / uint / bool) and the numpy
dtype that holds it. A vector type (``float32x8``) is a scalar type repeated over SIMD
lanes; vector values live in registers and are loaded from / stored to scalar buffers.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DataType:
    name: str
    kind: str  # "float" | "int" | "uint" | "bool"
    bits: int
    lanes: int = 1

    @property
    def nbytes(self) -> int:
        return self.bits // 8 * self.lanes

    @property
    def is_vector(self) -> bool:
        return self.lanes > 1

    @property
    def scalar(self) -> DataType:
        """The element type of a vector type; a scalar type is its own element."""
        return BY_NAME[self.name[: self.name.rindex("x")]] if self.is_vector else self

    def with_lanes(self, lanes: int) -> DataType:
        return vector(self.scalar, lanes)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_integer(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @functools.cached_property  # read on every call of a compiled model
    def numpy(self) -> np.dtype:
        """The numpy dtype holding one element; bfloat16 is stored as its raw uint16 bits."""
        if self.scalar.name == "bfloat16":
            return np.dtype(np.uint16)
        return np.dtype(self.scalar.name)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return self.name


float32 = DataType("float32", "float", 32)
float16 = DataType("float16", "float", 16)
bfloat16 = DataType("bfloat16", "float", 16)
float64 = DataType("float64", "float", 64)
int8 = DataType("int8", "int", 8)
int16 = DataType("int16", "int", 16)
int32 = DataType("int32", "int", 32)
int64 = DataType("int64", "int", 64)
uint8 = DataType("uint8", "uint", 8)
uint16 = DataType("uint16", "uint", 16)
uint32 = DataType("uint32", "uint", 32)
uint64 = DataType("uint64", "uint", 64)
boolean = DataType("bool", "bool", 8)



def bfloat16_bits(values) -> np.ndarray:
    """float32 values as the bits of bfloat16 ones, rounded to nearest even, a NaN kept
    quiet (as the C prelude's treadle_f32_to_bf16 rounds)."""
    bits = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)


def bfloat16_values(bits) -> np.ndarray:
    """The float32 values of bfloat16 bits (exact: bfloat16 is float32's top half)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


BY_NAME = {t.name: t for t in (float32, float16, bfloat16, float64, int8, int16, int32, int64,
                               uint8, uint16, uint32, uint64, boolean)}

# Indices, extents and symbolic sizes are 64-bit so that no tensor size can overflow them.
index_type = int64


def vector(scalar: DataType, lanes: int) -> DataType:
    if lanes == 1:
        return scalar
    name = f"{scalar.name}x{lanes}"
    return BY_NAME.setdefault(name, DataType(name, scalar.kind, scalar.bits, lanes))


float32x4 = vector(float32, 4)
float32x8 = vector(float32, 8)
float32x16 = vector(float32, 16)
int32x8 = vector(int32, 8)


def dtype_of(value: str | DataType | np.dtype | type) -> DataType:
    """Normalises a dtype given as a name, a numpy dtype or a DataType."""
    if isinstance(value, DataType):
        return value
    name = value if isinstance(value, str) else np.dtype(value).name
    if name not in BY_NAME:
        raise TypeError(f"unknown dtype {value!r}; known: {', '.join(sorted(BY_NAME))}")
    return BY_NAME[name]


def promote(a: DataType, b: DataType) -> DataType:
    """The result type of a binary arithmetic op: the wider float, else the wider integer."""
    if a == b:
        return a
    if a.lanes != b.lanes and 1 not in (a.lanes, b.lanes):
        raise TypeError(f"cannot combine vector types {a} and {b}")
    lanes = max(a.lanes, b.lanes)
    sa, sb = a.scalar, b.scalar
    if sa.is_float != sb.is_float:
        winner = sa if sa.is_float else sb
    else:
        winner = sa if sa.bits >= sb.bits else sb
    return vector(winner, lanes)
