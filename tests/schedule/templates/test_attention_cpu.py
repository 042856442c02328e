"""The fused attention kernel (both products and the softmax in one kernel), as the
orchestrator builds it from primitives, against numpy: odd and prime sizes of queries,
keys, depth and value columns, scales and masks, with the transposes around it fused in;
and where it is not built (a value inside read outside it, symbolic sizes)."""
from dataclasses import replace

import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle import ops
from treadle.compiler import compile_graph
from treadle.graph import kernel_plan
from treadle.graph.optimize import optimize
from treadle.graph.passes.fission import fission
from treadle.orchestrate import orchestrate
from treadle.orchestrate.primitives import PrimitiveGraph, attention_core
from treadle.orchestrate.primitives import kernel_plan as kernel_plan_of
from treadle.runtime.build import compile_function
from treadle.schedule.templates.attention_cpu import schedule_attention
from treadle.target.cpu import host
from treadle.tune.kernel import KernelMaker


def fused_first(plans):
    """The fused attention costs nothing, every other kernel by its operators: the
    program takes the attention kernel wherever one is a candidate."""
    return [0.0 if p.is_view else 1e-6 if p.anchor.op_type == "FusedAttention"
            else 1.0 * len(p.ops) for p in plans]


def compile_fused(monkeypatch, graph):
    """The model with the kernels orchestration chose (never swapped for greedy fusion
    by timing both), and those kernels."""
    def chosen(g, builder):
        done = orchestrate(g, builder.maker, measure=fused_first)
        return builder.executable(done.graph, done.plans)
    monkeypatch.setitem(kernel_plan.STRATEGIES, "orchestrate", chosen)
    model = compile_graph(graph, strategy="orchestrate")
    fused = [s for s in model.steps if s.name.endswith("+attention")]
    plans = orchestrate(optimize(graph), KernelMaker(host()), measure=fused_first).plans
    return model, plans, fused


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attention_graph(heads, queries, keys, depth, columns, mask: bool):
    """softmax(q kᵀ / sqrt(depth) [+ mask]) v, with q, k and v read through transposes
    of token-major inputs, as exported models give them."""
    q = ops.input("q", "float32", [queries, heads, depth])
    k = ops.input("k", "float32", [keys, heads, depth])
    v = ops.input("v", "float32", [keys, heads, columns])
    scores = ops.matmul(ops.transpose(q, [1, 0, 2]), ops.transpose(k, [1, 2, 0]))
    scores = ops.mul(scores, ops.constant(np.float32(depth ** -0.5)))
    inputs = [q, k, v]
    if mask:
        m = ops.input("mask", "float32", [1, 1, keys])
        scores = ops.add(scores, m)
        inputs.append(m)
    out = ops.matmul(ops.softmax(scores), ops.transpose(v, [1, 0, 2]))
    return ops.graph(inputs, [ops.transpose(out, [1, 0, 2])], "attention")


@pytest.mark.parametrize("heads,queries,keys,depth,columns", [
    (2, 1, 1, 8, 8), (2, 0, 13, 8, 8), (3, 7, 13, 5, 9), (1, 61, 97, 64, 32), (2, 97, 61, 40, 17),
    (1, 127, 128, 16, 64), (2, 13, 200, 32, 80)])
@pytest.mark.parametrize("mask", [False, True])
def test_the_fused_kernel_matches_numpy(monkeypatch, heads, queries, keys, depth, columns,
                                        mask):
    graph = attention_graph(heads, queries, keys, depth, columns, mask)
    model, plans, fused = compile_fused(monkeypatch, graph)
    assert [p.anchor.op_type for p in plans].count("FusedAttention") == len(fused) == 1
    q = random_array((queries, heads, depth), seed=1)
    k = random_array((keys, heads, depth), seed=2)
    v = random_array((keys, heads, columns), seed=3)
    feeds = [q, k, v]
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(depth)
    if mask:
        m = np.where(np.arange(keys) % 3 == 1, -np.inf, 0).astype(np.float32)
        m[0] = 0.0  # every row keeps a key
        scores = scores + m
        feeds.append(m.reshape(1, 1, keys))
    want = np.einsum("hqk,khc->qhc", softmax(scores), v).astype(np.float32)
    (got,) = model(*feeds)
    assert_close(got, want, reduction=max(depth, keys))


def test_a_probability_read_outside_keeps_the_kernels_apart():
    q = ops.input("q", "float32", [2, 7, 8])
    k = ops.input("k", "float32", [2, 8, 11])
    v = ops.input("v", "float32", [2, 11, 8])
    p = ops.softmax(ops.matmul(q, k))
    graph = optimize(ops.graph([q, k, v], [ops.matmul(p, v), p], "returns_probabilities"))
    pg = PrimitiveGraph.of(fission(graph), host())
    assert not any(attention_core(pg, k) for k in range(len(pg.ops)))
    core_graph = optimize(ops.graph([q, k, v], [ops.matmul(p, v)], "attention"))
    pg = PrimitiveGraph.of(fission(core_graph), host())
    assert sum(attention_core(pg, k) is not None for k in range(len(pg.ops))) == 1


