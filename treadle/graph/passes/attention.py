"""The ONNX Attention node as the products and softmax it is made of.

Attention (opset 23 on; torch's dynamo exporter writes one for every
``scaled_dot_product_attention``, and treadle's torch frontend lowers that call to it) has
one definition, ``graph.ops.attention``, which computes everything element by element: a
rule-based kernel, 20-25x slower at BERT's and Segformer's sizes than the same attention
as MatMul, Softmax and MatMul, whose products run on the matmul template and whose scale
and mask fuse into the first product's stores.

The common case becomes those operators:

    K = past_key ++ K       along the sequence, when there is a past (V alike); these
                            are the present_key and present_value outputs
    S = Q Kᵀ · scale        K's heads repeated for grouped-query attention (half
                            precision: Q·√scale times (K·√scale)ᵀ)
    S = S + bias            the float mask, or 0 / -inf from a boolean mask and the
                            causal frontier (key j <= query i + the past's length)
    Y = softmax(S) V        a row whose bias is -inf everywhere gives zeros

That case is a float32, float16 or bfloat16 node without the qk_matmul_output output,
``nonpad_kv_seqlen``, softcap or sliding window, and with a mask as wide as the keys; any
other node is left to its definition. Every step rounds to the inputs' type, as the
definition does, and the softmax runs in float32 when ``softmax_precision`` asks for it.
In float32 the product is scaled once, which differs from scaling Q and K by the root of
the scale each in the last bit; in float16 and bfloat16 a last bit is 1e-3 or more of the
value (ONNX's own cases missed their tolerance), so there Q and K are scaled as the spec
does.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from treadle.graph.operator import Operator
from treadle.graph.ops.common import ONNX_DTYPES
from treadle.graph.ops.shape import dims_tensor
from treadle.graph.passes.fission import Primitives
from treadle.graph.tensor import Tensor, normalize_dim
from treadle.ir import dtypes
from treadle.ir.expr import as_expr

_FLOATS = (dtypes.float32, dtypes.float16, dtypes.bfloat16)


def decompose_attention(node: Operator, inputs: list, readers=None
                        ) -> Optional[Sequence[Tensor]]:
    """The node as MatMul / Softmax / MatMul, or None where it keeps its definition."""
    heads = _plain_heads(node, inputs)
    if heads is None:
        return None
    hq, hkv = heads
    p = Primitives(node)
    q, k, v = (_four_d(p, t, h, what) for t, h, what in
               ((inputs[0], hq, "q"), (inputs[1], hkv, "k"), (inputs[2], hkv, "v")))
    past = _input(inputs, 4) is not None
    if past:
        present = [p.op("Concat", [inputs[4], k], "present_key", axis=2),
                   p.op("Concat", [inputs[5], v], "present_value", axis=2)]
        # Kᵀ from the parts: a transposition of the concatenation became its epilogue,
        # storing across pages (one query, 12 heads of 511 keys: the attention took
        # 2.4 ms, 0.9 ms this way, as long as the node's own kernel).
        k_t = p.op("Concat", [_transposed(p, inputs[4], "past_t"), _transposed(p, k, "new_t")],
                   "k_t", axis=3)
    else:
        present, k_t = [k, v], _transposed(p, k, "k_t")
    v = present[1]
    if hq != hkv:
        k_t, v = _repeat_heads(p, k_t, hq // hkv, "k"), _repeat_heads(p, v, hq // hkv, "v")
    scale = node.attrs.get("scale")
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    if q.dtype == dtypes.float32:
        scores = p.op("MatMul", [q, k_t], "qk")
        scores = p.op("Mul", [scores, p.constant(scale, q.dtype, "scale")], "scaled")
    else:  # the spec's rounding: Q and K times √scale, each rounded to the inputs' type
        root = p.constant(math.sqrt(scale), q.dtype, "root")
        scores = p.op("MatMul", [p.op("Mul", [q, root], "q_scaled"),
                                 p.op("Mul", [k_t, root], "k_scaled")], "scaled")
    mask = _input(inputs, 3)
    offset = inputs[4].shape[2] if past else 0  # keys before the query block
    bias = _bias(p, mask, bool(node.attrs.get("is_causal", 0)), offset, q.shape[2],
                 k_t.shape[3], q.dtype)
    if bias is not None:
        scores = p.op("Add", [scores, bias], "biased")
    precision = _softmax_dtype(node, q.dtype)
    probs = p.op("Softmax", [p.cast(scores, precision, "logits")], "softmax", axis=-1)
    probs = p.cast(probs, q.dtype, "probs_rounded")
    y = p.op("MatMul", [probs, v], "pv")
    if mask is not None:
        y = _zero_masked_rows(p, y, bias)
    if inputs[0].rank == 3:
        y = p.op("Transpose", [y], "y_t", perm=[0, 2, 1, 3])
        y = p.op("Reshape", [y, p.shape([0, 0, hq * v.shape[3]], "y_shape")], "y")
    return [y, *present][:len(node.outputs)]


def _input(inputs: list, index: int) -> Optional[Tensor]:
    return inputs[index] if len(inputs) > index else None


def _plain_heads(node: Operator, inputs: list) -> Optional[tuple[int, int]]:
    """(query heads, key heads) when the rewrite applies to ``node``, else None."""
    q, k, v = (_input(inputs, i) for i in range(3))
    a = node.attrs
    if (len(node.outputs) not in (1, 3) or q is None or k is None or v is None
            or _input(inputs, 6) is not None or not _plain_past(inputs, q.dtype)
            or float(a.get("softcap", 0.0)) != 0.0
            or int(a.get("left_window_size", -1)) != -1
            or int(a.get("right_window_size", -1)) != -1
            or q.dtype not in _FLOATS or k.dtype != q.dtype or v.dtype != q.dtype
            or _softmax_dtype(node, q.dtype) not in (q.dtype, dtypes.float32)
            or not q.rank == k.rank == v.rank or q.rank not in (3, 4)):
        return None
    if q.rank == 4:
        hq, hkv = normalize_dim(q.shape[1]), normalize_dim(k.shape[1])
        if normalize_dim(v.shape[1]) != hkv:
            return None
    else:
        hq, hkv = a.get("q_num_heads"), a.get("kv_num_heads")
        if not isinstance(hq, int) or not isinstance(hkv, int) or hq < 1 or hkv < 1 \
                or not all(_divides(h, t.shape[2]) for h, t in ((hq, q), (hkv, k), (hkv, v))):
            return None
    if not isinstance(hq, int) or not isinstance(hkv, int) or hq % hkv:
        return None
    if not _same_head_size(q, k, hq, hkv) or not _plain_mask(inputs, k):
        return None
    return hq, hkv


def _plain_past(inputs: list, dtype) -> bool:
    """No past key and value, or both, 4-D, of the inputs' type."""
    past = [_input(inputs, 4), _input(inputs, 5)]
    if past == [None, None]:
        return True
    return all(t is not None and t.rank == 4 and t.dtype == dtype for t in past)


