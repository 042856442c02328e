"""Shape and dtype inference over a whole graph, optionally for new input shapes.

Every operator infers its outputs when it is applied (from its compute definition), so a
graph is always consistent. This pass re-runs that inference after changing input shapes:
binding a symbol to a number (``{"x": [1, 128]}``) or renaming symbols, so that the whole
graph becomes concrete, or reports the node whose shapes no longer fit.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from treadle.errors import ShapeError
from treadle.graph.graph import Graph
from treadle.graph.rewrite import reapply
from treadle.graph.tensor import Tensor


def infer_shapes(graph: Graph, shapes: Optional[Mapping[str, Sequence]] = None) -> Graph:
    shapes = dict(shapes or {})
    unknown = set(shapes) - {t.name for t in graph.inputs}
    if unknown:
        raise ShapeError(f"no graph inputs named {sorted(unknown)}; inputs are "
                         f"{[t.name for t in graph.inputs]}")
    mapping: dict[int, Tensor] = {}
    inputs = []
    for t in graph.inputs:
        new = Tensor(t.name, t.dtype, tuple(shapes.get(t.name, t.shape)))
        if new.rank != t.rank:
            raise ShapeError(f"input {t.name!r} has rank {t.rank}, got shape {list(new.shape)}")
        mapping[id(t)] = new
        inputs.append(new)
    for node in graph.nodes:
        args = [None if t is None else mapping.get(id(t), t) for t in node.inputs]
        # Re-apply even when inputs look unchanged, so every node is inferred again.
        outputs = reapply(node, args) if any(a is not b for a, b in zip(args, node.inputs)) \
            else node.outputs
        mapping.update((id(old), new) for old, new in zip(node.outputs, outputs))
    outputs = [mapping.get(id(t), t) for t in graph.outputs]
    return Graph.from_outputs(inputs, outputs, graph.name)
