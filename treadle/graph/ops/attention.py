"""Scaled dot-product attention: the ONNX Attention operator (opsets 23, 24 and 25).

One definition composed of reductions and maps, in the order of the spec's function body:

    scores  = (Q·√scale)(K·√scale)ᵀ          a sum over the head size, rounded to T1
    capped  = softcap·tanh(scores/softcap)    when softcap > 0
    logits  = capped + bias                   rounded to T1
    probs   = softmax(logits) over the keys   rounded to softmax_precision (T1) per step
    Y       = probs · V                       a sum over the keys

The additive ``bias`` is one select: a key is allowed when the boolean mask keeps it, the
causal frontier (``j <= i + offset``) and the sliding window admit it, and it lies before
``nonpad_kv_seqlen``; an allowed key adds the float mask (or 0), any other key -inf. A
query row whose bias is -inf everywhere has no key to attend and gives zeros, not NaN.

Q, K and V are 4-D (batch, heads, sequence, head size) or 3-D (batch, sequence, heads ·
head size, split by ``q_num_heads`` / ``kv_num_heads``); 3-D input gives 3-D Y. K and V
heads are shared by ``q_heads / kv_heads`` consecutive query heads (grouped-query
attention). ``past_key`` / ``past_value`` are concatenated before K and V along the
sequence; the concatenations are the present_key / present_value outputs. A mask whose
last dimension is shorter than the keys counts as masked beyond its end. The causal
frontier and opset 25's sliding window (``left_window_size`` / ``right_window_size``) are
offset by the keys before the query block: the past length, else ``nonpad_kv_seqlen[b] -
q_sequence_length``, else 0. Half-precision inputs accumulate in float32 and round where
the spec's graph has T1 tensors. The fourth output follows onnx's reference: modes 0 and
1 both give the (softcapped) scores, 2 adds the bias, 3 is the softmax.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from treadle.errors import DTypeError
from treadle.graph.operator import OpContext, register
from treadle.graph.ops.common import broadcast_index, onnx_dtype, same_dtype, static_dim
from treadle.graph.ops.reduce import accumulator
from treadle.graph.tensor import normalize_dim
from treadle.ir import dtypes
from treadle.ir.compute import Compute, compute, reduce
from treadle.ir.dtypes import DataType
from treadle.ir.expr import (Buffer, Const, Expr, as_expr, call, cast, eq, logical_and,
                             maximum, minimum, select)

# qk_matmul_output_mode: which intermediate the fourth output holds.
_QK_RAW, _QK_SOFTCAP, _QK_BIAS, _QK_SOFTMAX = 0, 1, 2, 3


class _Heads:
    """Q, K or V seen as 4-D (batch, heads, sequence, head size) whatever its layout."""

    def __init__(self, ctx: OpContext, x: Buffer, heads: int | None, what: str):
        self.x, self.split = x, x.rank == 3
        if x.rank == 4:
            self.batch, self.heads, self.seq, self.size = x.shape
        elif x.rank == 3:
            if heads is None or heads < 1:
                raise ctx.error(f"{what} is 3-D, so q_num_heads and kv_num_heads are required")
            hidden = static_dim(ctx, x.shape[2], f"the hidden size of {what}")
            if hidden % heads:
                raise ctx.error(f"{what}'s hidden size {hidden} is not a multiple of its "
                                f"{heads} heads")
            self.batch, self.seq = x.shape[0], x.shape[1]
            self.heads, self.size = heads, hidden // heads
        else:
            raise ctx.error(f"{what} must be 3-D or 4-D, got shape {[str(d) for d in x.shape]}")

    def __call__(self, b, h, s, d) -> Expr:
        if self.split:
            return self.x[b, s, h * self.size + d]
        return self.x[b, h, s, d]


def _concat_past(ctx: OpContext, new: _Heads, past_index: int, what: str):
    """(element function, sequence length) of past ++ new along the sequence, and the
    compute holding it (the present output), or None when there is no past."""
    if not ctx.has_input(past_index):
        return new, new.seq, None
    past = ctx.input(past_index)
    if past.rank != 4:
        raise ctx.error(f"past_{what} must be 4-D, got shape {[str(d) for d in past.shape]}")
    if past.dtype != new.x.dtype:
        raise ctx.error(f"past_{what} has dtype {past.dtype}, not {new.x.dtype}", DTypeError)
    p = as_expr(past.shape[2])

    def element(b, h, j, d):  # both indices clamped: the branch not taken stays inside
        old = past[b, h, maximum(minimum(j, p - 1), 0), d]
        return select(j < p, old, new(b, h, maximum(j - p, 0), d))
    length = normalize_dim(p + new.seq)
    present = compute(f"present_{what}", [new.batch, new.heads, length, new.size], element)
    return (lambda b, h, j, d: present[b, h, j, d]), length, present


@dataclass(frozen=True)
class _Precision:
    """T1 and the dtype its sums run in (``work``); the softmax's precision (``stype``,
    softmax_precision or T1) and the dtype its steps run in (``soft``)."""
    dtype: DataType
    work: DataType
    stype: DataType
    soft: DataType

    def rounded(self, value: Expr) -> Expr:
        """``value`` rounded as a T1 tensor of the spec's graph holds it."""
        return cast(cast(value, self.dtype), self.work)

    def soft_rounded(self, value: Expr) -> Expr:
        """``value`` rounded to softmax_precision, as each softmax step is."""
        return cast(cast(value, self.stype), self.soft)


