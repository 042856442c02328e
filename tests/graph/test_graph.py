"""Graph construction: topological order, unknown tensors, unsupported operators."""
import pytest

from treadle.errors import ShapeError, UnsupportedOpError
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.tensor import Tensor


def test_nodes_come_in_topological_order_without_duplicates():
    x = Tensor("x", "float32", [4])
    a = apply("Relu", [x], name="a")[0]
    b = apply("Exp", [a], name="b")[0]
    c = apply("Add", [a, b], name="c")[0]
    graph = Graph.from_outputs([x], [c, b])
    assert [n.name for n in graph.nodes] == ["a", "b", "c"]
    assert "c:0: float32[4] = Add[c](a:0, b:0)" in str(graph)


def test_tensor_from_nowhere_is_named():
    stray = Tensor("stray", "float32", [4])
    y = apply("Relu", [stray])[0]
    with pytest.raises(ShapeError, match="stray"):
        Graph.from_outputs([], [y])


def test_unknown_operator_is_unsupported():
    with pytest.raises(UnsupportedOpError, match="FancyOp"):
        apply("FancyOp", [Tensor("x", "float32", [1])])


def test_symbolic_dims_are_symbols():
    x = Tensor("x", "float32", ["batch", 3])
    assert {v.name for v in x.symbols} == {"batch"} and not x.is_static
