"""A graph: input tensors, output tensors and the operators between them, in topological
order. Built from the outputs by walking producers, so unused operators never enter."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from treadle.errors import ShapeError
from treadle.graph.operator import Operator
from treadle.graph.tensor import Tensor
from treadle.ir.expr import Var, as_expr
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
    produced by an operator is an error naming it. An operator whose tensors' shapes hold
    a size another finds in the data (``OpContext.size_from_data``) comes after the
    finder, though it may read none of its tensors (a Range to that size)."""
    order = _depth_first(inputs, outputs, lambda node: ())
    finders = {d.symbol.name: node for node in order for d in node.data_sizes}
    if not finders:
        return order

    def finders_of(node: Operator) -> list[Operator]:
        names = {v.name for v in _symbols(node)}
        return [finders[n] for n in sorted(names & finders.keys()) if finders[n] is not node]
    return _depth_first(inputs, outputs, finders_of)


def _depth_first(inputs: Sequence[Tensor], outputs: Sequence[Tensor],
                 also_after: Callable[[Operator], Sequence[Operator]]) -> tuple[Operator, ...]:
    """Operators in post-order from ``outputs``: each after its inputs' producers and the
    operators ``also_after`` names."""
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
            before = [t.producer for t in node.inputs if t is not None and t.producer]
            for t in node.inputs:
                if t is not None and t.producer is None:
                    _check_source(t, known_inputs)
            for producer in reversed([*before, *also_after(node)]):
                if state.get(id(producer)) != "done":
                    stack.append((producer, False))
    return tuple(order)


def _symbols(node: Operator) -> set[Var]:
    """The symbols of the node's tensors' shapes and of its definition's values (a Dims
    node's sizes)."""
    dims = [as_expr(d) for t in (*node.inputs, *node.outputs) if t is not None
            for d in t.shape]
    values = [e for c in node.definition for e in (c.value, *c.reduce_extents)]
    return {v for e in (*dims, *values) for v in free_vars(as_expr(e))}


def _check_source(t: Tensor, known_inputs: set[int]) -> None:
    if id(t) not in known_inputs and not t.is_constant:
        raise ShapeError(f"tensor {t.name!r} is used but is neither a graph input, a constant "
                         "nor the output of an operator")
