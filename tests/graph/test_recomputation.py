"""Fusion never recomputes a chain: unrolled recurrences, values read several times, long
concatenations. The generated loop work (trip counts times the statements and operations
in them) must grow linearly with the length of the chain, and the numbers match numpy or
PyTorch."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import treadle
from bench.unrolled import exported, recurrence, state_space
from treadle.graph.partition import MAX_RECOMPUTATION, recomputation
from treadle.ir.expr import Const, Select
from treadle.ir.functor import children
from treadle.ir.stmt import For, If
from treadle import ops

WIDTH = 1031  # a prime: no vector width divides it


def _work(node) -> int:
    """At most how many operations the statement runs: each node of a loop's body counts
    once per trip (a loop of symbolic extent counts once); of an if's or a select's
    branches, the costlier."""
    if isinstance(node, For):
        trips = node.extent.value if isinstance(node.extent, Const) else 1
        return trips * _work(node.body)
    if isinstance(node, (If, Select)):
        branches = [b for b in (node.then, node.otherwise) if b is not None]
        return 1 + _work(node.cond) + max(_work(b) for b in branches)
    return 1 + sum(_work(child) for child in children(node))


def model_work(compiled) -> int:
    return sum(_work(step.kernel.function.body) for step in compiled.executable.steps
               if step.kernel is not None)


@pytest.mark.parametrize("stacked", [True, False])
def test_recurrence_work_grows_linearly_with_its_steps(stacked):
    x = np.random.default_rng(0).standard_normal(WIDTH).astype(np.float32)
    work = {}
    for steps in (16, 32, 64):
        model, reference = recurrence(steps, WIDTH, stacked)
        compiled = treadle.compile(model)
        np.testing.assert_allclose(compiled(x)[0], reference(x), rtol=1e-5, atol=1e-5)
        work[steps] = model_work(compiled)
    # Each step is one multiply-add per element, plus its copy into the concatenation;
    # concatenated along the innermost axis, each element picks its input by a tree of
    # selects, log2(steps) deep. Recomputing the chain would quadruple the work.
    growth = 2.2 if stacked else 2.5
    assert work[32] <= growth * work[16] and work[64] <= growth * work[32], work


def _squaring_chain(steps: int, n: int = 37):
    """``h = h * h + h`` ``steps`` times, then a product: every state is read twice, so
    inlined into the product's packing step t would be computed 2^t times."""
    nodes, prev = [], "x"
    for t in range(steps):
        nodes += [helper.make_node("Mul", [prev, prev], [f"m{t}"]),
                  helper.make_node("Add", [f"m{t}", prev], [f"h{t}"])]
        prev = f"h{t}"
    w = (np.random.default_rng(1).standard_normal((n, 5)) * 0.1).astype(np.float32)
    nodes.append(helper.make_node("MatMul", [prev, "w"], ["y"]))
    graph = helper.make_graph(nodes, "squares",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    def reference(x):
        for _ in range(steps):
            x = x * x + x
        return x @ w
    return model, reference


def test_a_value_read_twice_is_not_inlined_exponentially():
    x = (np.random.default_rng(2).standard_normal((3, 37)) * 0.05).astype(np.float32)
    work = {}
    for steps in (4, 12):
        model, reference = _squaring_chain(steps)
        compiled = treadle.compile(model)
        np.testing.assert_allclose(compiled(x)[0], reference(x), rtol=1e-4, atol=1e-6)
        work[steps] = model_work(compiled)
    assert work[12] <= 4 * work[4], work


def test_recomputation_counts_every_path_to_a_reader():
    x = ops.input("x", "float32", [7])
    chain, value = [], x
    for _ in range(5):
        squared = ops.op("Mul", value, value)
        value = ops.op("Add", squared, value)
        chain += [squared.producer, value.producer]
    total = ops.op("ReduceSum", value, keepdims=0)
    # Step t's values run 2^(5-t) times inlined: far past the bound.
    assert recomputation(chain, [total.producer]) > MAX_RECOMPUTATION
    # A plain chain, each value read once, runs once.
    y = ops.op("Relu", x)
    z = ops.op("Neg", y)
    s = ops.op("ReduceSum", z, keepdims=0)
    assert recomputation([y.producer, z.producer], [s.producer]) == 1.0


@pytest.mark.parametrize("count,axis", [(1, 0), (2, 1), (37, 0), (64, 1), (300, 0)])
def test_long_concatenations(count, axis):
    rng = np.random.default_rng(count)
    parts = [rng.standard_normal((3, k % 5 + 1) if axis else (k % 5 + 1, 3))
             .astype(np.float32) for k in range(count)]
    names = [f"p{k}" for k in range(count)]
    graph = helper.make_graph(
        [helper.make_node("Concat", names, ["y"], axis=axis)], "concat",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, p.shape)
         for n, p in zip(names, parts)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    compiled = treadle.compile(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]))
    np.testing.assert_array_equal(compiled(*parts)[0], np.concatenate(parts, axis))


def test_state_space_model_work_grows_linearly_with_its_steps():
    """A 4-layer Mamba-style model whose selective scan the TorchScript exporter unrolled
    (per step: Gathers of the step's inputs, the state update, a ReduceSum for y_t; all
    steps stacked at the end)."""
    torch.manual_seed(0)
    module = state_space(layers=4, width=16, state=4)
    work = {}
    for steps in (8, 16):
        u = torch.randn(1, steps, 16)
        compiled = treadle.compile(exported(module, u))
        with torch.no_grad():
            expected = module(u).numpy()
        np.testing.assert_allclose(compiled(u.numpy())[0], expected, rtol=1e-4, atol=1e-4)
        work[steps] = model_work(compiled)
    # The projections and each step's kernels double with the steps; a state recomputed
    # from the first step wherever it is read makes it about 3x.
    assert work[16] <= 2.3 * work[8], work