@pytest.mark.parametrize("queries", [1, 7, 61])
def test_symbolic_sizes_run_as_separate_kernels(monkeypatch, queries):
    q = ops.input("q", "float32", [2, "seq", 8])
    k = ops.input("k", "float32", [2, 8, "seq"])
    v = ops.input("v", "float32", [2, "seq", 8])
    graph = ops.graph([q, k, v], [ops.matmul(ops.softmax(ops.matmul(q, k)), v)], "symbolic")
    model, plans, fused = compile_fused(monkeypatch, graph)
    assert "FusedAttention" not in [p.anchor.op_type for p in plans] and not fused
    qv, kv, vv = (random_array(s, seed=n) for n, s in
                  enumerate([(2, queries, 8), (2, 8, queries), (2, queries, 8)]))
    assert_close(model(qv, kv, vv)[0], (softmax(qv @ kv) @ vv).astype(np.float32),
                 reduction=8)


WIDE = ("avx2", "fma", "avx512f", "avx512vl")


@pytest.mark.parametrize("features,registers", [(("avx2", "fma"), 16), (WIDE, 32)])
def test_the_register_tile_of_each_target_matches_numpy(features, registers):
    """AVX2's 16 registers of 8 floats and AVX-512's 32 of 16, whichever this CPU has."""
    if not set(features) <= set(host().features):
        pytest.skip(f"this CPU lacks {sorted(set(features) - set(host().features))}")
    q = ops.input("q", "float32", [2, 13, 7])
    k = ops.input("k", "float32", [2, 7, 29])
    v = ops.input("v", "float32", [2, 29, 11])
    out = ops.matmul(ops.softmax(ops.matmul(q, k)), v)
    pg = PrimitiveGraph.of(fission(optimize(ops.graph([q, k, v], [out], "attention"))), host())
    core = next(c for p in range(len(pg.ops)) if (c := attention_core(pg, p)) is not None)
    plan = kernel_plan_of(pg, core, pg.graph.outputs)
    target = replace(host(), features=features, vector_registers=registers)
    kernel = schedule_attention(plan.anchor, "attention", target)
    arrays = {t.name: random_array(tuple(t.shape), seed=n) for n, t in enumerate([q, k, v])}
    inputs = [arrays[plan.anchor.inputs[i].name] for i in kernel.inputs]
    got = np.empty((2, 13, 11), np.float32)
    scratch = [np.empty([d.value for d in w.shape], np.float32) for w in kernel.workspaces]
    compile_function(kernel.function)(*inputs, got, *scratch)
    want = softmax(arrays["q"] @ arrays["k"]) @ arrays["v"]
    assert_close(got, want.astype(np.float32), reduction=29)


@pytest.mark.parametrize("attrs", [{}, {"is_causal": 1}])
def test_an_attention_node_with_a_closed_row_runs_fused(monkeypatch, attrs):
    """ONNX's Attention (what torch's exporter and frontend write for sdpa) with a boolean
    mask that leaves one query nothing to attend: zeros there, ONNX Runtime elsewhere."""
    from tests.graph.ops.test_attention import INPUTS, inputs, reference
    from treadle.graph.graph import Graph
    from treadle.graph.operator import apply
    from treadle.graph.tensor import Tensor
    pytest.importorskip("onnxruntime")
    arrays = inputs((2, 3, 7, 5), (2, 3, 9, 5), (2, 3, 9, 5))[:3]
    keep = np.random.default_rng(2).random((2, 1, 7, 9)) < 0.5
    keep[..., 0] = True
    keep[0, 0, 3] = False  # batch 0, query 3: every key masked
    arrays.append(keep)
    tensors = [Tensor(n, a.dtype.name, a.shape) for n, a in zip(INPUTS, arrays)]
    graph = Graph.from_outputs(tensors, apply("Attention", tensors, attrs))
    model, plans, fused = compile_fused(monkeypatch, graph)
    assert "FusedAttention" in [p.anchor.op_type for p in plans] and fused
    (got,) = model(*arrays)
    assert np.all(got[0, :, 3] == 0)
    want = reference(arrays, attrs)[0]
    open_rows = np.ones(7, bool)
    open_rows[3] = False
    assert_close(got[1], want[1], reduction=9)
    assert_close(got[0][:, open_rows], want[0][:, open_rows], reduction=9)


def test_a_saved_model_keeps_the_fused_kernel(monkeypatch, tmp_path):
    import treadle
    from treadle.api import CompiledModel
    graph = attention_graph(2, 7, 13, 8, 8, mask=False)
    model, _, fused = compile_fused(monkeypatch, graph)
    CompiledModel(model, "attention").save(tmp_path / "attention")
    loaded = treadle.load(tmp_path / "attention")
    assert fused and [s.name for s in loaded.executable.steps] == [s.name for s in model.steps]
    feeds = [random_array(s, seed=n) for n, s in enumerate([(7, 2, 8), (13, 2, 8), (13, 2, 8)])]
    np.testing.assert_array_equal(loaded(*feeds)[0], model(*feeds)[0])
