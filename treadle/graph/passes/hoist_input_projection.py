"""Hoisting a recurrent layer's input projection out of its loop over time.

An LSTM, GRU or RNN node multiplies each step's input by W inside its serial loop, a
matrix-vector product per step and batch row. Those products do not depend on the state,
so one MatMul of the whole sequence by every direction's weights side by side,
[seq, batch, features] x [features, directions * gates * hidden], computes them all before
the loop, on the GEMM template, and the node becomes its ``<op>Steps`` form, which reads
them, and R transposed (``graph.ops.recurrent``). Constant folding, which runs next,
transposes constant weights once.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from treadle.graph.graph import Graph
from treadle.graph.operator import Operator, apply
from treadle.graph.ops.recurrent import CELLS
from treadle.graph.rewrite import rewrite_graph
from treadle.graph.tensor import Tensor, constant


def hoist_input_projection(graph: Graph) -> Graph:
    return rewrite_graph(graph, _hoist)


def _hoist(node: Operator, inputs: list[Optional[Tensor]]) -> Optional[Sequence[Tensor]]:
    if node.op_type not in CELLS or len(inputs) < 2 or inputs[1] is None:
        return None
    x, w = inputs[0], inputs[1]
    if not w.is_static:
        return None
    directions, rows, features = w.shape
    shape = constant(np.array([directions * rows, features], np.int64), f"{node.name}/rows")
    flat = apply("Reshape", [w, shape], name=f"{node.name}/weights")[0]
    columns = apply("Transpose", [flat], {"perm": [1, 0]}, name=f"{node.name}/columns")[0]
    projected = apply("MatMul", [x, columns], name=f"{node.name}/projection")[0]
    r = apply("Transpose", [inputs[2]], {"perm": [0, 2, 1]}, name=f"{node.name}/recurrence")[0]
    return apply(f"{node.op_type}Steps", [projected, None, r, *inputs[3:]], node.attrs,
                 name=node.name, output_names=[t.name for t in node.outputs])
