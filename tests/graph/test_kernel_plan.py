"""The kernel-plan seam: the greedy strategy is today's fusion partition, and the compiler
builds any plan it is handed — several outputs per kernel, an operator computed in two
kernels — with the right numbers."""
import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle import ops
from treadle.compiler import compile_graph
from treadle.graph import kernel_plan
from treadle.graph.kernel_plan import KernelPlan, build_plans
from treadle.graph.optimize import optimize
from treadle.graph.partition import partition


def two_heads():
    """relu(x) read by two products; the first's bias add and the product both returned."""
    x = ops.input("x", "float32", ["n", 24])
    w1, w2 = random_array((24, 16), seed=1), random_array((24, 8), seed=2)
    bias = random_array(16, seed=3)
    a = ops.relu(x)
    h = ops.matmul(a, ops.constant(w1))
    y1 = ops.add(h, ops.constant(bias))
    y2 = ops.matmul(a, ops.constant(w2))
    graph = ops.graph([x], [h, y1, y2, a], name="two_heads")

    def reference(xv):
        av = np.maximum(xv, 0)
        return [av @ w1, av @ w1 + bias, av @ w2, av]
    return graph, reference


class Recording:
    """A builder that keeps the plans it is handed instead of building them."""
    maker = None

    def executable(self, graph, plans):
        self.built = (graph, list(plans))
        return "executable"


def test_greedy_is_the_fusion_partition():
    graph, builder = optimize(two_heads()[0]), Recording()
    assert build_plans(graph, "greedy", builder) == "executable"
    (planned, plans), groups = builder.built, partition(graph)
    assert planned is graph
    assert [(p.anchor, p.prologues, p.epilogues, p.outputs) for p in plans] == [
        (g.anchor, tuple(g.prologues), tuple(g.epilogues), tuple(g.outputs)) for g in groups]


def test_unknown_strategy_names_the_known_ones():
    with pytest.raises(ValueError, match="'korch'.*greedy"):
        build_plans(two_heads()[0], "korch", Recording())


def recompute_relu(graph):
    """relu alone for its own output, and again as a prologue of each product; the first
    product also writes its bias add: four outputs from three kernels."""
    relu, mm1, add, mm2 = graph.nodes
    return graph, [KernelPlan(relu, outputs=tuple(relu.outputs)),
                   KernelPlan(mm1, (relu,), (add,), (mm1.outputs[0], add.outputs[0])),
                   KernelPlan(mm2, (relu,), outputs=tuple(mm2.outputs))]


@pytest.mark.parametrize("rows", [0, 1, 7, 61])
def test_a_plan_may_recompute_an_operator_and_write_several_outputs(monkeypatch, rows):
    graph, reference = two_heads()
    monkeypatch.setitem(kernel_plan.STRATEGIES, "recompute",
                        lambda graph, builder: builder.executable(*recompute_relu(graph)))
    _, plans = recompute_relu(graph)
    x = graph.inputs[0]
    assert plans[0].inputs == (x,) and plans[1].inputs[0] is x and len(plans[1].inputs) == 3
    model = compile_graph(graph, optimize_graph=False, strategy="recompute")
    assert len(model.steps) == 3
    x = random_array((rows, 24), seed=4)
    for got, want in zip(model(x), reference(x)):
        assert_close(got, want.astype(np.float32), reduction=24)
