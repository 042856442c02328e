"""Attention's common case rewritten as MatMul / Softmax / MatMul: which nodes are
rewritten, and the numbers against ONNX Runtime and against the node's own element-wise
definition (the rewrite switched off), at odd, prime, single and empty sizes."""
import collections

import numpy as np
import pytest

from tests.graph.ops.test_attention import inputs, reference, treadle_run
from tests.harness import assert_close, random_array
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.optimize import optimize
from treadle.graph.passes import canonicalize
from treadle.graph.tensor import Tensor

pytest.importorskip("onnxruntime")

NAMES = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")
OUTPUTS = ["Y", "present_key", "present_value", "qk_matmul_output"]


def op_types(shapes, attrs, dtypes=None, outputs=1) -> collections.Counter:
    dtypes = dtypes or ["float32"] * len(shapes)
    tensors = [None if s is None else Tensor(n, d, s) for n, s, d in zip(NAMES, shapes, dtypes)]
    y = apply("Attention", tensors, attrs, output_names=OUTPUTS[:outputs])
    graph = optimize(Graph.from_outputs([t for t in tensors if t is not None], y))
    return collections.Counter(node.op_type for node in graph.nodes)


REWRITTEN = [  # (Q, K, V[, mask] shapes, attributes[, dtypes])
    ([(2, 3, 7, 5), (2, 3, 11, 5), (2, 3, 11, 4)], {"scale": 0.3}),
    ([(2, 3, 7, 5)] * 3 + [(7, 7)], {"softmax_precision": 1}, ["float16"] * 4),
    ([(2, 3, 7, 5)] * 3, {"is_causal": 1}, ["bfloat16"] * 3),
    ([(1, 4, "s", 5), (1, 2, "s", 5), (1, 2, "s", 5), None, (1, 2, "p", 5), (1, 2, "p", 5)],
     {"is_causal": 1}, None, 3),  # a symbolic cache, and its present outputs
    ([(1, 6, "s", 5), (1, 3, "s", 5), (1, 3, "s", 5)], {"is_causal": 1}),  # grouped
    ([(2, "s", 30), (2, "t", 10), (2, "t", 4)], {"q_num_heads": 6, "kv_num_heads": 2}),
    ([(2, 3, 7, 5), (2, 3, 11, 5), (2, 3, 11, 5), (2, 1, 7, 11)], {"is_causal": 1}),
]
KEPT = [  # each outside the rewrite for one reason
    ([(2, 3, 7, 5)] * 3, {"softcap": 0.5}, None),
    ([(2, 3, 7, 5)] * 3, {}, None, 4),  # qk_matmul_output asked for
    ([(2, 3, 7, 5)] * 3, {"softmax_precision": 10}, None),  # float32 inputs, float16 softmax
    ([(2, 3, 7, 5)] * 3 + [(7, 7)], {}, ["float16"] * 3 + ["float32"]),  # mixed mask
    ([(2, 3, 7, 5)] * 3, {"left_window_size": 2}, None),
    ([(2, 3, 7, 5)] * 3 + [(7, 4)], {}, None),  # a mask narrower than the keys
    ([(2, 3, 7, 5)] * 3 + [None, None, None, (2,)], {}, ["float32"] * 6 + ["int64"]),
]


@pytest.mark.parametrize("case", REWRITTEN)
def test_common_case_becomes_two_products(case):
    ops = op_types(*case)
    assert "Attention" not in ops and ops["MatMul"] == 2 and ops["Softmax"] == 1, ops


@pytest.mark.parametrize("case", KEPT)
def test_other_cases_keep_the_node(case):
    assert op_types(*case)["Attention"] == 1


def composite_run(arrays, attrs, monkeypatch):
    """The node's own definition: the rewrite switched off."""
    with monkeypatch.context() as patch:
        patch.delitem(canonicalize.RULES, "Attention")
        return treadle_run(arrays, attrs)[0][0]


CASES = [  # (Q, K, V, mask shapes, attributes): odd, prime, single and empty sizes
    (((2, 3, 13, 5), (2, 3, 61, 5), (2, 3, 61, 7), None), {}),
    (((1, 1, 1, 8), (1, 1, 1, 8), (1, 1, 1, 8), None), {"is_causal": 1}),
    (((1, 6, 7, 5), (1, 2, 7, 5), (1, 2, 7, 5), (6, 7, 7)), {"is_causal": 1}),
    (((3, 7, 21), (3, 11, 7), (3, 11, 5), (3, 1, 7, 11)),
     {"q_num_heads": 3, "kv_num_heads": 1, "scale": 0.7}),
    (((2, 3, 0, 5), (2, 3, 5, 5), (2, 3, 5, 5), None), {}),
]


