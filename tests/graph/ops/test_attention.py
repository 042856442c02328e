"""The Attention operator against ONNX Runtime (one-node opset-23 models), and against
onnx's reference evaluator where ONNX Runtime has no kernel for the feature (nonpad
lengths, fully masked rows). Sizes are odd on purpose: 3 heads, 7 queries, head size 5."""
import numpy as np
import pytest

from tests.harness import assert_close, random_array, run_onnxruntime
from treadle.compiler import compile_graph
from treadle.errors import ShapeError
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.tensor import Tensor

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

INPUTS = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")
OUTPUTS = ("Y", "present_key", "present_value", "qk_matmul_output")


def _model(arrays, attrs, num_outputs, opset):
    names = [n if a is not None else "" for n, a in zip(INPUTS, arrays)]
    values = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for n, a in zip(INPUTS, arrays) if a is not None]
    outs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(arrays[0].dtype),
                                          None) for n in OUTPUTS[:num_outputs]]
    node = helper.make_node("Attention", names, list(OUTPUTS[:num_outputs]), **attrs)
    graph = helper.make_graph([node], "g", values, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=10)


def reference(arrays, attrs, num_outputs=1, opset=23, runtime="ort"):
    model = _model(arrays, attrs, num_outputs, opset)
    feeds = {n: a for n, a in zip(INPUTS, arrays) if a is not None}
    if runtime == "ort":
        return run_onnxruntime(model, feeds)
    return ReferenceEvaluator(model).run(None, feeds)


def treadle_run(arrays, attrs, num_outputs=1, shapes=None, calls=None):
    """Compiles one Attention node (input shapes ``shapes``, default the arrays' own,
    strings for symbolic sizes) and runs it on ``arrays`` and on each of ``calls``."""
    shapes = shapes or [None if a is None else a.shape for a in arrays]
    tensors = [None if a is None else Tensor(n, a.dtype.name, s)
               for n, a, s in zip(INPUTS, arrays, shapes)]
    outputs = apply("Attention", tensors, attrs, output_names=list(OUTPUTS[:num_outputs]))
    graph = Graph.from_outputs([t for t in tensors if t is not None], outputs[:num_outputs])
    fn = compile_graph(graph)
    return [fn(*[a for a in args if a is not None]) for args in [arrays, *(calls or [])]]


def inputs(q, k, v, mask=None, past=None, dtype="float32", seed=0):
    """Random Q, K, V (and a float mask, past key/value) of the given shapes."""
    arrays = [random_array(s, dtype, seed=seed + j) for j, s in enumerate((q, k, v))]
    arrays.append(None if mask is None else random_array(mask, dtype, seed=seed + 3))
    for j, s in enumerate(past or (None, None)):
        arrays.append(None if s is None else random_array(s, dtype, seed=seed + 4 + j))
    return arrays


def check(arrays, attrs, num_outputs=1, runtime="ort", opset=23, context=""):
    expected = reference(arrays, attrs, num_outputs, opset, runtime)
    actual = treadle_run(arrays, attrs, num_outputs)[0]
    for k, (a, e) in enumerate(zip(actual, expected)):
        assert_close(a, e, reduction=arrays[2].shape[-2],
                     context=f"{context} {attrs} output {OUTPUTS[k]}")


CASES = [  # (Q, K, V shapes, attributes)
    (((2, 3, 7, 5), (2, 3, 7, 5), (2, 3, 7, 5)), {}),
    (((2, 3, 7, 5), (2, 3, 11, 5), (2, 3, 11, 4)), {"scale": 0.3}),  # cross, v head 4
    (((1, 6, 7, 5), (1, 3, 7, 5), (1, 3, 7, 5)), {}),  # grouped-query: 2 per kv head
    (((2, 3, 7, 5), (2, 1, 7, 5), (2, 1, 7, 3)), {"is_causal": 1}),  # multi-query
    (((2, 7, 15), (2, 7, 15), (2, 7, 15)), {"q_num_heads": 3, "kv_num_heads": 3}),
    (((2, 7, 30), (2, 9, 10), (2, 9, 4)), {"q_num_heads": 6, "kv_num_heads": 2,
                                           "is_causal": 1}),
    (((2, 3, 7, 5), (2, 3, 7, 5), (2, 3, 7, 5)), {"softcap": 0.5}),
]


@pytest.mark.parametrize("shapes,attrs", CASES)
def test_attention_against_ort(shapes, attrs):
    check(inputs(*shapes), attrs, context=str(shapes))


