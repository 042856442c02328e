"""Operators only the orchestrator makes (``treadle.orchestrate.primitives``): a kernel of
several primitives, and an attention computed as one kernel. They hold their computes;
no model or frontend applies them."""
from __future__ import annotations

from dataclasses import dataclass

from treadle.graph.operator import register
from treadle.ir.compute import Compute


@dataclass(frozen=True, eq=False)
class AttentionParts:
    """The computes of ``softmax(logits(Q Kᵀ)) V`` as the fused operator holds them:
    ``scores`` the first product (batch..., query, key; summed over the head's depth),
    ``logits`` the element-wise work on the scores (or ``scores`` itself), ``weights``
    the exponentials of the logits less their row maximum ``maximum``, ``total`` their
    row sum, ``product`` the weights times V (batch..., query, value) and ``out`` the
    product divided by the total."""
    scores: Compute
    logits: Compute
    maximum: Compute
    weights: Compute
    total: Compute
    product: Compute
    out: Compute


@register("FusedAttention", internal=True)
def _fused_attention(ctx):
    raise ctx.unsupported("a fused attention kernel is made by the orchestrator, not applied")


@register("Composite", internal=True)
def _composite(ctx):
    raise ctx.unsupported("a composite kernel is made by the orchestrator, not applied")
