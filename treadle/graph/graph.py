"""A graph: input tensors, output tensors and the operators between them, in topological
order. Built from the outputs by walking producers, so unused operators never enter."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from treadle.errors import ShapeError
from treadle.graph.operator import Operator
from treadle.graph.tensor import Tensor
from treadle.ir.expr import as_expr
from treadle.ir.functor import free_vars


@dataclass(eq=False)
class Graph:
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    nodes: tuple[Operator, ...]
    name: str = "graph"

    @staticmethod
    def from_outputs(inputs: Sequence[Tensor], outputs: Sequence[Tensor],
                     name: str = "graph") -> Graph:
        return Graph(tuple(inputs), tuple(outputs), topological_order(inputs, outputs), name)

    @property
    def symbols(self) -> set[str]:
        """Names of the symbols in the inputs' dimensions (bound at each call)."""
        return {v.name for t in self.inputs for d in t.shape for v in free_vars(as_expr(d))}

    @property
    def tensors(self) -> list[Tensor]:
        seen: dict[int, Tensor] = {id(t): t for t in self.inputs}
        for node in self.nodes:
            for t in (*node.inputs, *node.outputs):
                if t is not None:
                    seen.setdefault(id(t), t)
        for t in self.outputs:  # a constant output (say, after folding) has no producer
            seen.setdefault(id(t), t)
        return list(seen.values())

    def __str__(self) -> str:
        from treadle.graph.printer import format_graph
        return format_graph(self)


def topological_order(inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> tuple[Operator, ...]:
    """Producers before consumers; a tensor that is neither a graph input, a constant nor
    produced by an operator is an error naming it."""
    known_inputs = {id(t) for t in inputs}
    order: list[Operator] = []
    state: dict[int, str] = {}
    for root in outputs:
        stack: list[tuple[Operator, bool]] = []
        if root.producer is not None:
            stack.append((root.producer, False))
        else:
            _check_source(root, known_inputs)
        while stack:
            node, expanded = stack.pop()
            key = id(node)
            if expanded:
                state[key] = "done"
                order.append(node)
                continue
            if state.get(key) == "done":
                continue
            if state.get(key) == "open":
                raise ShapeError(f"the graph has a cycle through node {node.name!r}")
            state[key] = "open"
            stack.append((node, True))
            for t in reversed([t for t in node.inputs if t is not None]):
                if t.producer is None:
                    _check_source(t, known_inputs)
                elif state.get(id(t.producer)) != "done":
                    stack.append((t.producer, False))
    return tuple(order)


def _check_source(t: Tensor, known_inputs: set[int]) -> None:
    if id(t) not in known_inputs and not t.is_constant:
        raise ShapeError(f"tensor {t.name!r} is used but is neither a graph input, a constant "
                         "nor the output of an operator")
