"""Tensors of the graph IR.

A dimension is an ``int`` or an index expression over named symbols (``Var("seq")``,
``seq * 12``). A tensor may carry its contents when they are known before run time:
``data`` for constants (weights, folded values), and ``value`` for small integer (or bool)
tensors whose elements are known only symbolically, such as the result of ``Shape`` on an
input with a symbolic dimension; shape arithmetic in exported models flows through these.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from treadle.ir.dtypes import DataType, dtype_of, index_type
from treadle.ir.expr import Const, Dim, Expr, Var, as_expr
from treadle.ir.simplify import simplify_expr

if TYPE_CHECKING:
    from treadle.graph.operator import Operator


def normalize_dim(dim) -> Dim:
    """An int stays an int, a string names a symbol, an expression is simplified (and
    becomes an int when it folds to a constant)."""
    if isinstance(dim, (int, np.integer)):
        return int(dim)
    if isinstance(dim, str):
        return Var(dim, index_type)
    expr = simplify_expr(as_expr(dim))
    return expr.value if isinstance(expr, Const) else expr


def normalize_shape(shape: Sequence) -> tuple[Dim, ...]:
    return tuple(normalize_dim(d) for d in shape)


def num_elements(shape: Sequence[Dim]) -> Dim:
    if all(isinstance(d, int) for d in shape):
        return math.prod(shape)
    total: Expr = as_expr(1)
    for d in shape:
        total = total * d
    return normalize_dim(total)


@dataclass(eq=False)
class Tensor:
    name: str
    dtype: DataType
    shape: tuple[Dim, ...]
    data: Optional[np.ndarray] = None
    value: Optional[tuple[Dim, ...]] = None  # flattened contents of a small int/bool tensor
    producer: Optional["Operator"] = field(default=None, repr=False)
    # Names of the model's tensors whose value this one holds, in the same layout: graph
    # passes replace tensors by equal ones (treadle.check compares them with a reference).
    aliases: set[str] = field(default_factory=set, repr=False)

    def __post_init__(self):
        self.dtype = dtype_of(self.dtype)
        self.shape = normalize_shape(self.shape)
        if self.data is not None:
            self.data = np.require(self.data, dtype=self.dtype.numpy, requirements="C")
            if self.data.shape != self.shape:
                raise ValueError(f"tensor {self.name}: data of shape {self.data.shape} does not "
                                 f"match declared shape {self.shape}")
            if self.value is None and self.data.size <= MAX_KNOWN and (
                    self.dtype.is_integer or self.dtype.is_bool):
                self.value = tuple(v.item() for v in self.data.reshape(-1))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_constant(self) -> bool:
        return self.data is not None

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def size(self) -> Dim:
        return num_elements(self.shape)

    @property
    def symbols(self) -> set[Var]:
        from treadle.ir.functor import free_vars
        return {v for d in self.shape if isinstance(d, Expr) for v in free_vars(d)}

    def __repr__(self) -> str:
        kind = " const" if self.is_constant else ""
        return f"Tensor({self.name}: {self.dtype}[{', '.join(map(str, self.shape))}]{kind})"


# Integer tensors up to this many elements carry their contents symbolically.
MAX_KNOWN = 64


def constant(data, name: str = "const", dtype: DataType | str | None = None) -> Tensor:
    array = np.asarray(data) if dtype is None else np.asarray(data, dtype=dtype_of(dtype).numpy)
    return Tensor(name, dtype_of(array.dtype) if dtype is None else dtype, array.shape, array)


def symbol(name: str) -> Var:
    return Var(name, index_type)