@register("Attention")
def attention(ctx: OpContext) -> list[Compute]:
    dtype, q, k, v = _inputs(ctx)
    key, length, present_key = _concat_past(ctx, k, 4, "key")
    value, _, present_value = _concat_past(ctx, v, 5, "value")
    head_size, hq, group = _grouping(ctx, q, k, v)
    p = _precision(ctx, dtype)
    shape = [q.batch, hq, q.seq, length]
    capped = _scores(ctx, p, q, key, group, head_size, shape)
    bias, restricts = _additive_bias(ctx, shape, p.work)
    logits = capped if bias is None else compute(
        "qk_bias", shape, lambda b, h, i, j: cast(capped[b, h, i, j], p.work) + bias(b, h, i, j),
        dtype)
    probs = _softmax(p, logits, shape, bias if restricts else None)
    outputs = [_weighted_values(ctx, p, probs, value, q, v, group, shape)]
    if ctx.num_outputs > 1:
        outputs += [_present(k, present_key, "key"), _present(v, present_value, "value")]
    if ctx.num_outputs > 3:
        outputs.append(_qk_output(ctx, shape, capped, logits, probs))
    return outputs


def _inputs(ctx: OpContext) -> tuple[DataType, _Heads, _Heads, _Heads]:
    """T1 and Q, K, V seen as heads, checked to be float tensors of one dtype and rank
    and to pair with the optional inputs."""
    q_in, k_in, v_in = ctx.input(0), ctx.input(1), ctx.input(2)
    dtype = same_dtype(ctx, q_in, k_in, v_in)
    if not dtype.is_float:
        raise ctx.error(f"Q, K and V must be float tensors, got {dtype}", DTypeError)
    if not q_in.rank == k_in.rank == v_in.rank:
        raise ctx.error("Q, K and V must have the same rank")
    if ctx.has_input(4) != ctx.has_input(5):
        raise ctx.error("past_key and past_value must be given together")
    if ctx.has_input(6) and ctx.has_input(4):
        raise ctx.error("nonpad_kv_seqlen cannot be combined with past_key / past_value")
    q_heads, kv_heads = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    return (dtype, _Heads(ctx, q_in, q_heads, "Q"), _Heads(ctx, k_in, kv_heads, "K"),
            _Heads(ctx, v_in, kv_heads, "V"))


def _grouping(ctx: OpContext, q: _Heads, k: _Heads, v: _Heads) -> tuple[int, int, int]:
    """(head size, query heads, query heads per key/value head), checked to agree."""
    head_size = static_dim(ctx, q.size, "the head size of Q")
    if static_dim(ctx, k.size, "the head size of K") != head_size:
        raise ctx.error(f"Q and K head sizes differ: {head_size} vs {k.size}")
    hq = static_dim(ctx, q.heads, "the number of query heads")
    hkv = static_dim(ctx, k.heads, "the number of key heads")
    if static_dim(ctx, v.heads, "the number of value heads") != hkv:
        raise ctx.error(f"K and V have different numbers of heads: {hkv} vs {v.heads}")
    if hq % hkv:
        raise ctx.error(f"{hq} query heads are not a multiple of {hkv} key/value heads")
    return head_size, hq, hq // hkv


def _precision(ctx: OpContext, dtype: DataType) -> _Precision:
    # The softmax runs in softmax_precision, by default T1: each step is rounded to it.
    precision = ctx.attr("softmax_precision")
    stype = dtype if precision is None else onnx_dtype(ctx, int(precision))
    if not stype.is_float:
        raise ctx.error(f"softmax_precision must be a float type, got {stype}", DTypeError)
    return _Precision(dtype, accumulator(dtype), stype, accumulator(stype))


