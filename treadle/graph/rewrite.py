"""Rebuilding a graph node by node, the mechanism every graph pass uses.

Tensors and operators are linked (a tensor knows its producer), so passes do not edit a
graph in place: ``rewrite_graph`` walks it in topological order and asks a rule what each
node becomes, given its inputs in the new graph. A rule returns replacement tensors for
the node's outputs, or None to keep the node (re-applied if its inputs changed, which
re-runs shape inference). A replacement holds the value of the tensor it replaces, so it
takes that tensor's name among its ``aliases``.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from treadle.graph.graph import Graph
from treadle.graph.operator import Operator, apply
from treadle.graph.tensor import Tensor

Rule = Callable[[Operator, list[Optional[Tensor]]], Optional[Sequence[Tensor]]]


def rewrite_graph(graph: Graph, rule: Rule) -> Graph:
    mapping: dict[int, Tensor] = {}

    def new(t: Optional[Tensor]) -> Optional[Tensor]:
        return None if t is None else mapping.get(id(t), t)

    for node in graph.nodes:
        inputs = [new(t) for t in node.inputs]
        outputs = rule(node, inputs)
        if outputs is None:
            outputs = reapply(node, inputs)
        for old, replacement in zip(node.outputs, outputs):
            if replacement is not old:
                mapping[id(old)] = replacement
                replacement.aliases |= {old.name, *old.aliases}
    outputs = [_keep_name(old, new(old), graph, k) for k, old in enumerate(graph.outputs)]
    return Graph.from_outputs(graph.inputs, outputs, graph.name)


def _keep_name(old: Tensor, tensor: Tensor, graph: Graph, k: int) -> Tensor:
    """Graph outputs keep their names. A replacement that is a graph input, a constant or
    an earlier output gets a copy of its own instead of being renamed."""
    if tensor is old or tensor.name == old.name:
        return tensor
    shared = (tensor.producer is None or any(tensor is t for t in graph.inputs)
              or any(tensor is t for t in graph.outputs[:k]))
    if shared:
        return apply("Identity", [tensor], name=f"{old.name}/copy", output_names=[old.name])[0]
    tensor.name = old.name
    return tensor


def reapply(node: Operator, inputs: list[Optional[Tensor]]) -> Sequence[Tensor]:
    """The node itself when its inputs are unchanged, else the same operator over them."""
    if all(a is b for a, b in zip(inputs, node.inputs)):
        return node.outputs
    return apply(node.op_type, inputs, node.attrs, node.name, [t.name for t in node.outputs])


def sole_reader(readers: dict[int, list], tensor: Tensor) -> bool:
    """Whether one operator reads ``tensor`` once and the graph does not return it
    (``readers`` from ``consumers``): a pass may then rewrite what computes it."""
    return len(readers.get(id(tensor), [])) == 1


def consumers(graph: Graph) -> dict[int, list[Operator]]:
    """The operators reading each tensor (by id), graph outputs counted as a reader None."""
    readers: dict[int, list] = {}
    for node in graph.nodes:
        for t in node.inputs:
            if t is not None:
                readers.setdefault(id(t), []).append(node)
    for t in graph.outputs:
        readers.setdefault(id(t), []).append(None)
    return readers
