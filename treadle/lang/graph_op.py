"""A registered kernel as a graph operator: its definition and the kernel it brings.

The definition states what treadle must know of the operator before scheduling: the
inputs' dtypes and ranks, the sizes the kernel's symbols take from the input shapes, and
the outputs' shapes and dtypes from their annotations. An output's elements are opaque
loads of the kernel's result, since no compute definition says how the kernel gets them;
``OpDef.kernel`` keeps such an operator out of every other kernel (it anchors its own).

The kernel is the parsed program specialised to the operator: its symbols replaced by
the input tensors' dimensions (ints or the graph's symbols), its scalars by the
operator's attributes, its tensor parameters by the operator's buffers. Sizes that must
agree and cannot be compared before run time are checked by the kernel.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from treadle.errors import ArgumentError, DTypeError, ShapeError
from treadle.graph.operator import OpContext, Operator
from treadle.graph.tensor import Dim, normalize_dim
from treadle.ir.compute import Compute, compute
from treadle.ir.expr import Buffer, Const, Expr, Load, Var, as_expr, eq
from treadle.ir.functor import bound_vars, free_vars, rewrite, substitute
from treadle.ir.passes.lower_mapping import lower_mapping
from treadle.ir.stmt import Accumulate, Assert, DeclBuffer, Function, Seq, Stmt, Store
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import canonical_kernel

if TYPE_CHECKING:
    from treadle.lang.registry import OpSpec


def define(spec: OpSpec, ctx: OpContext) -> list[Compute]:
    """The operator's outputs, after checking its inputs against the kernel's parameters."""
    if ctx.num_inputs != len(spec.inputs):
        raise ctx.error(f"takes {len(spec.inputs)} inputs ({', '.join(spec.inputs)}), got "
                        f"{ctx.num_inputs}", ArgumentError)
    for name in spec.attributes:
        ctx.required_attr(name)
    attribute_values(spec, ctx.attrs)  # a TypeError or ValueError names the node
    inputs = [ctx.input(k) for k in range(len(spec.inputs))]
    for k, buffer in enumerate(inputs):
        _check_type(ctx, spec, k, buffer)
    values = symbol_values(spec, inputs)
    for k, buffer in enumerate(inputs):
        for axis, (want, have) in enumerate(zip(spec.param(spec.inputs[k]).type.shape,
                                                buffer.shape)):
            _check_dim(ctx, spec, (k, axis), want, have, values)
    outputs = []
    for name, shape in zip(spec.outputs, spec.output_shapes([b.shape for b in inputs])):
        result = Buffer(f"{spec.op_type}:{name}", spec.param(name).type.dtype, shape)
        outputs.append(compute(name, shape, lambda *i, b=result: Load(b, i)))
    return outputs


def symbol_values(spec: OpSpec, inputs: Sequence[Buffer]) -> dict[Var, Dim]:
    """The dimension of the operator's inputs each kernel symbol stands for."""
    return {v: normalize_dim(inputs[k].shape[axis]) for v, (k, axis) in spec.sources.items()}


def attribute_values(spec: OpSpec, attrs: dict) -> dict[Var, Expr]:
    """The kernel's scalar parameters: constants, the operator's attributes."""
    return {spec.param(a).ir: Const(attrs[a], spec.param(a).ir.dtype) for a in spec.attributes}


def _where(spec: OpSpec, k: int) -> str:
    return f"input {k} ({spec.inputs[k]!r})"


def _check_type(ctx: OpContext, spec: OpSpec, k: int, buffer: Buffer) -> None:
    kernel_type = spec.param(spec.inputs[k]).type
    if buffer.dtype != kernel_type.dtype:
        raise ctx.error(f"{_where(spec, k)} is {buffer.dtype}; the kernel takes "
                        f"{kernel_type!r}", DTypeError)
    if buffer.rank != len(kernel_type.shape):
        raise ctx.error(f"{_where(spec, k)} has rank {buffer.rank} (shape "
                        f"[{', '.join(map(str, buffer.shape))}]); the kernel takes "
                        f"{kernel_type!r}")


