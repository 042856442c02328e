"""Replace operators whose inputs are all constants by their (computed) outputs.

Small integer results are often known already (``Tensor.value``, derived from the
compute definition), even when their inputs are not constants, as for the shape of an
input; anything else is computed by compiling and running the operator itself, so folding uses the same single definition of each operator as inference does.
Results larger than ``MAX_FOLD_BYTES`` stay computed at run time rather than bloat the
model.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from treadle.graph.graph import Graph
from treadle.graph.operator import Operator
from treadle.graph.partition import CHECKING
from treadle.graph.rewrite import reapply, rewrite_graph
from treadle.graph.tensor import MAX_KNOWN, Tensor

MAX_FOLD_BYTES = 256 << 20


def fold_constants(graph: Graph) -> Graph:
    return rewrite_graph(graph, _fold)


def _fold(node: Operator, inputs: list[Optional[Tensor]]) -> Optional[Sequence[Tensor]]:
    outputs = reapply(node, inputs)
    # A check's output is its input, known or not; replaced by it, the check (of an index
    # against a symbolic size) would never run.
    if all(_known_ints(t) for t in outputs) and node.op_type not in CHECKING:
        # Known element by element (shape arithmetic), whatever the inputs are.
        arrays = [np.array(t.value, t.dtype.numpy).reshape(t.shape) for t in outputs]
    elif (_all_constant(inputs) and all(t.is_static for t in outputs)
          and _bytes(outputs) <= MAX_FOLD_BYTES):
        arrays = _run(outputs)
    else:
        return None
    return [Tensor(t.name, t.dtype, t.shape, data) for t, data in zip(outputs, arrays)]


def small_contents(t: Tensor) -> Optional[np.ndarray]:
    """The contents of a constant, or of a small static tensor computed from constants
    alone, which value tracking does not follow through float arithmetic (a window's length
    computed in float): an op definition may need them before any folding pass has run.
    An integer tensor keeps them as its value."""
    if t.is_constant:
        return t.data
    if t.value is not None and all(isinstance(v, int) for v in t.value):
        return np.array(t.value, t.dtype.numpy).reshape(t.shape)
    if not (t.is_static and int(np.prod(t.shape)) <= MAX_KNOWN and _from_constants(t)):
        return None
    data = _run([t])[0]
    if t.dtype.is_integer or t.dtype.is_bool:
        t.value = tuple(v.item() for v in data.reshape(-1))
    return data


def _from_constants(t: Tensor) -> bool:
    if t.is_constant:
        return True
    return t.producer is not None and all(
        _from_constants(x) for x in t.producer.inputs if x is not None)


def _known_ints(t: Tensor) -> bool:
    return t.is_static and t.value is not None and all(isinstance(v, int) for v in t.value)


def _all_constant(inputs: Sequence[Optional[Tensor]]) -> bool:
    present = [t for t in inputs if t is not None]
    return bool(present) and all(t.is_constant for t in present)


def _bytes(tensors: Sequence[Tensor]) -> int:
    return sum(int(np.prod(t.shape)) * t.dtype.numpy.itemsize for t in tensors)


def _run(outputs: Sequence[Tensor]) -> list[np.ndarray]:
    from treadle.compiler import compile_graph
    return compile_graph(Graph.from_outputs([], list(outputs), "fold"), optimize_graph=False)()
