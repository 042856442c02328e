"""RotaryEmbedding (opset 23): rotary position embeddings, as exporters write them for
LLaMA-style attention at opset 23.

Each head vector's first ``rotary_embedding_dim`` elements are taken as pairs (x1, x2),
the two halves of that span or, ``interleaved``, its even and odd elements, and rotated by
the angle of the token's position: x1·cos − x2·sin and x1·sin + x2·cos, with cos and sin
read from caches indexed by ``position_ids`` [batch, seq] (caches [positions, dim / 2]) or,
without them, by batch and token (caches [batch, seq, dim / 2]). The rest of the vector is
copied. One element-wise definition: each output element reads its pair and one cos and
sin, so fusion puts it into the kernels around it.

X is 4-D (batch, heads, seq, head size) or 3-D (batch, seq, heads · head size, split by
``num_heads``).
"""
from __future__ import annotations

from treadle.graph.operator import OpContext, register
from treadle.graph.ops.common import broadcast_index, broadcast_shape, same_dtype, static_dim
from treadle.graph.ops.transform import _dims, _index
from treadle.graph.tensor import normalize_dim
from treadle.ir.compute import compute
from treadle.ir.expr import Expr, as_expr, eq, select


@register("RotaryEmbedding")
def rotary_embedding(ctx: OpContext):
    x, shape = ctx.input(0), _dims(ctx, 0)
    cos, sin = ctx.input(1), ctx.input(2)
    same_dtype(ctx, x, cos, sin)
    head, split = _head_size(ctx, shape)
    lines = [shape[0], shape[2] if len(shape) == 4 else shape[1]]  # batch, sequence
    rotated = ctx.attr("rotary_embedding_dim", 0) or head
    if rotated % 2 or rotated > head:
        raise ctx.error(f"rotary_embedding_dim {rotated} must be even and at most the head "
                        f"size {head}")
    half = rotated // 2
    positions = ctx.input(3) if ctx.has_input(3) else None
    cache_rank = 2 if positions is not None else 3
    for k, cache in ((1, cos), (2, sin)):
        if cache.rank != cache_rank or normalize_dim(cache.shape[-1]) != half:
            raise ctx.error(f"input {k} (the {'cos' if k == 1 else 'sin'} cache) must be "
                            f"{cache_rank}-D with a last dimension of {half}, got "
                            f"[{', '.join(map(str, cache.shape))}]")
    if [normalize_dim(d) for d in cos.shape] != [normalize_dim(d) for d in sin.shape]:
        cos_text, sin_text = (", ".join(map(str, c.shape)) for c in (cos, sin))
        raise ctx.error(f"the cos and sin caches differ in shape: [{cos_text}] and "
                        f"[{sin_text}]")
    # Per (batch, token): the position ids, or without them the caches; a size 1
    # broadcasts (exporters write caches of batch 1).
    per_line = [positions] if positions is not None else [cos, sin]
    for b in per_line:
        if b.rank != 2 + (positions is None) or list(broadcast_shape(
                ctx, lines, b.shape[:2])) != [normalize_dim(d) for d in lines]:
            raise ctx.error(f"[{', '.join(map(str, b.shape))}] does not broadcast to the "
                            f"batch and sequence [{', '.join(map(str, lines))}]")
    interleaved = bool(ctx.attr("interleaved", 0))

    def element(*i) -> Expr:
        batch, token, d, at = split(i)
        line = broadcast_index(per_line[0].shape[:2], (batch, token), lines)
        row = (_index(positions[line], cos.shape[0]),) if positions is not None else line
        pair = d // 2 if interleaved else select(d < half, d, d - half)
        first = eq(d % 2, 0) if interleaved else d < half
        x1 = x[at(pair * 2 if interleaved else pair)]
        x2 = x[at(pair * 2 + 1 if interleaved else pair + half)]
        c, s = cos[(*row, pair)], sin[(*row, pair)]
        turned = select(first, c * x1 - s * x2, s * x1 + c * x2)
        return select(d < rotated, turned, x[i]) if rotated < head else turned
    return [compute("y", shape, element)]


def _head_size(ctx: OpContext, shape: list):
    """The head size, and a function from an output index to (batch, token, position d in
    the head, the index of the same head's element at another position)."""
    if len(shape) == 4:
        def split4(i):
            return i[0], i[2], i[3], lambda d: (i[0], i[1], i[2], d)
        return static_dim(ctx, shape[3], "the head size"), split4
    if len(shape) != 3:
        raise ctx.error(f"X must be 3-D or 4-D, got rank {len(shape)}")
    heads, hidden = ctx.attr("num_heads", 0), static_dim(ctx, shape[2], "the hidden size")
    if heads <= 0 or hidden % heads:
        raise ctx.error(f"a 3-D X needs num_heads dividing its hidden size {hidden}, got "
                        f"{heads}")
    head = hidden // heads

    def split3(i):
        start = i[2] // head * head
        return i[0], i[1], i[2] % head, lambda d: (i[0], i[1], start + as_expr(d))
    return head, split3
