"""infer_shapes: specialising symbolic inputs re-infers every shape, or names the node."""
import numpy as np
import pytest

from treadle.errors import ShapeError
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.passes.infer_shapes import infer_shapes
from treadle.graph.tensor import Tensor, constant
from treadle.ir.expr import Var


def bert_like():
    x = Tensor("x", "float32", ["batch", "seq", 16])
    shape = apply("Shape", [x])[0]
    dims = apply("Gather", [shape, constant(np.array([0, 1]))], {"axis": 0})[0]
    target = apply("Concat", [dims, constant(np.array([4, 4]))], {"axis": 0})[0]
    heads = apply("Reshape", [x, target])[0]
    out = apply("Transpose", [heads], {"perm": [0, 2, 1, 3]}, "transpose")[0]
    return Graph.from_outputs([x], [out])


def test_symbolic_shapes_flow_through_shape_arithmetic():
    graph = bert_like()
    assert graph.outputs[0].shape == (Var("batch"), 4, Var("seq"), 4)


def test_binding_symbols_makes_every_shape_concrete():
    original = bert_like()
    graph = infer_shapes(original, {"x": [2, 7, 16]})
    assert graph.outputs[0].shape == (2, 4, 7, 4)
    assert all(t.is_static for t in graph.tensors)
    assert graph.outputs[0].name == original.outputs[0].name


def test_dtype_is_inferred():
    x = Tensor("x", "int32", [3])
    y = apply("Greater", [x, constant(np.int32(1))])[0]
    z = apply("Cast", [y], {"to": 1})[0]
    graph = infer_shapes(Graph.from_outputs([x], [y, z]))
    assert [str(t.dtype) for t in graph.outputs] == ["bool", "float32"]


def test_incompatible_new_shape_names_the_node():
    a, b = Tensor("a", "float32", ["n"]), Tensor("b", "float32", [4])
    graph = Graph.from_outputs([a, b], [apply("Add", [a, b], name="plus")[0]])
    with pytest.raises(ShapeError, match="plus"):
        infer_shapes(graph, {"a": [5]})


def test_unknown_input_and_rank_change_are_errors():
    with pytest.raises(ShapeError, match="no graph inputs"):
        infer_shapes(bert_like(), {"y": [1]})
    with pytest.raises(ShapeError, match="rank"):
        infer_shapes(bert_like(), {"x": [1, 2]})