def _check_dim(ctx: OpContext, spec: OpSpec, at: tuple[int, int], want: Dim, have: Dim,
               values: dict[Var, Dim]) -> None:
    """An error where dimension ``have`` (input ``at[0]``, axis ``at[1]``) differs from the
    kernel's ``want``; a run-time check where only run time can tell."""
    expected = normalize_dim(substitute(as_expr(want), {v: as_expr(d) for v, d in values.items()}))
    actual = normalize_dim(have)
    if expected == actual:
        return
    place = f"{_where(spec, at[0])} dimension {at[1]} is {actual}"
    if isinstance(want, int):
        message = f"{place}; the kernel takes {want}"
    else:
        sources = ", ".join(f"{v.name} from {_where(spec, spec.sources[v][0])} dimension "
                            f"{spec.sources[v][1]}"
                            for v in sorted(free_vars(want), key=lambda v: v.name))
        message = f"{place}, but the kernel's {want} is {expected} there ({sources})"
    if isinstance(expected, int) and isinstance(actual, int):
        raise ctx.error(message, ShapeError)
    ctx.require(eq(as_expr(expected), as_expr(actual)), message)


def emit(spec: OpSpec, op: Operator, name: str) -> Kernel:
    """The kernel of ``op``: the parsed program specialised to the operator's tensors."""
    inputs = list(op.input_buffers)
    outputs = [c.buffer for c in op.definition]
    values: dict[Var, Expr] = {v: as_expr(d) for v, d in symbol_values(spec, inputs).items()}
    values.update(attribute_values(spec, op.attrs))
    buffers = {spec.param(n).ir: b for n, b in zip(spec.inputs + spec.outputs, inputs + outputs)}
    params = [*inputs, *outputs]
    symbols = {v for b in params for d in b.shape for v in free_vars(d)}
    # Task mappings become loops first: the graph's passes rename variables in expressions,
    # and a mapping's extents (``repeat(tiles)``) are not expressions of the tree.
    body = _rename_apart(lower_mapping(spec.kernel.function).body, symbols)
    body = _specialise(body, values, buffers)
    checks = [Assert(cond, message) for cond, message in op.checks]
    body = Seq((*checks, body)) if checks else body
    function = Function(name, (*params, *sorted(symbols, key=lambda v: v.name)), body)
    return canonical_kernel(function, inputs, len(outputs))


def _specialise(body: Stmt, values: dict[Var, Expr], buffers: dict[Buffer, Buffer]) -> Stmt:
    """``body`` with ``values`` for its variables and ``buffers`` for its parameters, in
    every expression and local buffer shape."""
    def rebuffer(b: Buffer) -> Buffer:
        if b in buffers:
            return buffers[b]
        return replace(b, shape=tuple(substitute(d, values) for d in b.shape))

    def visit(node):
        if isinstance(node, Var):
            return values.get(node)
        if isinstance(node, (Load, Store, Accumulate, DeclBuffer)):
            return replace(node, buffer=rebuffer(node.buffer))
        return None
    return rewrite(body, visit)


def _rename_apart(body: Stmt, symbols: set[Var]) -> Stmt:
    """The kernel's own variables renamed where a graph symbol has their name, before the
    symbols enter the body: a variable is its name, so a loop variable ``seq`` would be
    taken for the symbol ``seq``."""
    taken = {v.name for v in symbols}
    clashes = [v for v in bound_vars(body) if v.name in taken]
    if not clashes:
        return body
    used = taken | {v.name for v in free_vars(body)}
    renamed = {}
    for v in clashes:
        fresh = next(f"{v.name}_{k}" for k in range(1, len(used) + 2)
                     if f"{v.name}_{k}" not in used)
        used.add(fresh)
        renamed[v] = Var(fresh, v.dtype)
    return substitute(body, renamed)