@pytest.mark.parametrize("mask", [(7, 11), (3, 7, 11), (2, 1, 7, 11), (2, 3, 7, 11)])
def test_float_mask_broadcasts(mask):
    arrays = inputs((2, 3, 7, 5), (2, 3, 11, 5), (2, 3, 11, 5), mask=mask)
    check(arrays, {}, context=f"mask {mask}")
    check(arrays, {"is_causal": 1}, context=f"mask {mask}")


def test_bool_mask():
    arrays = inputs((2, 3, 7, 5), (2, 3, 11, 5), (2, 3, 11, 5))
    keep = np.random.default_rng(1).random((2, 1, 7, 11)) < 0.6
    keep[..., 0] = True  # every row keeps a key (ONNX Runtime gives NaN for none)
    arrays[3] = keep
    check(arrays, {}, context="bool mask")
    check(arrays, {"is_causal": 1}, context="bool mask, causal")


def test_past_key_value_and_present():
    # Past of 4 keys; the causal frontier is offset by it (bottom-right alignment).
    arrays = inputs((2, 3, 7, 5), (2, 1, 7, 5), (2, 1, 7, 6), mask=(7, 11),
                    past=((2, 1, 4, 5), (2, 1, 4, 6)))
    check(arrays, {}, num_outputs=3, context="past")
    check(arrays, {"is_causal": 1}, num_outputs=3, context="past, causal")
    three_d = inputs((2, 7, 15), (2, 7, 5), (2, 7, 6), mask=(7, 11),
                     past=((2, 1, 4, 5), (2, 1, 4, 6)))
    check(three_d, {"q_num_heads": 3, "kv_num_heads": 1}, num_outputs=3, context="3-D past")


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_qk_matmul_output(mode):
    arrays = inputs((2, 3, 7, 5), (2, 3, 9, 5), (2, 3, 9, 5), mask=(7, 9))
    attrs = {"qk_matmul_output_mode": mode, **({"softcap": 2.0} if mode == 1 else {})}
    check(arrays, attrs, num_outputs=4, runtime="reference", context=f"mode {mode}")


def test_float16_rounds_like_the_reference():
    arrays = inputs((2, 3, 7, 5), (2, 3, 9, 5), (2, 3, 9, 5), mask=(7, 9), dtype="float16")
    check(arrays, {"is_causal": 1}, runtime="reference", context="float16")
    check(arrays, {"softmax_precision": 1}, runtime="reference", context="float16 in float32")


def test_symbolic_sequence_length():
    """One compiled kernel for any sequence length, self-attention and causal."""
    attrs = {"is_causal": 1}
    shape = (2, 3, "s", 5)
    runs = [inputs(*[(2, 3, s, 5)] * 3, seed=s) for s in (7, 1, 13)]
    actual = treadle_run(runs[0], attrs, shapes=[shape] * 3 + [None] * 4, calls=runs[1:])
    for arrays, got in zip(runs, actual):
        assert_close(got[0], reference(arrays, attrs)[0], reduction=arrays[2].shape[-2],
                     context=f"seq {arrays[0].shape[2]}")


def test_nonpad_kv_seqlen_and_fully_masked_rows():
    """Opset 24's external cache: keys past each batch's length are padding and the causal
    frontier ends at it; a query row left with no key gives zeros, not NaN."""
    arrays = inputs((3, 2, 4, 5), (3, 2, 9, 5), (3, 2, 9, 5))
    arrays.append(np.array([9, 5, 2], dtype=np.int64))  # batch 2: rows 0, 1 see no key
    check(arrays, {"is_causal": 1}, runtime="reference", opset=24, context="nonpad")
    y = treadle_run(arrays, {"is_causal": 1})[0][0]
    assert np.all(y[2, :, :2] == 0) and np.isfinite(y).all()


@pytest.mark.parametrize("attrs", [{"is_causal": 1, "left_window_size": 2},
                                   {"left_window_size": 1, "right_window_size": 3}])
def test_sliding_window(attrs):
    arrays = inputs((2, 3, 7, 5), (2, 3, 7, 5), (2, 3, 7, 5), mask=(7, 7),
                    past=((2, 3, 4, 5), (2, 3, 4, 5)))
    arrays[1:3] = [random_array((2, 3, 3, 5), seed=s) for s in (8, 9)]  # 4 past + 3 new
    arrays[3] = random_array((7, 7), seed=10)
    check(arrays, attrs, num_outputs=3, runtime="reference", opset=25, context="window")


def test_three_d_needs_head_counts():
    q = Tensor("q", "float32", [2, 7, 15])
    with pytest.raises(ShapeError, match="attention_x.*q_num_heads"):
        apply("Attention", [q, q, q], {}, name="attention_x")
