"""Einsum: a sum over the labels the output leaves out of the product of the operands,
each indexed by its labels, as one reduction; a contraction of two operands is then
exactly the form of MatMul's definition, which the GEMM template takes.

The equation is ``"ij,jk->ik"``; without ``->`` the output has the broadcast (``...``)
axes, then the labels used once in alphabetical order. A label repeated in one operand
reads its diagonal. ``...`` stands for the same run of axes in every operand, aligned at
the right and broadcast where an operand's axis has size 1.
"""
from __future__ import annotations

from typing import Sequence

from treadle.graph.operator import OpContext, register
from treadle.graph.ops.common import same_dtype
from treadle.graph.ops.nn import _finish
from treadle.graph.ops.reduce import accumulator
from treadle.graph.tensor import Dim, normalize_dim
from treadle.ir.compute import compute, reduce
from treadle.ir.expr import as_expr, cast, eq

ELLIPSIS = "..."


@register("Einsum")
def einsum(ctx: OpContext):
    equation = ctx.required_attr("equation").replace(" ", "")
    operands = [ctx.input(k) for k in range(ctx.num_inputs)]
    dtype = same_dtype(ctx, *operands)
    given, arrow, written = equation.partition("->")
    terms = given.split(",")
    if len(terms) != len(operands):
        raise ctx.error(f"equation {equation!r} has {len(terms)} operands, the node "
                        f"{len(operands)}")
    broadcast = max((b.rank - len(t.replace(ELLIPSIS, "")) for t, b in zip(terms, operands)
                     if ELLIPSIS in t), default=0)
    labels = [_labels(ctx, t, b.rank, broadcast) for t, b in zip(terms, operands)]
    sizes = _sizes(ctx, labels, operands)
    if arrow:
        out = _labels(ctx, written, broadcast + len(written.replace(ELLIPSIS, "")), broadcast)
    else:
        used = [label for term in labels for label in term]
        out = [f"...{k}" for k in range(broadcast)] + sorted(
            {label for label in used if used.count(label) == 1 and len(label) == 1})
    unknown = [label for label in out if label not in sizes]
    if unknown or len(set(out)) != len(out):
        raise ctx.error(f"equation {equation!r}: output labels must be distinct and appear "
                        "in an operand")
    summed = [label for label in sizes if label not in out]
    acc = accumulator(dtype)

    def element(*index):
        at = dict(zip(out + summed, index))
        value = None
        for x, term in zip(operands, labels):
            load = x[tuple(as_expr(0) if label.startswith(ELLIPSIS) and
                           normalize_dim(d) == 1 else at[label]
                           for label, d in zip(term, x.shape))]
            value = cast(load, acc) if value is None else value * cast(load, acc)
        return value
    shape = [sizes[label] for label in out]
    if not summed:
        return [compute("einsum", shape, element, dtype)]
    return [_finish(ctx, reduce("einsum", shape, [sizes[label] for label in summed], element),
                    dtype)]


def _labels(ctx: OpContext, term: str, rank: int, broadcast: int) -> list[str]:
    """One label per axis: the term's letters, with ``...`` as ``broadcast`` labels
    ``...k`` ending at the last broadcast axis (an operand may have fewer)."""
    head, dots, tail = term.partition(ELLIPSIS)
    if not all(c.isalpha() for c in head + tail):
        raise ctx.error(f"einsum term {term!r} must be letters and at most one '...'")
    count = rank - len(head) - len(tail)
    if (not dots and count) or count < 0 or count > broadcast:
        raise ctx.error(f"einsum term {term!r} does not match an operand of rank {rank}")
    return [*head, *(f"...{k}" for k in range(broadcast - count, broadcast)), *tail]


def _sizes(ctx: OpContext, labels: Sequence[list[str]], operands) -> dict[str, Dim]:
    """Each label's length, the same wherever it appears; a broadcast axis of size 1
    takes the others'."""
    sizes: dict[str, Dim] = {}
    for term, x in zip(labels, operands):
        for label, d in zip(term, x.shape):
            d = normalize_dim(d)
            have = sizes.get(label)
            if have is None or (have == 1 and label.startswith(ELLIPSIS)):
                sizes[label] = d
            elif d != have and not (d == 1 and label.startswith(ELLIPSIS)):
                if isinstance(d, int) and isinstance(have, int):
                    raise ctx.error(f"label {label!r} has sizes {have} and {d}")
                ctx.require(eq(as_expr(d), as_expr(have)),
                            f"label {label!r} has sizes {have} and {d}")
    return sizes
