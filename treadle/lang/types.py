"""The types a kernel's parameters are annotated with, and its size symbols.

``f32`` annotates a float32 scalar parameter; ``f32[M, K]`` a float32 tensor parameter of
shape M x K, where each dimension is an int, a size symbol (``M, K = symbols("M K")``), a
string naming one (``f32["M", "K"]``), or an index expression over symbols (``f32[2 * M]``).
A symbol takes its value from the shapes of the arrays a kernel is called with.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from treadle.ir import dtypes
from treadle.ir.dtypes import DataType
from treadle.ir.expr import Buffer, Const, Expr, Var, cast
from treadle.ir.functor import walk

Dim = Union[int, Expr]


def symbols(names: str) -> Var | tuple[Var, ...]:
    """Size symbols named by a space- or comma-separated string: one symbol for one name,
    else a tuple, as in ``M, N, K = symbols("M N K")``."""
    found = tuple(Var(n, dtypes.index_type) for n in names.replace(",", " ").split())
    if not found:
        raise ValueError("symbols() needs at least one name")
    return found[0] if len(found) == 1 else found


def _dim(value) -> Dim:
    if isinstance(value, str):
        return Var(value, dtypes.index_type)
    if isinstance(value, bool) or not isinstance(value, (int, Expr)):
        raise TypeError(f"a dimension must be an int, a size symbol or a symbol's name, "
                        f"got {value!r}")
    if isinstance(value, int) and value < 0:
        raise ValueError(f"a dimension cannot be negative, got {value}")
    if isinstance(value, Expr) and value.dtype != dtypes.index_type:
        raise TypeError(f"dimension {value} is {value.dtype}, not an index expression")
    return value


@dataclass(frozen=True)
class ScalarType:
    """A dtype in kernel source: a scalar annotation, ``f32[...]`` a tensor annotation,
    ``f32(x)`` a cast."""
    dtype: DataType

    def __getitem__(self, dims) -> TensorType:
        dims = dims if isinstance(dims, tuple) else (dims,)
        if self.dtype.is_vector:
            raise TypeError(f"tensor parameters hold scalars, not {self.dtype} vectors")
        return TensorType(self.dtype, tuple(_dim(d) for d in dims))

    def __call__(self, value) -> Expr:
        """``value`` converted to this dtype; a Python number becomes a constant of it."""
        if isinstance(value, (int, float)):
            return Const(value, self.dtype)
        return cast(value, self.dtype)

    def __repr__(self) -> str:
        return self.dtype.name


@dataclass(frozen=True)
class TensorType:
    dtype: DataType
    shape: tuple[Dim, ...]

    @property
    def symbols(self) -> list[Var]:
        """The symbols of the shape, in order of first appearance."""
        found: dict[Var, None] = {}
        for d in self.shape:
            if isinstance(d, Expr):
                found.update((v, None) for v in walk(d) if isinstance(v, Var))
        return list(found)

    def __repr__(self) -> str:
        return f"{self.dtype.name}[{', '.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class Param:
    """A kernel parameter: its name, annotation and IR (a global buffer or a scalar)."""
    name: str
    type: ScalarType | TensorType
    ir: Buffer | Var

    @property
    def is_tensor(self) -> bool:
        return isinstance(self.type, TensorType)


def as_dtype(value) -> DataType:
    """A dtype given as a ScalarType (``f32``), a DataType or a name."""
    return value.dtype if isinstance(value, ScalarType) else dtypes.dtype_of(value)


f16 = ScalarType(dtypes.float16)
bf16 = ScalarType(dtypes.bfloat16)
f32 = ScalarType(dtypes.float32)
f64 = ScalarType(dtypes.float64)
i8 = ScalarType(dtypes.int8)
i16 = ScalarType(dtypes.int16)
i32 = ScalarType(dtypes.int32)
i64 = ScalarType(dtypes.int64)
u8 = ScalarType(dtypes.uint8)
boolean = ScalarType(dtypes.boolean)
f32x4 = ScalarType(dtypes.float32x4)
f32x8 = ScalarType(dtypes.float32x8)
f32x16 = ScalarType(dtypes.float32x16)
