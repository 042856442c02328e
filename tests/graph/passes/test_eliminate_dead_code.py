"""eliminate_dead_code drops operators no output depends on."""
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.passes.eliminate_dead_code import eliminate_dead_code
from treadle.graph.tensor import Tensor


def test_unused_operators_are_dropped():
    x = Tensor("x", "float32", [3])
    used = apply("Relu", [x])[0]
    unused = apply("Exp", [x])[0]
    graph = Graph((x,), (used,), (used.producer, unused.producer))
    assert [n.op_type for n in eliminate_dead_code(graph).nodes] == ["Relu"]
