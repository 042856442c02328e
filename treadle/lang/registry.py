"""Registered kernels: ``kernel.register_op(name, outputs=...)`` and the table ``OPS``.

Registering makes a kernel an operator of treadle graphs (``graph_op``) and, where torch
is installed, the torch custom op ``torch.ops.treadle_lang.<name>`` (``torch_op``). Both
take the kernel's parameters except its outputs, in the order the function declares them,
and give the outputs in the order ``outputs`` lists them. ``OPS[name]`` is the
``OpSpec`` saying how one maps to the other.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from treadle.errors import ArgumentError
from treadle.graph.operator import apply, register
from treadle.graph.tensor import Tensor
from treadle.ir.expr import Var
from treadle.lang import graph_op
from treadle.lang.torch_op import register_torch_op
from treadle.lang.types import Param

if TYPE_CHECKING:
    from treadle.lang.kernel import LangKernel

NAMESPACE = "treadle_lang"


@dataclass(frozen=True, eq=False)
class OpSpec:
    """How the torch op ``torch.ops.treadle_lang.<name>`` maps onto the graph operator
    ``op_type``: ``arguments`` are the torch op's arguments in order, tensors and numbers
    interleaved as the kernel declares them; the tensors among them (``inputs``) are the
    graph operator's inputs in the same order, the numbers (``attributes``) its attributes
    by name; ``outputs`` name the results, of both, in order."""
    name: str
    op_type: str
    arguments: tuple[str, ...]
    inputs: tuple[str, ...]
    attributes: tuple[str, ...]
    outputs: tuple[str, ...]
    kernel: LangKernel = field(repr=False)
    # Each symbol's source: (position in ``inputs``, axis) of its first whole dimension.
    sources: Mapping[Var, tuple[int, int]] = field(repr=False)

    def param(self, name: str) -> Param:
        return next(p for p in self.kernel.params if p.name == name)

    def apply(self, args: Sequence, name: str | None = None) -> list[Tensor]:
        """The graph operator applied to ``args`` given as the torch op takes them (graph
        tensors for tensors, Python numbers for scalars): its output tensors."""
        if len(args) != len(self.arguments):
            raise ArgumentError(f"{self.op_type} takes {len(self.arguments)} arguments "
                                f"({', '.join(self.arguments)}), got {len(args)}")
        given = dict(zip(self.arguments, args))
        return apply(self.op_type, [given[n] for n in self.inputs],
                     {a: given[a] for a in self.attributes}, name)

    def output_shapes(self, shapes: Sequence[Sequence[Any]]) -> list[tuple]:
        """The outputs' shapes for inputs of ``shapes`` (of any size type: ints, torch's
        symbolic ints, graph dimensions)."""
        values = {v: shapes[k][axis] for v, (k, axis) in self.sources.items()}
        return [tuple(values.get(d, d) for d in self.param(n).type.shape) for n in self.outputs]


# Registered kernels by name: OPS[name] maps torch.ops.treadle_lang.<name> to its graph op.
OPS: dict[str, OpSpec] = {}


def register_op(kernel: LangKernel, name: str, outputs: str | Sequence[str]) -> OpSpec:
    """``kernel`` as the graph operator ``treadle_lang.<name>`` and the torch op
    ``torch.ops.treadle_lang.<name>``, computing the tensor parameters ``outputs``."""
    spec = _spec(kernel, name, (outputs,) if isinstance(outputs, str) else tuple(outputs))
    register_torch_op(spec, NAMESPACE)
    register(spec.op_type, internal=True, kernel=functools.partial(graph_op.emit, spec))(
        functools.partial(graph_op.define, spec))
    OPS[name] = spec
    return spec


def _spec(kernel: LangKernel, name: str, outputs: tuple[str, ...]) -> OpSpec:
    where = f"register_op({name!r}) of kernel {kernel.name}"
    if not name.isidentifier():
        raise ArgumentError(f"{where}: an op name must be a Python identifier")
    if name in OPS:
        raise ArgumentError(f"{where}: an op {name!r} is registered already")
    params = {p.name: p for p in kernel.params}
    tensors = [p.name for p in kernel.params if p.is_tensor]
    if not outputs or len(set(outputs)) != len(outputs) or not set(outputs) <= set(tensors):
        raise ArgumentError(f"{where}: outputs must name distinct tensor parameters (of "
                            f"{', '.join(tensors)}), got {list(outputs)}")
    inputs = tuple(t for t in tensors if t not in outputs)
    sources: dict[Var, tuple[int, int]] = {}
    for k, n in enumerate(inputs):
        for axis, d in enumerate(params[n].type.shape):
            if isinstance(d, Var):
                sources.setdefault(d, (k, axis))
    unbound = {v.name for t in tensors for v in params[t].type.symbols if v not in sources}
    if unbound:
        raise ArgumentError(f"{where}: symbols {', '.join(sorted(unbound))} are no whole "
                            "dimension of any input, so the op cannot size them")
    for o in outputs:
        if not all(isinstance(d, (int, Var)) for d in params[o].type.shape):
            raise ArgumentError(f"{where}: the dimensions of output {o!r} must be ints or "
                                "symbols")
    arguments = tuple(p.name for p in kernel.params if p.name not in outputs)
    attributes = tuple(p.name for p in kernel.params if not p.is_tensor)
    return OpSpec(name, f"{NAMESPACE}.{name}", arguments, inputs, attributes, outputs, kernel,
                  sources)