def _softmax_dtype(node: Operator, dtype):
    """The type the softmax runs in: ``softmax_precision``'s, by default the inputs'."""
    code = node.attrs.get("softmax_precision")
    return dtype if code is None else ONNX_DTYPES.get(int(code))


def _divides(heads: int, hidden) -> bool:
    hidden = normalize_dim(hidden)
    return isinstance(hidden, int) and hidden % heads == 0


def _same_head_size(q: Tensor, k: Tensor, hq: int, hkv: int) -> bool:
    if q.rank == 4:
        d_q, d_k = normalize_dim(q.shape[3]), normalize_dim(k.shape[3])
    else:
        d_q, d_k = normalize_dim(q.shape[2]) // hq, normalize_dim(k.shape[2]) // hkv
    return isinstance(d_q, int) and d_q == d_k


def _plain_mask(inputs: list, k: Tensor) -> bool:
    """No mask, or a bool one or one of the inputs' type, covering exactly the keys (the
    past's and the new)."""
    mask = _input(inputs, 3)
    if mask is None:
        return True
    keys = k.shape[1] if k.rank == 3 else k.shape[2]
    if _input(inputs, 4) is not None:
        keys = inputs[4].shape[2] + keys
    return (1 <= mask.rank <= 4 and (mask.dtype.is_bool or mask.dtype == k.dtype)
            and normalize_dim(mask.shape[-1]) == normalize_dim(keys))


