"""Compile-time contents of small integer (and bool) tensors, evaluated from compute definitions.

Exported models compute reshape targets with ``Shape -> Gather -> Concat`` chains. When the
input has a symbolic dimension these values are expressions like ``seq * 12``. Rather than
re-implement each op's meaning, the op's own compute definition is evaluated element by
element with loads of known inputs replaced by their (possibly symbolic) contents.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional

from treadle.graph.tensor import MAX_KNOWN, Dim, Tensor, normalize_dim
from treadle.ir.compute import Compute
from treadle.ir.expr import Buffer, Const, Expr, Load, as_expr, cast
from treadle.ir.functor import rewrite, substitute
from treadle.ir.mapping import unravel
from treadle.ir.simplify import simplify_expr


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
    arithmetic has contents only once folded (Dinov2's patch grid side, int(49 ** 0.5),
    concatenated with a size read from the input's shape), which ``small_contents`` does
    on demand; the tensors computed from it are then evaluated again."""
    from treadle.graph.passes.fold_constants import small_contents
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
