"""Compile-time contents of tensors, evaluated from operators' compute definitions.

Exported models compute reshape targets with ``Shape -> Gather -> Concat`` chains. When the
input has a symbolic dimension these values are expressions like ``seq * 12``. Rather than
re-implement each op's meaning, the op's own compute definition is evaluated element by
element with loads of known inputs replaced by their (possibly symbolic) contents.

Tensors computed from constants (through float arithmetic too) have numpy contents, which
``evaluate_operator`` computes from the same definitions with ``ir.evaluate``, as generated
code would: constant folding uses it, and ``small_contents`` gives an op definition the
contents of a small input before any folding pass has run. Evaluation runs in Python, so
it is bounded by a ``Budget`` of element evaluations and gives up (None) beyond it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

import numpy as np

from treadle.errors import TreadleError
from treadle.graph.partition import CHECKING
from treadle.graph.tensor import MAX_KNOWN, Dim, Tensor, normalize_dim
from treadle.ir.compute import Compute
from treadle.ir.evaluate import evaluate_computes, work
from treadle.ir.expr import Buffer, Const, Expr, Load, as_expr, cast
from treadle.ir.functor import rewrite, substitute
from treadle.ir.mapping import unravel
from treadle.ir.simplify import simplify_expr

if TYPE_CHECKING:
    from treadle.graph.operator import Operator

# Element evaluations (``ir.evaluate.work``) one compile-time evaluation may spend: some
# 20 us each in Python, so one stays under half a second.
MAX_EVALUATED = 1 << 14


class _Unknown(Exception):
    """An element depends on something not known at compile time."""


def evaluate_small(c: Compute, inputs: Mapping[Buffer, Tensor]) -> Optional[tuple[Dim, ...]]:
    if not (c.dtype.is_integer or c.dtype.is_bool) or c.is_reduction:
        return None
    shape = [normalize_dim(d) for d in c.shape]
    if not all(isinstance(d, int) for d in shape) or math.prod(shape) > MAX_KNOWN:
        return None
    try:
        return tuple(_element(c, unravel(k, shape), inputs) for k in range(math.prod(shape)))
    except _Unknown:
        return None


def derive_value(t: Tensor, seen: Optional[set] = None) -> None:
    """Fills in the contents of a small integer tensor that were unknown when its operator
    was applied because an input's were: one computed from constants through float
    arithmetic has contents only once evaluated (Dinov2's patch grid side, int(49 ** 0.5),
    concatenated with a size read from the input's shape), which ``small_contents`` does
    on demand; the tensors computed from it are then evaluated again."""
    seen = set() if seen is None else seen
    if t.value is not None or t.producer is None or not (t.dtype.is_integer or t.dtype.is_bool) \
            or not t.is_static or math.prod(t.shape) > MAX_KNOWN or id(t) in seen:
        return
    seen.add(id(t))  # a tensor read by several on the way is tried once
    small_contents(t)
    if t.value is not None:
        return
    op = t.producer
    for x in op.inputs:
        if x is not None:
            derive_value(x, seen)
    inputs = {b: x for b, x in zip(op.input_buffers, op.inputs) if b is not None}
    t.value = evaluate_small(op.definition[op.outputs.index(t)], inputs)


def _element(c: Compute, index, inputs: Mapping[Buffer, Tensor]) -> Dim:
    value = substitute(c.value, dict(zip(c.axes, (as_expr(i) for i in index))))
    # Decide selects on the index first: an untaken branch may read out of range (Concat).
    value = simplify_expr(value)
    value = rewrite(value, lambda n: _resolve(n, inputs) if isinstance(n, Load) else None)
    return normalize_dim(simplify_expr(value))


def _resolve(load: Load, inputs: Mapping[Buffer, Tensor]) -> Expr:
    tensor = inputs.get(load.buffer)
    if tensor is None or tensor.value is None:
        raise _Unknown
    indices = [simplify_expr(i) for i in load.indices]
    if not all(isinstance(i, Const) for i in indices):
        raise _Unknown
    shape = tensor.shape
    flat = 0
    for i, d in zip(indices, shape):
        if not 0 <= i.value < d:
            raise _Unknown  # out of range: leave it to the run-time kernel to report
        flat = flat * d + i.value
    return cast(tensor.value[flat], load.dtype)


@dataclass
class Budget:
    """The element evaluations left to one compile-time evaluation."""
    left: int = MAX_EVALUATED


def small_contents(t: Tensor) -> Optional[np.ndarray]:
    """The contents of a constant, or of a small static tensor computed from constants
    alone, which value tracking does not follow through float arithmetic (a window's length
    computed in float): an op definition may need them before any folding pass has run.
    None where they are not known or not evaluable within a ``Budget``. An integer tensor
    keeps them as its value."""
    if t.is_constant:
        return t.data
    if known_ints(t):
        return _value_array(t)
    if not (t.is_static and math.prod(t.shape) <= MAX_KNOWN):
        return None
    data = _contents(t, {}, Budget())
    if data is not None and (t.dtype.is_integer or t.dtype.is_bool):
        t.value = tuple(v.item() for v in data.reshape(-1))
    return data


def _contents(t: Tensor, found: dict[int, np.ndarray], budget: Budget
              ) -> Optional[np.ndarray]:
    """The contents of ``t`` if it is computed from constants and from tensors whose
    contents are known ints (a static size read through Shape, then halved in float:
    MobileViT's patch count); ``found`` holds those of the tensors evaluated on the way."""
    if t.is_constant:
        return t.data
    if known_ints(t):
        return _value_array(t)
    if id(t) not in found:
        op = t.producer
        if op is None or not t.is_static:
            return None
        inputs = []
        for x in op.inputs:
            data = None if x is None else _contents(x, found, budget)
            if x is not None and data is None:
                return None  # before evaluating the other inputs
            inputs.append(data)
        data = evaluate_operator(op, inputs, budget, [t])
        if data is None:
            return None
        found[id(t)] = data[0]
    return found[id(t)]


def evaluate_operator(op: "Operator", inputs: Sequence[Optional[np.ndarray]], budget: Budget,
                      outputs: Optional[Sequence[Tensor]] = None
                      ) -> Optional[list[np.ndarray]]:
    """The contents of ``op``'s outputs (or of those given) from the contents of its inputs
    (None for an absent one), evaluated from its compute definition; the work is taken
    from ``budget``. None where the definition does not give them (a hand-written kernel's
    gives only shapes, a check's only its input), where the work is over the budget, or
    where evaluating fails (an index out of range, a division by zero): the run-time
    kernel then computes them, and reports the failure."""
    if op.opdef.kernel is not None or op.op_type in CHECKING or op.checks:
        return None
    wanted = op.outputs if outputs is None else outputs
    computes = [op.definition[op.outputs.index(t)] for t in wanted]
    amount = work(computes)
    if amount is None or amount > budget.left:
        return None
    budget.left -= amount
    buffers = {b: a for b, a in zip(op.input_buffers, inputs) if b is not None}
    try:
        return evaluate_computes(computes, buffers, amount)
    except TreadleError:
        return None


def known_ints(t: Tensor) -> bool:
    """Whether the contents of ``t`` are known, as ints (no symbolic element)."""
    return t.is_static and t.value is not None and all(isinstance(v, int) for v in t.value)


def _value_array(t: Tensor) -> np.ndarray:
    return np.array(t.value, t.dtype.numpy).reshape(t.shape)