@pytest.mark.parametrize("shapes,attrs", CASES)
def test_rewrite_matches_ort_and_the_definition(shapes, attrs, monkeypatch):
    arrays = inputs(*shapes[:3], mask=shapes[3])
    got = treadle_run(arrays, attrs)[0][0]
    assert_close(got, composite_run(arrays, attrs, monkeypatch), reduction=shapes[2][-2],
                 context=f"{shapes} against the definition")
    if 0 not in shapes[0]:
        assert_close(got, reference(arrays, attrs)[0], reduction=shapes[2][-2],
                     context=f"{shapes} against ONNX Runtime")


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_query_with_every_key_masked_gives_zeros(kind, monkeypatch):
    arrays = inputs((2, 3, 7, 5), (2, 3, 9, 5), (2, 3, 9, 5))
    keep = np.random.default_rng(2).random((2, 1, 7, 9)) < 0.5
    keep[0, 0, 3] = False  # batch 0, query 3: nothing to attend
    keep[1, 0, :, 0] = True
    keep[0, 0, [0, 1, 2, 4, 5, 6], 0] = True
    arrays[3] = keep if kind == "bool" else np.where(keep, random_array(keep.shape, seed=5),
                                                     -np.inf).astype(np.float32)
    for attrs in ({}, {"is_causal": 1}):
        got = treadle_run(arrays, attrs)[0][0]
        assert np.isfinite(got).all() and np.all(got[0, :, 3] == 0)
        assert_close(got, composite_run(arrays, attrs, monkeypatch), reduction=9,
                     context=f"{kind} mask {attrs}")


def test_symbolic_grouped_three_d_with_mask():
    """Compiled once with symbolic query and key lengths, run at 1, 7 and 61."""
    attrs = {"q_num_heads": 4, "kv_num_heads": 2}
    shapes = [(2, "s", 20), (2, "t", 10), (2, "t", 6), (2, 1, "s", "t")]
    runs = [inputs((2, m, 20), (2, n, 10), (2, n, 6), mask=(2, 1, m, n), seed=m)
            for m, n in ((7, 5), (1, 1), (61, 13))]
    got = treadle_run(runs[0], attrs, shapes=shapes + [None] * 3, calls=runs[1:])
    for arrays, y in zip(runs, got):
        assert_close(y[0], reference(arrays, attrs)[0], reduction=arrays[2].shape[1],
                     context=f"queries {arrays[0].shape[1]}, keys {arrays[1].shape[1]}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_matches_the_definition(dtype, monkeypatch):
    """Each step rounds to the inputs' type as the definition's does (the reference
    evaluator has no bfloat16 Attention; the definition is checked against it in
    float16 by the operator's tests)."""
    arrays = inputs((2, 3, 7, 5), (2, 1, 9, 5), (2, 1, 9, 5), mask=(2, 1, 7, 9), dtype=dtype)
    half = np.dtype(dtype)  # bfloat16 results are raw bits: seen as ml_dtypes' bfloat16
    for attrs in ({"is_causal": 1}, {"softmax_precision": 1, "scale": 0.4}):
        got, want = (a.view(half) for a in (treadle_run(arrays, attrs)[0][0],
                                             composite_run(arrays, attrs, monkeypatch)))
        assert_close(got, want, reduction=9, context=f"{dtype} {attrs}")


@pytest.mark.parametrize("attrs", [{"is_causal": 1}, {"q_num_heads": 4, "kv_num_heads": 2}])
def test_cache_of_any_length(attrs):
    """Compiled once with symbolic new and past lengths (a decoder's KV cache), run with
    no past, one key of past and a long one; the present outputs are the concatenations."""
    three_d = "q_num_heads" in attrs
    def shapes(m, past):
        if three_d:
            return [(2, m, 20), (2, m, 10), (2, m, 12), None, (2, 2, past, 5), (2, 2, past, 6)]
        return [(2, 4, m, 5), (2, 2, m, 5), (2, 2, m, 6), None, (2, 2, past, 5),
                (2, 2, past, 6)]
    runs = []
    for m, past in ((7, 0), (1, 1), (3, 29)):
        arrays = [None if s is None else random_array(s, seed=k + m + past)
                  for k, s in enumerate(shapes(m, past))]
        runs.append(arrays)
    got = treadle_run(runs[0], attrs, num_outputs=3, shapes=shapes("m", "p"),
                      calls=runs[1:])
    for arrays, outputs in zip(runs, got):
        for k, (a, e) in enumerate(zip(outputs, reference(arrays, attrs, num_outputs=3))):
            assert_close(a, e, reduction=arrays[4].shape[2] + arrays[1].shape[-2],
                         context=f"{arrays[0].shape} past {arrays[4].shape[2]} output {k}")
