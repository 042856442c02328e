"""fold_constants: constant subgraphs become data, computed by treadle's own kernels."""
import numpy as np

from tests.harness import assert_close, random_array
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.passes.fold_constants import fold_constants
from treadle.graph.tensor import Tensor, constant


def test_constant_chain_is_computed():
    w = constant(random_array((4, 6), seed=1), "w")
    t = apply("Transpose", [w], {"perm": [1, 0]})[0]
    s = apply("Mul", [t, constant(np.float32(2.0))])[0]
    x = Tensor("x", "float32", [3, 6])
    y = apply("MatMul", [x, s])[0]
    out = fold_constants(Graph.from_outputs([x], [y]))
    assert [n.op_type for n in out.nodes] == ["MatMul"]
    folded = out.nodes[0].inputs[1]
    assert folded.is_constant
    assert_close(folded.data, w.data.T * 2)


def test_symbolic_shape_arithmetic_folds_to_known_values():
    x = Tensor("x", "float32", ["batch", "seq", 8])
    shape = apply("Shape", [x])[0]
    last = apply("Gather", [shape, constant(np.array(2))], {"axis": 0})[0]
    doubled = apply("Mul", [last, constant(np.array(2))])[0]
    out = fold_constants(Graph.from_outputs([x], [doubled]))
    assert out.outputs[0].is_constant and out.outputs[0].data == 16


def test_values_depending_on_inputs_are_kept():
    x = Tensor("x", "float32", [3])
    y = apply("Add", [x, constant(np.ones(3, np.float32))])[0]
    out = fold_constants(Graph.from_outputs([x], [y]))
    assert [n.op_type for n in out.nodes] == ["Add"]
