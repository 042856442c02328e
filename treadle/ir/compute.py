"""Compute definitions: the single statement of what each output element of an operator is.

    out = compute("relu", x.shape, lambda *i: maximum(x[i], 0.0))
    s = reduce("rowsum", [n], [k], lambda i, r: x[i, r], "sum")

A ``Compute`` names a tensor (its ``buffer``), the index variables of its elements, and an
expression over them that loads from input buffers or from other computes' buffers; a
reduction also has reduce variables, their extents and a combiner. Everything else about
an operator follows from this: output shapes and dtypes, whether it is injective, the
rule-based schedule, inlining into a fused kernel.
"""
from __future__ import annotations

import functools

import itertools
import weakref
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

from treadle.ir.dtypes import DataType
from treadle.ir.expr import Buffer, Const, Expr, Load, Var, as_expr, cast, maximum, minimum
from treadle.ir.functor import rewrite, walk

_ids = itertools.count()


def _lowest(t: DataType) -> Const:
    if t.is_float:
        return Const(-float("inf"), t)
    return Const(-(1 << (t.bits - 1)) if t.kind == "int" else 0, t)


def _highest(t: DataType) -> Const:
    if t.is_float:
        return Const(float("inf"), t)
    return Const((1 << (t.bits - (1 if t.kind == "int" else 0))) - 1, t)


# Each reduction: (its identity element for a dtype, how two partial values combine).
REDUCERS: dict[str, tuple[Callable[[DataType], Expr], Callable[[Expr, Expr], Expr]]] = {
    "sum": (lambda t: Const(0, t), lambda a, b: a + b),
    "prod": (lambda t: Const(1, t), lambda a, b: a * b),
    "max": (_lowest, maximum),
    "min": (_highest, minimum),
}


@dataclass(frozen=True, eq=False)
class Compute:
    buffer: Buffer
    axes: tuple[Var, ...]
    value: Expr
    reduce_axes: tuple[Var, ...] = ()
    reduce_extents: tuple[Expr, ...] = ()
    reduce_op: str | None = None
    # The computes this one reads, held so that they live as long as it does: the
    # buffer -> compute registry below only holds them weakly.
    sources: tuple["Compute", ...] = field(default=(), repr=False)

    @property
    def name(self) -> str:
        return self.buffer.name

    @property
    def shape(self) -> tuple[Expr, ...]:
        return self.buffer.shape

    @property
    def dtype(self) -> DataType:
        return self.buffer.dtype

    @property
    def is_reduction(self) -> bool:
        return self.reduce_op is not None

    def __getitem__(self, indices) -> Load:
        return self.buffer[indices]

    def loads(self) -> list[Load]:
        return list(self._loads)

    @functools.cached_property
    def _loads(self) -> tuple[Load, ...]:
        """Walked once: the partition asks an operator's computes for their loads at every
        tensor it might fuse the operator after (a concatenation of 256 steps, 256 times)."""
        return tuple(n for n in walk(self.value) if isinstance(n, Load))

    @functools.cached_property
    def _reachable(self) -> dict[Buffer, "Compute"]:
        return _reachable([self])


# Computes refer to each other through loads of their buffers; this finds the compute
# behind a buffer. Buffer names carry a unique number so two computes never share one.
_BY_BUFFER: "weakref.WeakValueDictionary[Buffer, Compute]" = weakref.WeakValueDictionary()


def producer_of(buffer: Buffer) -> Compute | None:
    return _BY_BUFFER.get(buffer)


def _make(name: str, value: Expr, shape: Sequence, **reduction) -> Compute:
    buffer = Buffer(f"{name}_{next(_ids)}", value.dtype, tuple(shape))
    sources = {p: None for n in walk(value) if isinstance(n, Load)
               and (p := producer_of(n.buffer)) is not None}
    c = Compute(buffer, **reduction, value=value, sources=tuple(sources))
    _BY_BUFFER[buffer] = c
    return c


def _axes(count: int, prefix: str) -> tuple[Var, ...]:
    uid = next(_ids)
    return tuple(Var(f"{prefix}{d}_{uid}") for d in range(count))


def compute(name: str, shape: Sequence, fcompute: Callable[..., Expr],
            dtype: DataType | str | None = None) -> Compute:
    """A tensor whose element at index ``i`` is ``fcompute(*i)``."""
    axes = _axes(len(shape), "i")
    value = as_expr(fcompute(*axes))
    if dtype is not None:
        value = cast(value, dtype)
    return _make(name, value, shape, axes=axes)


def reduce(name: str, shape: Sequence, reduce_shape: Sequence,
           fcompute: Callable[..., Expr], op: str = "sum",
           dtype: DataType | str | None = None) -> Compute:
    """A tensor whose element at ``i`` combines ``fcompute(*i, *r)`` over every ``r`` in
    ``reduce_shape`` with ``op`` (sum, prod, max or min)."""
    if op not in REDUCERS:
        raise ValueError(f"unknown reduction {op!r}; known: {', '.join(REDUCERS)}")
    axes = _axes(len(shape), "i")
    reduce_axes = _axes(len(reduce_shape), "r")
    value = as_expr(fcompute(*axes, *reduce_axes))
    if dtype is not None:
        value = cast(value, dtype)
    return _make(name, value, shape, axes=axes, reduce_axes=reduce_axes,
                 reduce_extents=tuple(as_expr(e) for e in reduce_shape), reduce_op=op)


def identity_of(op: str, dtype: DataType) -> Expr:
    return REDUCERS[op][0](dtype)


def combine(op: str, a: Expr, b: Expr) -> Expr:
    return REDUCERS[op][1](a, b)


def reachable(outputs: Sequence[Compute]) -> dict[Buffer, Compute]:
    """Every compute the outputs read from, by the buffer that names it."""
    if len(outputs) == 1:
        return dict(outputs[0]._reachable)
    return _reachable(outputs)


def _reachable(outputs: Sequence[Compute]) -> dict[Buffer, Compute]:
    found: dict[Buffer, Compute] = {}
    stack = list(outputs)
    while stack:
        c = stack.pop()
        if c.buffer not in found:
            found[c.buffer] = c
            stack.extend(p for load in c.loads() if (p := producer_of(load.buffer)) is not None)
    return found


def retarget(outputs: Sequence[Compute], buffers: Mapping[Buffer, Buffer | Expr]
             ) -> list[Compute]:
    """Copies of ``outputs`` and of every compute they read, loading ``buffers[b]``
    wherever they loaded ``b`` (or taking the expression given for it, a scalar's value):
    an operator's definition reading other tensors (in a kernel made of several
    operators, another's compute in place of an input)."""
    copies: dict[Buffer, Compute] = {}

    def copy(c: Compute) -> Compute:
        if c.buffer not in copies:
            for source in c.sources:
                copy(source)
            targets = {**buffers, **{b: d.buffer for b, d in copies.items()}}
            value = rewrite(c.value, lambda n: _retargeted(n, targets))
            copies[c.buffer] = _make(c.name, value, c.shape, axes=c.axes,
                                     reduce_axes=c.reduce_axes,
                                     reduce_extents=c.reduce_extents, reduce_op=c.reduce_op)
        return copies[c.buffer]
    return [copy(c) for c in outputs]


def _retargeted(node, targets: Mapping[Buffer, Buffer | Expr]):
    if not (isinstance(node, Load) and node.buffer in targets):
        return None
    new = targets[node.buffer]
    return replace(node, buffer=new) if isinstance(new, Buffer) else new
