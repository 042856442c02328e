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


def test_a_size_found_in_the_data_orders_the_nodes_that_use_it_without_reading_its_finder():
    """A Dims node holding the size FoundSum finds reads no tensor of it, yet runs after
    it: depth-first from the outputs alone would order it first."""
    import numpy as np

    import treadle
    from treadle.graph.ops.shape import dims_tensor
    repeats = Tensor("repeats", "int64", [5])
    count = apply("FoundSum", [repeats], name="count")[0]
    (found,) = {d.symbol for d in count.producer.data_sizes}
    sizes = dims_tensor([found * 2], "sizes")
    ramp = apply("Range", [*(apply("Squeeze", [t], name=f"s{k}")[0] for k, t in enumerate(
        [dims_tensor([0], "zero"), sizes, dims_tensor([1], "one")]))], name="ramp")[0]
    graph = Graph.from_outputs([repeats], [ramp, count])
    names = [n.name for n in graph.nodes]
    assert names.index("count") < names.index("sizes")
    model = treadle.compile(graph)
    for r in ([1, 0, 2, 0, 4], [0] * 5, [3, 3, 3, 3, 3]):
        got, total = model(repeats=np.array(r, np.int64))
        assert int(total) == sum(r)
        np.testing.assert_array_equal(got, np.arange(2 * sum(r)))
