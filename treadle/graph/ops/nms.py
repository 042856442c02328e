"""NonMaxSuppression (ONNX): per batch and class, the boxes chosen greedily by decreasing
score, each dropped that overlaps one already chosen by more than the IoU threshold.

How many boxes it selects depends on the data, so its output's size is a symbol of its
own (``OpContext.size_from_data``), found by the kernel, which stores it in an extra int64
output: the rows (batch, class, box) are the outermost dimension, written compactly into
memory planned for the bound, every box of every class selected.

The selection is the greedy (lexicographically first) maximal set of boxes in score order
whose pairwise overlaps stay within the threshold, a recurrence as long as the boxes'
ranking: no compute definition of bounded depth states it, so the definition gives only
the outputs' shapes and dtypes, as TopK's does, and the kernel is the meaning. It runs
each (batch, class) line as one parallel iteration:
* the boxes scoring above ``score_threshold`` become candidates, in box order;
* a stable bottom-up merge sort (``sort``'s passes) ranks them by decreasing score, equal
  scores the lower box first;
* each candidate in turn is kept unless it overlaps a box kept before it, until
  ``max_output_boxes_per_class`` are kept: O(candidates x kept). The kept boxes overwrite
  the front of the ranking, which holds them in order of selection;
and then one serial pass copies the lines' kept boxes out in (batch, class) order.

Order, overlap and thresholds follow ONNX Runtime: boxes are normalised to (y_min, x_min,
y_max, x_max), their areas computed from those corners (for centre boxes too, so that two
identical boxes overlap by exactly 1), an overlap suppresses only when the intersection is
positive on both axes and its IoU is strictly above the threshold, and an absent (or
negative) maximum selects nothing. NaN scores, which ONNX Runtime's heap leaves in no
defined order, rank first here (as in TopK) and never pass a score threshold.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import NamedTuple

from treadle.graph.operator import OpContext, Operator, register
from treadle.graph.ops.sort import merge_sort, ranking
from treadle.graph.tensor import normalize_dim, num_elements
from treadle.ir import dtypes
from treadle.ir.builder import FunctionBuilder
from treadle.ir.compute import Compute, compute
from treadle.ir.expr import Buffer, Expr, Load, as_expr, cast, eq, maximum, minimum, select
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import canonical_kernel

# Inputs after boxes and scores, all optional: (name, dtype the kernel reads them as).
SCALARS = (("max_output_boxes_per_class", dtypes.int64), ("iou_threshold", dtypes.float32),
           ("score_threshold", dtypes.float32))

# A normalised box's fields in the kernel's workspace, as ONNX Runtime keeps them.
FIELDS = ("y_min", "x_min", "y_max", "x_max", "area")


class Box(NamedTuple):
    y_min: Expr
    x_min: Expr
    y_max: Expr
    x_max: Expr
    area: Expr


def _ordered(a: Expr, b: Expr) -> tuple[Expr, Expr]:
    """(smaller, larger) of two corner coordinates; the second for both where unordered."""
    return select(a >= b, b, a), select(a >= b, a, b)


def _normalise(fb: FunctionBuilder, boxes: Buffer, normalised: Buffer, centered: bool) -> None:
    """Every box's corners, ordered, and its area from them, once. The area is stored
    rounded, as ONNX Runtime has it: computed where it is summed, the compiler may fuse
    the product into the sum (an fma), which rounds once and can tip the IoU of two
    identical boxes past 1."""
    batches, n = boxes.shape[:2]
    for flat in fb.range(as_expr(batches) * n, kind="parallel", name="box"):
        batch, index = flat // n, flat % n
        v = [fb.let("coord", boxes[batch, index, d]) for d in range(4)]
        if centered:  # [x_center, y_center, width, height]
            half_w, half_h = fb.let("half_w", v[2] / 2), fb.let("half_h", v[3] / 2)
            corners = (v[1] - half_h, v[0] - half_w, v[1] + half_h, v[0] + half_w)
        else:
            (y_min, y_max), (x_min, x_max) = _ordered(v[0], v[2]), _ordered(v[1], v[3])
            corners = (y_min, x_min, y_max, x_max)
        y_min, x_min, y_max, x_max = (fb.let(name, e) for name, e in zip(FIELDS, corners))
        box = Box(y_min, x_min, y_max, x_max, (y_max - y_min) * (x_max - x_min))
        for f, value in enumerate(box):
            fb.store(normalised, (batch, index, f), value)


def _box(fb: FunctionBuilder, normalised: Buffer, batch, index) -> Box:
    return Box(*(fb.let(name, normalised[batch, index, f]) for f, name in enumerate(FIELDS)))


def _suppresses(fb: FunctionBuilder, a: Box, b: Box, iou: Expr) -> Expr:
    """Whether the boxes' intersection over union exceeds ``iou``; boxes that do not
    overlap on both axes never do."""
    width = fb.let("width", minimum(a.x_max, b.x_max) - maximum(a.x_min, b.x_min))
    height = fb.let("height", minimum(a.y_max, b.y_max) - maximum(a.y_min, b.y_min))
    zero = as_expr(0.0, dtypes.float32)
    inter = fb.let("inter", width * height)
    return (width > zero) & (height > zero) & (inter > zero) & (
        inter / (a.area + b.area - inter) > iou)


def _candidates(fb: FunctionBuilder, scores: Buffer, batch, cls, runs, line,
                threshold: Expr | None) -> Expr:
    """Copies the line's boxes scoring above ``threshold`` (all where None) to the front of
    the first run, in box order; their count."""
    taken = fb.scalar("taken", dtypes.index_type, 0)
    for j in fb.range(scores.shape[2], name="j"):
        s = fb.let("s", scores[batch, cls, j])
        with nullcontext() if threshold is None else fb.if_(s > threshold):
            fb.store(runs[0], (line, taken[()]), s)
            fb.store(runs[1], (line, taken[()]), cast(j, dtypes.int64))
            fb.store(taken, (), taken[()] + 1)
    return fb.let("candidates", taken[()])


def _rank(fb: FunctionBuilder, runs, line, length: Expr) -> None:
    """Sorts the line's first ``length`` candidates by decreasing score, stably, from the
    run pair a to b and back, two passes a round so that they end in a."""
    a, b = runs[:2], runs[2:]
    merge_sort(fb, a, b, line, length, ranking(True, dtypes.float32))


def _select(fb: FunctionBuilder, normalised: Buffer, batch, ranked: Buffer, line,
            length: Expr, limit: Expr, iou: Expr) -> Expr:
    """Greedy selection over the line's ranked candidates, the kept ones written to the
    front of ``ranked`` (never past the one being read); their count."""
    kept = fb.scalar("kept", dtypes.index_type, 0)
    for r in fb.range(length, name="r"):
        with fb.if_(kept[()] < limit):
            index = fb.let("index", cast(ranked[line, r], dtypes.index_type))
            box = _box(fb, normalised, batch, index)
            keep = fb.scalar("keep", dtypes.boolean, True)
            for s in fb.range(kept[()], name="s"):
                with fb.if_(keep[()]):
                    other = _box(fb, normalised, batch, cast(ranked[line, s], dtypes.index_type))
                    with fb.if_(_suppresses(fb, box, other, iou)):
                        fb.store(keep, (), as_expr(False))
            with fb.if_(keep[()]):
                fb.store(ranked, (line, kept[()]), cast(index, dtypes.int64))
                fb.store(kept, (), kept[()] + 1)
    return kept[()]


def _write_rows(fb: FunctionBuilder, rows: Buffer, total: Buffer, counts: Buffer,
                ranked: Buffer, classes) -> None:
    """The lines' kept boxes as (batch, class, box) rows in line order, and their count."""
    k = fb.scalar("k", dtypes.index_type, 0)
    for line in fb.range(counts.shape[0], name="line"):
        for s in fb.range(counts[line], name="s"):
            fields = (line // classes, line % classes, ranked[line, s])
            for axis, value in enumerate(fields):
                fb.store(rows, (k[()], axis), cast(value, dtypes.int64))
            fb.store(k, (), k[()] + 1)
    fb.store(total, (), cast(k[()], dtypes.int64))


def _has(op: Operator, i: int) -> bool:
    return i < len(op.input_buffers) and op.input_buffers[i] is not None


def _scalar(fb: FunctionBuilder, op: Operator, i: int, default) -> Expr:
    """Optional input ``i`` (a scalar or one element) read as its dtype in ``SCALARS``, or
    ``default`` where absent."""
    what, dtype = SCALARS[i - 2]
    if not _has(op, i):
        return as_expr(default, dtype)
    buffer = op.input_buffers[i]
    return fb.let(what, cast(buffer[(0,) * buffer.rank], dtype))


def _kernel(op: Operator, name: str) -> Kernel:
    boxes, scores = op.input_buffers[:2]
    rows, total = (c.buffer for c in op.definition)
    batches, classes, n = scores.shape
    with FunctionBuilder(name) as fb:
        for b in (*(b for b in op.input_buffers if b is not None), rows, total):
            fb.add_param(b)
        lines = as_expr(batches) * classes
        runs = tuple(fb.param(f"{what}{r}", dtype, [lines, n]) for r in "ab"
                     for what, dtype in (("scores", dtypes.float32), ("boxes", dtypes.int64)))
        counts = fb.param("counts", dtypes.index_type, [lines])
        normalised = fb.param("normalised", dtypes.float32, [batches, n, len(FIELDS)])
        for cond, message in op.checks:  # boxes and scores of symbolic sizes agree
            fb.assert_(cond, message)
        limit = fb.let("limit", maximum(_scalar(fb, op, 2, 0), as_expr(0, dtypes.int64)))
        iou = _scalar(fb, op, 3, 0.0)
        fb.assert_((iou >= 0.0) & (iou <= 1.0),
                   f"node {op.name!r} ({op.op_type}): iou_threshold must lie in [0, 1]")
        threshold = _scalar(fb, op, 4, 0.0) if _has(op, 4) else None
        _normalise(fb, boxes, normalised, bool(op.attrs.get("center_point_box", 0)))
        for line in fb.range(lines, kind="parallel", name="line"):
            batch, cls = line // classes, line % classes
            length = _candidates(fb, scores, batch, cls, runs, line, threshold)
            _rank(fb, runs, line, length)
            kept = _select(fb, normalised, batch, runs[1], line, length, limit, iou)
            fb.store(counts, (line,), kept)
        _write_rows(fb, rows, total, counts, runs[1], classes)
        fb.add_size_symbols((*boxes.shape, *scores.shape, *rows.shape))
    return canonical_kernel(fb.function, op.input_buffers, 2)


def _check_inputs(ctx: OpContext) -> None:
    """Ranks, dtypes and sizes: boxes [B, N, 4], scores [B, C, N], the rest scalars."""
    boxes, scores = ctx.input(0), ctx.input(1)
    if boxes.rank != 3 or normalize_dim(boxes.shape[2]) != 4 or scores.rank != 3:
        raise ctx.error(f"needs boxes [batches, boxes, 4] and scores [batches, classes, "
                        f"boxes], got {list(boxes.shape)} and {list(scores.shape)}")
    if boxes.dtype != dtypes.float32 or scores.dtype != dtypes.float32:
        raise ctx.unsupported(f"boxes of {boxes.dtype} and scores of {scores.dtype} "
                              "(float32 is supported)")
    for what, a, b in (("batches", boxes.shape[0], scores.shape[0]),
                       ("boxes", boxes.shape[1], scores.shape[2])):
        a, b = normalize_dim(a), normalize_dim(b)
        if isinstance(a, int) and isinstance(b, int):
            if a != b:
                raise ctx.error(f"boxes has {a} {what}, scores {b}")
        elif a != b:
            ctx.require(eq(as_expr(a), as_expr(b)),
                        f"boxes and scores differ in their number of {what}")
    for i, (what, _) in enumerate(SCALARS, start=2):
        if ctx.has_input(i) and num_elements(ctx.input(i).shape) != 1:
            raise ctx.error(f"{what} must be a single value, got shape "
                            f"{list(ctx.input(i).shape)}")


@register("NonMaxSuppression", kernel=_kernel)
def non_max_suppression(ctx: OpContext) -> list[Compute]:
    """[selected, 3] int64: the (batch, class, box) of each box selected, by batch, then
    class, then order of selection; and their count. Shapes and dtypes only (the module's
    note says why): the kernel computes the rows."""
    _check_inputs(ctx)
    if ctx.attr("center_point_box", 0) not in (0, 1):
        raise ctx.error(f"center_point_box must be 0 or 1, got {ctx.attr('center_point_box')}")
    size = ctx.size_from_data(1, num_elements(ctx.input(1).shape))
    selected = Buffer("NonMaxSuppression:selected", dtypes.int64, (size, 3))
    count = Buffer("NonMaxSuppression:count", dtypes.int64, ())
    return [compute("selected", [size, 3], lambda k, d: Load(selected, (k, d))),
            compute("count", [], lambda: Load(count, ()))]
