"""fold_constants: constant subgraphs become data, computed from the operators' own
definitions: evaluated in numpy when small, by the compiler's runner when given."""
import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle.compiler import compile_graph
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.known import MAX_EVALUATED
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


def compiled(graph: Graph) -> list[np.ndarray]:
    """The runner the compiler hands in: the graph compiled as it is, then run."""
    return compile_graph(graph, optimize_graph=False)()


def never(graph: Graph):
    raise AssertionError(f"a small fold ran {graph.name}: the evaluator should compute it")


def test_small_folds_are_evaluated_without_running():
    w = constant(random_array((7, 13), seed=2), "w")
    s = apply("ReduceMax", [apply("Exp", [w])[0]], {"axes": [1], "keepdims": 0})[0]
    x = Tensor("x", "float32", [7])
    y = apply("Add", [x, s])[0]
    out = fold_constants(Graph.from_outputs([x], [y]), never)
    assert [n.op_type for n in out.nodes] == ["Add"]
    assert_close(out.nodes[0].inputs[1].data, np.exp(w.data).max(1))


@pytest.mark.parametrize("shape", [(MAX_EVALUATED + 1,), (131, 127)])
def test_large_folds_need_a_runner(shape):
    w = constant(random_array(shape, seed=3), "w")
    scaled = apply("Mul", [w, constant(np.float32(3.0))])[0]
    x = Tensor("x", "float32", shape)
    y = apply("Sub", [x, scaled])[0]
    graph = Graph.from_outputs([x], [y])
    kept = fold_constants(graph)
    assert [n.op_type for n in kept.nodes] == ["Mul", "Sub"]  # still correct, at run time
    folded = fold_constants(graph, compiled)
    assert [n.op_type for n in folded.nodes] == ["Sub"]
    assert_close(folded.nodes[0].inputs[1].data, w.data * np.float32(3.0))


def test_operators_with_their_own_kernel_need_a_runner():
    data = random_array((5, 11), seed=4)
    top = apply("TopK", [constant(data), constant(np.array([3]))], {"axis": 1})[0]
    graph = Graph.from_outputs([], [top])
    assert [n.op_type for n in fold_constants(graph).nodes] == ["TopK"]
    folded = fold_constants(graph, compiled).outputs[0]
    assert folded.is_constant
    assert_close(folded.data, -np.sort(-data, axis=1)[:, :3])


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


def test_sizes_computed_from_constants_in_float_are_known_while_importing():
    """A Reshape target computed from constants through float arithmetic (a window
    length, say) is computed when the Reshape is defined, before any folding pass."""
    length = apply("Cast", [constant(np.array(12.0, np.float32))], {"to": 7})[0]
    half = apply("Div", [length, constant(np.array(2, np.int64))])[0]
    target = apply("Concat", [apply("Unsqueeze", [half, constant(np.array([0]))])[0],
                              constant(np.array([-1]))], {"axis": 0})[0]
    x = Tensor("x", "float32", [12])
    y = apply("Reshape", [x, target])[0]
    assert y.shape == (6, 2)
    a = random_array((12,))
    assert_close(compile_graph(Graph.from_outputs([x], [y]))(a)[0], a.reshape(6, 2))


def test_a_check_of_known_indices_against_a_symbolic_size_is_kept():
    x = Tensor("x", "float32", ["n"])
    checked = apply("CheckIndices", [constant(np.array([2])), x],
                    {"axes": [0], "node": "pick", "op": "Gather"})[0]
    y = apply("Gather", [x, checked])[0]
    out = fold_constants(Graph.from_outputs([x], [y]))
    assert [n.op_type for n in out.nodes] == ["CheckIndices", "Gather"]