def _scores(ctx: OpContext, p: _Precision, q: _Heads, key, group: int, head_size: int,
            shape: list) -> Compute:
    """The T1 scores (Q·√scale)(K·√scale)ᵀ, softcapped when softcap > 0."""
    scale = ctx.attr("scale")
    root = Const(math.sqrt(1.0 / math.sqrt(head_size) if scale is None else float(scale)),
                 p.work)
    root = p.rounded(root)  # √scale is cast to T1 and multiplies Q and K

    def product(b, h, i, j, r):
        left = p.rounded(cast(q(b, h, i, r), p.work) * root)
        right = p.rounded(cast(key(b, h // group, j, r), p.work) * root)
        return left * right
    scores = reduce("qk", shape, [head_size], product)
    softcap = float(ctx.attr("softcap", 0.0))
    if softcap > 0:
        cap = Const(softcap, p.work)
        return compute("softcap", shape,
                       lambda *i: call("tanh", p.rounded(scores[i]) / cap) * cap, p.dtype)
    return compute("qk_scores", shape, lambda *i: scores[i], p.dtype)


def _additive_bias(ctx: OpContext, shape: list, work: DataType):
    """(bias(b, h, i, j), whether it is -inf for keys not allowed), or (None, False) when
    neither a mask nor a restriction applies."""
    batch, heads, seq, length = shape
    allowed, bias_value = _bias(ctx, batch, heads, seq, length, work)
    if allowed is None and bias_value is None:
        return None, False

    def bias(b, h, i, j) -> Expr:
        value = Const(0.0, work) if bias_value is None else bias_value(b, h, i, j)
        if allowed is None:
            return value
        return select(allowed(b, h, i, j), value, Const(-math.inf, work))
    return bias, allowed is not None


def _softmax(p: _Precision, logits: Compute, shape: list, guard) -> Compute:
    """softmax(logits) over the keys, shifted by the maximum (an all -inf row shifts by
    0). With ``guard``, the bias, a row with no allowed key (its bias all -inf) gives
    zeros, decided on the bias so that NaN or infinite scores cannot leak into it."""
    batch, heads, seq, length = shape
    soft = p.soft

    def logit(i):
        return cast(logits[i], soft)
    high = reduce("qk_max", [batch, heads, seq, 1], [length],
                  lambda b, h, i, _, j: logit((b, h, i, j)), "max")
    lowest = Const(-math.inf, soft)

    def shift(b, h, i):
        m = high[b, h, i, 0]
        return select(eq(m, lowest), Const(0.0, soft), m)
    exps = compute("qk_exp", shape, lambda b, h, i, j: p.soft_rounded(call(
        "exp", p.soft_rounded(logit((b, h, i, j)) - shift(b, h, i)))))
    total = reduce("qk_sum", [batch, heads, seq, 1], [length],
                   lambda b, h, i, _, j: exps[b, h, i, j], "sum")

    def probability(b, h, i, j):
        s = p.soft_rounded(total[b, h, i, 0])
        return p.soft_rounded(exps[b, h, i, j] / select(eq(s, Const(0.0, soft)),
                                                        Const(1.0, soft), s))
    if guard is not None:
        bias_max = reduce("bias_max", [batch, heads, seq, 1], [length],
                          lambda b, h, i, _, j: guard(b, h, i, j), "max")
        unguarded = probability

        def probability(b, h, i, j):
            return select(eq(bias_max[b, h, i, 0], Const(-math.inf, p.work)),
                          Const(0.0, soft), unguarded(b, h, i, j))
    return compute("attention_probs", shape, probability, p.dtype)


def _weighted_values(ctx: OpContext, p: _Precision, probs: Compute, value, q: _Heads,
                     v: _Heads, group: int, shape: list) -> Compute:
    """Y = probs · V, a sum over the keys, laid out as Q is (3-D or 4-D)."""
    batch, hq, seq, length = shape

    def weighted(b, h, i, e, j):
        return cast(probs[b, h, i, j], p.work) * cast(value(b, h // group, j, e), p.work)
    if q.split:
        v_size = static_dim(ctx, v.size, "the head size of V")
        total = reduce("attention_sum", [batch, seq, hq * v_size], [length],
                       lambda b, i, c, j: weighted(b, c // v_size, i, c % v_size, j))
    else:
        total = reduce("attention_sum", [batch, hq, seq, v.size], [length], weighted)
    # Accumulated in ``work``; a reduce's own dtype would round every term instead.
    if p.work == p.dtype:
        return total
    return compute("attention", total.shape, lambda *i: total[i], p.dtype)


def _present(new: _Heads, present: Compute | None, what: str) -> Compute:
    """The present_key / present_value output; without a past it is K or V, as 4-D."""
    if present is not None:
        return present
    return compute(f"present_{what}", [new.batch, new.heads, new.seq, new.size],
                   lambda b, h, s, d: new(b, h, s, d))


def _qk_output(ctx: OpContext, shape: list, capped: Compute, logits: Compute,
               probs: Compute) -> Compute:
    """The fourth output, the intermediate that qk_matmul_output_mode chooses."""
    mode = int(ctx.attr("qk_matmul_output_mode", _QK_RAW))
    chosen = {_QK_RAW: capped, _QK_SOFTCAP: capped, _QK_BIAS: logits,
              _QK_SOFTMAX: probs}.get(mode)
    if chosen is None:
        raise ctx.error(f"qk_matmul_output_mode must be 0, 1, 2 or 3, got {mode}")
    return compute("qk_matmul_output", shape, lambda *i: chosen[i])


def _bias(ctx: OpContext, batch, heads: int, seq, length, work):
    """(allowed(b, h, i, j) or None, float mask value(b, h, i, j) or None) from attn_mask,
    is_causal, the sliding window and nonpad_kv_seqlen; None where nothing restricts."""
    conditions, value = [], None
    if ctx.has_input(3):
        mask = ctx.input(3)
        if mask.rank < 1 or mask.rank > 4:
            raise ctx.error(f"attn_mask must have rank 1 to 4, got {mask.rank}")
        if not (mask.dtype.is_bool or mask.dtype.is_float):
            raise ctx.error(f"attn_mask must be bool or float, got {mask.dtype}", DTypeError)
        out_lead = [batch, as_expr(heads), seq][4 - mask.rank:]
        for d, o in zip(mask.shape[:-1], out_lead):
            d, o = normalize_dim(d), normalize_dim(o)
            if isinstance(d, int) and isinstance(o, int) and d not in (1, o):
                raise ctx.error(f"attn_mask of shape {[str(s) for s in mask.shape]} does not "
                                f"broadcast to [{batch}, {heads}, {seq}, {length}]")
        width = as_expr(mask.shape[-1])
        w, n = normalize_dim(width), normalize_dim(length)
        if isinstance(w, int) and isinstance(n, int) and w > n:
            raise ctx.error(f"attn_mask covers {w} keys but there are only {n}")

        def element(b, h, i, j):  # keys past the mask's end count as masked
            lead = broadcast_index(mask.shape[:-1], (b, as_expr(h), i)[4 - mask.rank:],
                                   out_lead)
            return mask[(*lead, minimum(j, width - 1))]
        if not (isinstance(w, int) and isinstance(n, int) and w == n):
            conditions.append(lambda b, h, i, j: j < width)
        if mask.dtype.is_bool:
            conditions.append(element)
        else:
            value = lambda b, h, i, j: cast(element(b, h, i, j), work)  # noqa: E731

    nonpad = None
    if ctx.has_input(6):
        nonpad = ctx.input(6)
        if not nonpad.dtype.is_integer or nonpad.rank != 1:
            raise ctx.error("nonpad_kv_seqlen must be a 1-D integer tensor (one per batch)")
        conditions.append(lambda b, h, i, j: j < cast(nonpad[b], dtypes.index_type))

    def offset(b):  # how many keys precede the query block
        if ctx.has_input(4):
            return as_expr(ctx.input(4).shape[2])
        if nonpad is not None:
            return cast(nonpad[b], dtypes.index_type) - seq
        return as_expr(0)
    if ctx.attr("is_causal", 0):
        conditions.append(lambda b, h, i, j: j <= i + offset(b))
    left, right = int(ctx.attr("left_window_size", -1)), int(ctx.attr("right_window_size", -1))
    if left < -1 or right < -1:
        raise ctx.error(f"window sizes must be -1 or nonnegative, got {left} and {right}")
    if left >= 0:
        conditions.append(lambda b, h, i, j: i + offset(b) - j <= left)
    if right >= 0:
        conditions.append(lambda b, h, i, j: j - (i + offset(b)) <= right)
    if not conditions:
        return None, value
    return (lambda b, h, i, j: logical_and(*(c(b, h, i, j) for c in conditions))), value
