"""Orchestration end to end: the kernels it picks run and match independent references
(numpy, ONNX Runtime); with costs given, the choices it must make (recompute a value,
write two outputs from one kernel, keep greedy fusion when nothing beats it); failing
candidates are skipped; a second orchestration measures nothing."""
import json
import logging

import numpy as np
import pytest
from onnx import helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array, run_onnxruntime
from treadle import ops
from treadle import orchestrate as orchestrator
from treadle.compiler import compile_graph
from treadle.config import override
from treadle.graph import kernel_plan
from treadle.graph.optimize import optimize
from treadle.orchestrate import orchestrate, orchestrated
from treadle.orchestrate import cost as cost_module
from treadle.target.cpu import host
from treadle.tune.kernel import KernelMaker


def attention_model(heads: int = 2, seq="seq", dim: int = 8):
    """softmax(q k^T / sqrt(dim)) v followed by a layer norm over the last axis."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Div", ["s", "scale"], ["scaled"]),
             helper.make_node("Softmax", ["scaled"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["o"]),
             helper.make_node("LayerNormalization", ["o", "g", "b"], ["y"], axis=-1)]
    shape = [heads, seq, dim]
    return make_model(nodes, [tensor(n, shape) for n in "qkv"], [tensor("y", shape)],
                      {"scale": np.float32(np.sqrt(dim)), "g": random_array(dim, seed=1),
                       "b": random_array(dim, seed=2)})


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with override(cache_dir=tmp_path_factory.mktemp("orchestrate-cache")):
        yield


@pytest.mark.parametrize("seq", [1, 7, 61])
def test_orchestrated_attention_matches_onnxruntime(cache, seq):
    model = attention_model()
    compiled = treadle.compile(model, orchestrate=True)
    feeds = {n: random_array((2, seq, 8), seed=k) for k, n in enumerate("qkv")}
    assert_close(compiled(**feeds)[0], run_onnxruntime(model, feeds)[0], reduction=8)


def kernel_free_models():
    """Graphs of no kernel: the output is the input, a constant, or both."""
    x = tensor("x", ["n", 5])
    yield make_model([], [x], [tensor("x", ["n", 5])])
    yield make_model([], [x], [tensor("c", [3])], {"c": random_array(3, seed=4)})
    yield make_model([helper.make_node("Constant", [], ["k"], value_float=2.5)], [x],
                     [tensor("x", ["n", 5]), tensor("k", [])])


@pytest.mark.parametrize("model", list(kernel_free_models()), ids=["input", "constant", "both"])
@pytest.mark.parametrize("rows", [0, 1, 7])
def test_a_graph_without_kernels_compiles_as_greedy_fusion_does(cache, model, rows):
    feeds = {"x": random_array((rows, 5), seed=3)}
    expected = run_onnxruntime(model, feeds)
    for actual in (treadle.compile(model, orchestrate=True)(**feeds),
                   treadle.compile(model)(**feeds)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_close(a, e)


def test_a_second_orchestration_measures_nothing(cache, monkeypatch):
    treadle.compile(attention_model(), orchestrate=True)

    def refuse(*args, **kwargs):
        raise AssertionError("measured again")
    monkeypatch.setattr(cost_module, "measure_functions", refuse)
    compiled = treadle.compile(attention_model(), orchestrate=True)
    feeds = {n: random_array((2, 5, 8), seed=k) for k, n in enumerate("qkv")}
    assert_close(compiled(**feeds)[0], run_onnxruntime(attention_model(), feeds)[0], reduction=8)


def test_a_second_orchestration_builds_no_candidate_and_a_damaged_entry_is_chosen_anew(
        tmp_path, caplog):
    x = ops.input("x", "float32", [5, 13])
    h = x
    for _ in range(2):
        h = ops.layer_norm(ops.relu(h), ops.constant(random_array(13, seed=1)))
    graph = optimize(ops.graph([x], [h], "two_layers"))
    with override(cache_dir=tmp_path):
        first = orchestrate(graph, KernelMaker(host())).summary
        again = orchestrate(graph, KernelMaker(host())).summary
        assert again.candidates == 0 and again.objective == pytest.approx(first.objective)
        path = tmp_path / "orchestrate" / "costs.json"
        data = json.loads(path.read_text())
        for entry in data["parts"].values():
            if "kernels" in entry:
                entry["kernels"] = [[1 << 40, [[99, 0]]]]
        path.write_text(json.dumps(data))
        with caplog.at_level(logging.WARNING):
            done = orchestrate(graph, KernelMaker(host()))
    assert "does not fit its part" in caplog.text and done.summary.candidates > 0


def test_candidates_that_fail_are_skipped_with_a_warning(tmp_path, monkeypatch, caplog):
    from treadle.schedule import fusion
    real = fusion.fused_kernel

    def failing(plan, name, schedule):
        if len(plan.ops) > 2:
            raise fusion.FusionError("refused for the test")
        return real(plan, name, schedule)

    def crashing(functions, **kwargs):  # every other candidate crashes
        return [None if k % 2 else 1e-6 * (k + 1) for k in range(len(functions))]
    monkeypatch.setattr(fusion, "fused_kernel", failing)
    monkeypatch.setattr(orchestrator, "fused_kernel", failing)
    monkeypatch.setattr(cost_module, "measure_functions", crashing)
    model = attention_model(dim=4)
    with override(cache_dir=tmp_path), caplog.at_level(logging.WARNING):
        compiled = treadle.compile(model, orchestrate=True)
    assert "is skipped: refused for the test" in caplog.text
    skipped = [r.getMessage() for r in caplog.records if "is skipped" in r.getMessage()]
    assert len(skipped) == len(set(skipped))  # a reason shared by candidates is said once
    feeds = {n: random_array((2, 9, 4), seed=k) for k, n in enumerate("qkv")}
    assert_close(compiled(**feeds)[0], run_onnxruntime(model, feeds)[0], reduction=4)


def writes_cost(plans):
    """Writing a tensor costs much more than computing one: recomputing wins."""
    return [0.0 if p.is_view else 1.0 + 5.0 * len(p.outputs) + 0.1 * len(p.ops)
            for p in plans]


def given_costs(monkeypatch, costs):
    monkeypatch.setitem(kernel_plan.STRATEGIES, "orchestrate",
                        lambda graph, builder: orchestrated(graph, builder, costs))


def shared_exponential():
    """exp(x) read by two products, neither returning it."""
    x = ops.input("x", "float32", ["n", 24])
    w1, w2 = random_array((24, 16), seed=1), random_array((24, 8), seed=2)
    e = ops.op("Exp", x)
    return ops.graph([x], [ops.matmul(e, ops.constant(w1)), ops.matmul(e, ops.constant(w2))],
                     "shared_exponential"), (w1, w2)


@pytest.mark.parametrize("rows", [0, 1, 7, 61])
def test_a_value_is_recomputed_in_two_kernels_when_cheaper(monkeypatch, rows):
    graph, (w1, w2) = shared_exponential()
    plans = orchestrate(optimize(graph), KernelMaker(host()), measure=writes_cost).plans
    exp_plans = [p for p in plans if any(op.op_type == "Exp" for op in p.ops)]
    assert len(plans) == 2 and len(exp_plans) == 2  # exp inlined into both products
    given_costs(monkeypatch, writes_cost)
    model = compile_graph(graph, strategy="orchestrate")
    x = random_array((rows, 24), seed=3)
    y1, y2 = model(x)
    assert_close(y1, np.exp(x) @ w1, reduction=24)
    assert_close(y2, np.exp(x) @ w2, reduction=24)


@pytest.mark.parametrize("orchestrated_faster", [True, False])
def test_the_model_keeps_whichever_kernels_run_faster_in_it(monkeypatch, orchestrated_faster):
    """Static shapes: the orchestrated and the greedily fused model are timed against
    each other before one is kept, since kernels timed alone mislead."""
    x = ops.input("x", "float32", [7, 24])
    w1, w2 = random_array((24, 16), seed=1), random_array((24, 8), seed=2)
    e = ops.op("Exp", x)
    graph = ops.graph([x], [ops.matmul(e, ops.constant(w1)), ops.matmul(e, ops.constant(w2))],
                      "shared_exponential_7")
    given_costs(monkeypatch, writes_cost)
    timed = []

    def medians(runs, repeat, idle):
        timed.append(sorted(runs))
        return {"chosen": 1.0, "own": 2.0 if orchestrated_faster else 0.5}
    monkeypatch.setattr(orchestrator, "interleaved_medians", medians)
    model = compile_graph(graph, strategy="orchestrate")
    own = compile_graph(graph)
    assert timed == [["chosen", "own"]]
    assert (len(model.steps) != len(own.steps)) == orchestrated_faster
    xv = random_array((7, 24), seed=3)
    y1, y2 = model(xv)
    assert_close(y1, np.exp(xv) @ w1, reduction=24)
    assert_close(y2, np.exp(xv) @ w2, reduction=24)


@pytest.mark.parametrize("rows", [0, 1, 7, 61])
def test_one_kernel_writes_several_outputs(monkeypatch, rows):
    x = ops.input("x", "float32", ["n", 61])
    mean = ops.reduce_mean(x, [-1])
    graph = ops.graph([x], [mean, ops.sub(x, mean)], "mean_and_centred")
    plans = orchestrate(optimize(graph), KernelMaker(host()), measure=writes_cost).plans
    assert len(plans) == 1 and len(plans[0].outputs) == 2
    given_costs(monkeypatch, writes_cost)
    model = compile_graph(graph, strategy="orchestrate")
    xv = random_array((rows, 61), seed=rows)
    got_mean, got_centred = model(xv)
    assert_close(got_mean, xv.mean(axis=-1, keepdims=True), reduction=61)
    assert_close(got_centred, xv - xv.mean(axis=-1, keepdims=True), reduction=61)


def test_greedy_fusion_stays_when_nothing_beats_it():
    graph, _ = shared_exponential()
    graph = optimize(graph)

    def fusing_costs_more(plans):
        return [1.0 if len(p.ops) == 1 else 100.0 for p in plans]
    done = orchestrate(graph, KernelMaker(host()), measure=fusing_costs_more)
    assert done.graph is graph and not done.summary.orchestrated
    plans = done.plans
    assert [p.ops for p in plans] == [p.ops for p in kernel_plan.greedy(graph)]


def test_a_long_graph_is_solved_in_parts(monkeypatch, tmp_path):
    monkeypatch.setattr(orchestrator, "MAX_PART", 6)
    x = ops.input("x", "float32", ["n", 13])
    h = x
    for k in range(6):  # softmax, then a product: each layer's output is one tensor
        h = ops.matmul(ops.softmax(h), ops.constant(random_array((13, 13), seed=k)))
    graph = optimize(ops.graph([x], [h], "layers"))
    with override(dump_dir=tmp_path):
        summary = orchestrate(graph, KernelMaker(host()), measure=writes_cost).summary
    report = next(tmp_path.rglob("plan.txt")).read_text()
    assert report.count("part of") == summary.parts >= 3
    assert summary.primitives == 6 * 6 and summary.measured <= summary.candidates
    assert "greedy" in report and (next(tmp_path.rglob("primitives.txt")).read_text()
                                   .count("reduce") == 12)  # max and sum per softmax
    given_costs(monkeypatch, writes_cost)
    model = compile_graph(ops.graph([x], [h], "layers"), strategy="orchestrate")
    xv = random_array((7, 13), seed=9)
    want = xv
    for k in range(6):
        e = np.exp(want - want.max(axis=-1, keepdims=True))
        want = (e / e.sum(axis=-1, keepdims=True)) @ random_array((13, 13), seed=k)
    assert_close(model(xv)[0], want, reduction=13 * 6)


def test_without_scipy_the_error_names_the_extra(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "scipy.optimize", None)
    graph, _ = shared_exponential()
    with pytest.raises(ImportError, match=r"treadle\[orchestrate\]"):
        orchestrate(optimize(graph), KernelMaker(host()), measure=writes_cost)


@pytest.mark.parametrize("cost, chosen", [(0.98, False), (0.9, True)])
def test_the_whole_model_keeps_greedy_fusion_for_a_gain_within_noise(cost, chosen):
    """The primitives of a softmax measured at ``cost`` a kernel, the model's own Softmax
    at 1: a 2% gain keeps greedy fusion (measurements alone overstate it), 10% does not."""
    x = ops.input("x", "float32", ["n", 24])
    graph = optimize(ops.graph([x], [ops.softmax(x)], "softmax"))

    def costs(plans):
        return [1.0 if any(op.op_type == "Softmax" for op in p.ops) else cost for p in plans]
    done = orchestrate(graph, KernelMaker(host()), measure=costs)
    assert done.summary.orchestrated == chosen
    assert (done.graph is graph) != chosen