def _four_d(p: Primitives, x: Tensor, heads: int, what: str) -> Tensor:
    """(batch, heads, sequence, head size), from the 3-D (batch, sequence, heads · size)."""
    if x.rank == 4:
        return x
    size = normalize_dim(x.shape[2]) // heads
    split = p.op("Reshape", [x, p.shape([0, 0, heads, size], f"{what}_heads")], f"{what}_split")
    return p.op("Transpose", [split], f"{what}_4d", perm=[0, 2, 1, 3])


def _transposed(p: Primitives, x: Tensor, suffix: str) -> Tensor:
    return p.op("Transpose", [x], suffix, perm=[0, 1, 3, 2])


def _repeat_heads(p: Primitives, x: Tensor, group: int, what: str) -> Tensor:
    """Each of Kᵀ's or V's heads ``group`` times in a row, as grouped-query attention
    shares them between consecutive query heads."""
    batch, heads, rows, columns = x.shape
    grown = p.op("Unsqueeze", [x, p.shape([2], f"{what}_axis")], f"{what}_unsqueeze")
    wide = p.op("Expand", [grown, p.shape([1, 1, group, 1, 1], f"{what}_group")],
                f"{what}_expand")
    shape = dims_tensor([batch, heads * group, rows, columns], f"{p.node.name}/{what}_shape")
    return p.op("Reshape", [wide, shape], f"{what}_repeated")


def _bias(p: Primitives, mask: Optional[Tensor], causal: bool, offset, queries, keys,
          dtype) -> Optional[Tensor]:
    """What is added to the scaled scores: the float mask where keys are allowed (or 0),
    -inf where the boolean mask or the causal frontier forbids them; None without either."""
    allowed = value = None
    if mask is not None:
        if mask.dtype.is_bool:
            allowed = mask
        else:
            value = mask
    if causal:
        frontier = _causal(p, offset, queries, keys)
        allowed = frontier if allowed is None else p.op("And", [allowed, frontier],
                                                        "allowed")
    if allowed is None:
        return value
    kept = value if value is not None else p.constant(0.0, dtype, "zero")
    return p.op("Where", [allowed, kept, p.constant(-np.inf, dtype, "minus_inf")], "bias")


def _causal(p: Primitives, offset, queries, keys) -> Tensor:
    """(queries, keys) booleans: key j is allowed for query i when j <= i + offset. The
    positions are Ranges, so any of the sizes may be symbolic."""
    def positions(start, stop, what: str) -> Tensor:
        bounds = [dims_tensor([normalize_dim(d)], f"{p.node.name}/{what}_{end}")
                  for d, end in ((start, "start"), (stop, "stop"))]
        return p.op("Range", [*bounds, p.shape([1], f"{what}_step")], what)
    rows = positions(offset, as_expr(offset) + queries, "query_positions")
    rows = p.op("Unsqueeze", [rows, p.shape([1], "query_axis")], "query_column")
    return p.op("LessOrEqual", [positions(0, keys, "key_positions"), rows], "causal")


def _zero_masked_rows(p: Primitives, y: Tensor, bias: Tensor) -> Tensor:
    """Zeros for a query whose bias forbids every key (softmax gives NaN there). Applied
    to the product rather than to the probabilities: a row is zero either way, and
    softmax then feeds the product directly, which fission and the orchestrator's fused
    attention take."""
    high = p.op("ReduceMax", [bias], "bias_max", axes=[-1], keepdims=1)
    closed = p.op("Equal", [high, p.constant(-np.inf, bias.dtype, "closed")], "closed")
    return p.op("Where", [closed, p.constant(0.0, y.dtype, "nothing"), y], "guarded")
