"""Replace operators whose inputs are all constants by their (computed) outputs.

Small integer results are often known already (``Tensor.value``, derived from the
compute definition), even when their inputs are not constants, as for the shape of an
input. Anything else is computed from the operator's own compute definition, the single
definition inference uses too: evaluated in numpy (``graph.known``) when that is quick,
and otherwise by ``run``, which the driver hands in to compile and run the operators
(this layer never compiles). Without a ``run``, or for results larger than
``MAX_FOLD_BYTES``, operators stay computed at run time rather than bloat the model.
"""
from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

import numpy as np

from treadle.graph.graph import Graph
from treadle.graph.known import Budget, evaluate_operator, known_ints
from treadle.graph.operator import Operator
from treadle.graph.partition import CHECKING
from treadle.graph.rewrite import reapply, rewrite_graph
from treadle.graph.tensor import Tensor

MAX_FOLD_BYTES = 256 << 20

# Computes the outputs of a graph without inputs, made of constant-only operators.
Run = Callable[[Graph], list[np.ndarray]]


def fold_constants(graph: Graph, run: Optional[Run] = None) -> Graph:
    return rewrite_graph(graph, functools.partial(_fold, run=run))


def _fold(node: Operator, inputs: list[Optional[Tensor]], run: Optional[Run]
          ) -> Optional[Sequence[Tensor]]:
    outputs = reapply(node, inputs)
    # A check's output is its input, known or not; replaced by it, the check (of an index
    # against a symbolic size) would never run.
    if all(known_ints(t) for t in outputs) and node.op_type not in CHECKING:
        # Known element by element (shape arithmetic), whatever the inputs are.
        arrays = [np.array(t.value, t.dtype.numpy).reshape(t.shape) for t in outputs]
    elif _all_constant(inputs) and all(t.is_static for t in outputs):
        arrays = _compute(outputs, run)
    else:
        arrays = None
    if arrays is None:
        return None
    return [Tensor(t.name, t.dtype, t.shape, data) for t, data in zip(outputs, arrays)]


def _compute(outputs: Sequence[Tensor], run: Optional[Run]) -> Optional[list[np.ndarray]]:
    """The contents of one operator's outputs, whose inputs are constants."""
    op = outputs[0].producer
    arrays = evaluate_operator(op, [None if t is None else t.data for t in op.inputs],
                               Budget())
    if arrays is None and run is not None and _bytes(outputs) <= MAX_FOLD_BYTES:
        arrays = run(Graph.from_outputs([], list(outputs), "fold"))
    return arrays


def _all_constant(inputs: Sequence[Optional[Tensor]]) -> bool:
    present = [t for t in inputs if t is not None]
    return bool(present) and all(t.is_constant for t in present)


def _bytes(tensors: Sequence[Tensor]) -> int:
    return sum(int(np.prod(t.shape)) * t.dtype.numpy.itemsize for t in tensors)
