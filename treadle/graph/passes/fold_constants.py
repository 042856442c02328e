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
from treadle.graph.tensor import MAX_KNOWN, Tensor, constant

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
    leaves: dict[int, Tensor] = {}
    if not (t.is_static and int(np.prod(t.shape)) <= MAX_KNOWN and _from_known(t, leaves)):
        return None
    data = _run([t], list(leaves.values()))[0]
    if t.dtype.is_integer or t.dtype.is_bool:
        t.value = tuple(v.item() for v in data.reshape(-1))
    return data


def _from_known(t: Tensor, leaves: dict[int, Tensor]) -> bool:
    """Whether ``t`` is computed from constants and from tensors whose contents are known
    ints (a static size read through Shape, then halved in float: MobileViT's patch
    count), which ``leaves`` collects."""
    if t.is_constant:
        return True
    if _known_ints(t):
        leaves[id(t)] = t
        return True
    return t.producer is not None and all(
        _from_known(x, leaves) for x in t.producer.inputs if x is not None)


def _known_ints(t: Tensor) -> bool:
    return t.is_static and t.value is not None and all(isinstance(v, int) for v in t.value)


def _all_constant(inputs: Sequence[Optional[Tensor]]) -> bool:
    present = [t for t in inputs if t is not None]
    return bool(present) and all(t.is_constant for t in present)


def _bytes(tensors: Sequence[Tensor]) -> int:
    return sum(int(np.prod(t.shape)) * t.dtype.numpy.itemsize for t in tensors)


def _run(outputs: Sequence[Tensor], known: Sequence[Tensor] = ()) -> list[np.ndarray]:
    """``outputs`` computed from constants, and from the ``known`` tensors' contents."""
    from treadle.compiler import compile_graph
    if known:
        outputs = _over_constants(outputs, known)
    return compile_graph(Graph.from_outputs([], list(outputs), "fold"), optimize_graph=False)()


def _over_constants(outputs: Sequence[Tensor], known: Sequence[Tensor]) -> list[Tensor]:
    """``outputs`` computed again with the ``known`` tensors as constants of their
    contents, so that nothing before them is computed."""
    copies = {id(t): constant(np.array(t.value, t.dtype.numpy).reshape(t.shape), t.name,
                              t.dtype) for t in known}

    def copy(t: Tensor) -> Tensor:
        if t.is_constant:
            return t
        if id(t) not in copies:
            op = t.producer
            inputs = [None if x is None else copy(x) for x in op.inputs]
            copies[id(t)] = reapply(op, inputs)[op.outputs.index(t)]
        return copies[id(t)]
    return [copy(t) for t in outputs]
