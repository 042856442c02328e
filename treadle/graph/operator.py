"""Operators of the graph IR and the registry of operator definitions.

An operator type is declared once, as a function from an ``OpContext`` (input buffers,
their compile-time contents if known, attributes) to its output ``Compute`` definitions:

    @register("Relu")
    def relu(ctx):
        x = ctx.input(0)
        return [compute("y", x.shape, lambda *i: maximum(x[i], 0.0))]

Applying it to tensors runs the definition, which gives the output shapes and dtypes (shape
inference), the fusion class, and the schedule later on. Errors raised while defining name
the node and its op type.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from treadle.errors import NeedsValueError, ShapeError, TreadleError, UnsupportedOpError
from treadle.graph.tensor import Dim, Tensor, normalize_shape
from treadle.ir.compute import Compute
from treadle.ir.dtypes import int64
from treadle.ir.expr import Buffer, Expr, Var, as_expr

Define = Callable[["OpContext"], Sequence[Compute]]


@dataclass(frozen=True)
class OpDef:
    name: str
    define: Define
    # Output i is input 0's memory reinterpreted (reshape-like ops): executed as an alias.
    view: bool = False
    # Made by graph passes (channels-last layers, Winograd convolution) or written by hand
    # (``treadle.lang``), not an ONNX operator: a model that names one is rejected.
    internal: bool = False
    # The operator's own scheduled program, (operator, kernel name) -> ``schedule.rules.Kernel``
    # (a ``treadle.lang`` kernel registered as an op). Its definition then gives only the
    # outputs' shapes and dtypes, so it is never inlined into another kernel.
    kernel: Optional[Callable[["Operator", str], Any]] = None


REGISTRY: dict[str, OpDef] = {}


def register(name: str, view: bool = False, internal: bool = False,
             kernel: Optional[Callable[["Operator", str], Any]] = None
             ) -> Callable[[Define], Define]:
    def wrap(define: Define) -> Define:
        if name in REGISTRY:
            raise ValueError(f"operator {name} is registered twice")
        REGISTRY[name] = OpDef(name, define, view, internal, kernel)
        return define
    return wrap


def lookup(op_type: str) -> OpDef:
    import treadle.graph.ops  # noqa: F401  (registers every op family)
    if op_type not in REGISTRY:
        raise UnsupportedOpError(f"operator {op_type} is not supported")
    return REGISTRY[op_type]


class OpContext:
    """What an op definition sees: inputs as buffers, known contents, attributes."""

    def __init__(self, op_type: str, name: str, inputs: Sequence[Optional[Tensor]],
                 attrs: dict, num_outputs: int = 1):
        self.op_type = op_type
        self.name = name
        self.tensors = list(inputs)
        self.attrs = attrs
        # How many outputs the node asks for (an ONNX node lists its optional outputs);
        # a definition may return more, and must return at least this many.
        self.num_outputs = num_outputs
        self.buffers = [None if t is None else Buffer(f"in{k}", t.dtype, t.shape)
                        for k, t in enumerate(inputs)]
        self.checks: list[tuple[Expr, str]] = []
        self.data_sizes: list[DataSize] = []

    def size_from_data(self, output: int, bound: Optional[Dim]) -> Var:
        """A size the operator's kernel finds in the data (how many elements NonZero
        selects): a symbol of its own, named after the node so that defining the node
        again gives the same one. Output ``output`` (an int64 scalar) holds its value
        after the kernel has run; it is at most ``bound``, an expression of the inputs'
        sizes, which memory is planned for. Without a bound, the tensors it sizes are
        allocated once it is known."""
        var = Var(re.sub(r"\W", "_", f"{self.name}_size{len(self.data_sizes)}"), int64)
        self.data_sizes.append(DataSize(var, output, None if bound is None else as_expr(bound)))
        return var

    def require(self, cond: Expr, message: str) -> None:
        """A condition on symbolic sizes that only run time can decide; kernels check it."""
        self.checks.append((cond, f"{self.where}: {message}"))

    @property
    def num_inputs(self) -> int:
        return len(self.tensors)

    def has_input(self, i: int) -> bool:
        return i < len(self.tensors) and self.tensors[i] is not None

    def input(self, i: int) -> Buffer:
        if not self.has_input(i):
            raise self.error(f"input {i} is required")
        return self.buffers[i]

    def attr(self, key: str, default=None):
        return self.attrs.get(key, default)

    def required_attr(self, key: str):
        if key not in self.attrs:
            raise self.error(f"attribute {key!r} is required")
        return self.attrs[key]

    def data(self, i: int) -> Optional[np.ndarray]:
        """The contents of input i, if it is a constant or computed from constants alone."""
        from treadle.graph.known import small_contents
        return small_contents(self.tensors[i]) if self.has_input(i) else None

    def known(self, i: int, what: str = "this input") -> list[Dim]:
        """The contents of a small integer input known at compile time (maybe symbolic);
        an error naming the node when they are not."""
        from treadle.graph.known import derive_value
        tensor = self.tensors[i] if self.has_input(i) else None
        if tensor is not None:
            derive_value(tensor)  # computed from constants in part, it may be known all the same
        if tensor is None or tensor.value is None:
            raise self.needs_value(i, what)
        return list(tensor.value)

    def needs_value(self, i: int, what: str) -> NeedsValueError:
        """The error for input i, whose contents must be known when compiling but are not."""
        return NeedsValueError(f"{self.where}: {what} (input {i}) must be known when "
                               "compiling, but it is computed at run time", self.tensors[i].name)

    @property
    def where(self) -> str:
        return f"node {self.name!r} ({self.op_type})"

    def error(self, message: str, kind: type = ShapeError) -> TreadleError:
        return kind(f"{self.where}: {message}")

    def unsupported(self, message: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"{self.where}: {message}")


_node_ids = itertools.count()


@dataclass(frozen=True)
class DataSize:
    """A symbol whose value a kernel computes (``OpContext.size_from_data``)."""
    symbol: Var
    output: int
    bound: Optional[Expr]


@dataclass(eq=False)
class Operator:
    op_type: str
    name: str
    inputs: tuple[Optional[Tensor], ...]
    attrs: dict
    outputs: tuple[Tensor, ...] = ()
    definition: tuple[Compute, ...] = field(default=(), repr=False)
    input_buffers: tuple[Optional[Buffer], ...] = field(default=(), repr=False)
    checks: tuple[tuple[Expr, str], ...] = field(default=(), repr=False)
    data_sizes: tuple[DataSize, ...] = field(default=(), repr=False)

    @property
    def opdef(self) -> OpDef:
        return lookup(self.op_type)

    @property
    def constant_inputs(self) -> dict[Buffer, np.ndarray]:
        """The data of the inputs that are constants, by the buffer the definition reads."""
        return {b: t.data for b, t in zip(self.input_buffers, self.inputs)
                if b is not None and t is not None and t.is_constant}

    def __repr__(self) -> str:
        ins = ", ".join("-" if t is None else t.name for t in self.inputs)
        outs = ", ".join(t.name for t in self.outputs)
        return f"{self.op_type}[{self.name}]({ins}) -> {outs}"


def apply(op_type: str, inputs: Sequence[Optional[Tensor]], attrs: dict | None = None,
          name: str | None = None, output_names: Sequence[str] | None = None) -> list[Tensor]:
    """Creates an operator over ``inputs`` and returns its output tensors."""
    opdef = lookup(op_type)
    name = name or f"{op_type.lower()}_{next(_node_ids)}"
    names = list(output_names or [])
    wanted = max((k + 1 for k, n in enumerate(names) if n), default=1)
    ctx = OpContext(op_type, name, inputs, dict(attrs or {}), wanted)
    try:
        computes = tuple(opdef.define(ctx))
    except TreadleError:
        raise
    except (TypeError, ValueError, IndexError, KeyError) as err:
        raise ctx.error(f"cannot be defined: {err}") from err
    if len(computes) < wanted:
        raise ctx.unsupported(f"output {len(computes)} ({names[len(computes)]!r}) is not "
                              f"supported; the operator defines {len(computes)} output(s)")
    op = Operator(op_type, name, tuple(inputs), ctx.attrs, (), computes, tuple(ctx.buffers),
                  tuple(ctx.checks), tuple(ctx.data_sizes))
    outputs = []
    for k, c in enumerate(computes):
        out_name = names[k] if k < len(names) and names[k] else f"{name}:{k}"
        tensor = Tensor(out_name, c.dtype, normalize_shape(c.shape), producer=op)
        tensor.value = known_value(c, ctx)
        outputs.append(tensor)
    op.outputs = tuple(outputs)
    return outputs


def known_value(c: Compute, ctx: OpContext) -> Optional[tuple[Dim, ...]]:
    """Evaluates a small integer output element by element at compile time, when every
    input it reads has known contents, giving shape arithmetic over symbols."""
    from treadle.graph.known import evaluate_small
    return evaluate_small(c, {b: t for b, t in zip(ctx.buffers, ctx.tensors) if b is not None})

