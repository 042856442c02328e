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
