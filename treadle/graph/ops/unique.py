"""Unique: the distinct elements (or slices along an axis) of a tensor, where each first
occurs, which one every element is, and how often each occurs (ONNX's Unique, torch's
``unique``, ``unique_consecutive``).

How many there are is found in the data (``OpContext.size_from_data``, as NonZero's
count is): the operator's kernel writes into memory planned for as many as the input has
rows, and the executor binds the count after it has run. The kernel sees the count at
that bound and lays buffers out by their declared shapes, so the count is the outermost
dimension of every output it sizes: the kernel dedupes rows, slices along the first
axis, and ``unique`` transposes the axis asked for to the front and back.

The kernel merge sorts the rows' indices (``sort.merge_sort``; stable, so the lowest
index leads each run of equal rows), starts a group wherever a row differs from the one
before, and writes each group's first row, its first index and its size; every row's
group is its inverse index. In order of first occurrence (ONNX's ``sorted=0``, as ONNX
Runtime has it) the groups are then ranked by their first index. Consecutive mode
(torch's ``unique_consecutive``) skips the sort: equal rows merge only when adjacent.

The compute definition states the meaning by comparing every pair of rows, which shape
inference reads; the kernel costs n log n row comparisons. NaN is not treated apart: its
rows compare as the hardware's comparisons have them.
"""
from __future__ import annotations

from treadle.errors import ShapeError
from treadle.graph.operator import OpContext, Operator, apply, register
from treadle.graph.ops.sort import merge_sort
from treadle.graph.tensor import Tensor, constant, num_elements
from treadle.ir import dtypes
from treadle.ir.builder import FunctionBuilder
from treadle.ir.compute import Compute, compute, reduce
from treadle.ir.expr import Buffer, Expr, as_expr, cast, eq, logical_and, maximum, ne, select
from treadle.ir.mapping import unravel
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import canonical_kernel

# The operator's outputs, in order; the last holds the count found.
OUTPUTS = ("y", "first", "inverse", "counts", "count")


def _at(x: Buffer, row, t) -> tuple:
    """The index of element ``t`` (row-major) of row ``row`` of ``x``."""
    return (row, *unravel(t, x.shape[1:]))


def _row_length(x: Buffer):
    return num_elements(x.shape[1:])


def _order(fb: FunctionBuilder, x: Buffer, a: Expr, b: Expr) -> Expr:
    """-1, 0 or 1 as row ``a`` of ``x`` sorts before, with or after row ``b``: the first
    element that differs decides (lexicographic order)."""
    def sign(t):
        u, v = x[_at(x, a, t)], x[_at(x, b, t)]
        return cast(v < u, dtypes.int64) - cast(u < v, dtypes.int64)
    length = _row_length(x)
    if length == 1:
        return sign(0)
    order = fb.scalar("order", dtypes.int64, 0)
    for t in fb.range(length, name="t"):
        with fb.if_(eq(order[()], 0)):
            fb.store(order, (), sign(t))
    return order[()]


def _sort_rows(fb: FunctionBuilder, x: Buffer, runs: tuple[Buffer, Buffer], n) -> None:
    """The indices in ``runs[0]`` (a line of n) ordered by their rows, stably: merged
    from run a to b and back, two passes a round so that they end in a."""
    a, b = runs[:1], runs[1:]

    def before(p: Expr, q: Expr) -> Expr:
        return _order(fb, x, p, q) < 0
    merge_sort(fb, a, b, 0, n, before)


def _group(fb: FunctionBuilder, x: Buffer, rows: Buffer, starts: Buffer, inverse: Buffer,
           n) -> Buffer:
    """A group starts at every place of ``rows`` (sorted indices) whose row differs from
    the one before: its place goes to ``starts`` (which ends with n), its number to
    ``inverse`` for each of its rows. Returns the count of groups (a scalar)."""
    k = fb.scalar("k", dtypes.int64, 0)
    for p in fb.range(n, name="p"):
        row = fb.let("row", rows[0, p])
        previous = rows[0, maximum(p, 1) - 1]  # row 0 itself at place 0
        with fb.if_(eq(p, 0) | ne(_order(fb, x, previous, row), 0)):
            fb.store(starts, (k[()],), cast(p, dtypes.int64))
            fb.store(k, (), k[()] + 1)
        fb.store(inverse, (row,), k[()] - 1)
    fb.store(starts, (k[()],), cast(as_expr(n), dtypes.int64))
    return k


def _rank_by_first(fb: FunctionBuilder, runs: tuple[Buffer, Buffer], starts: Buffer,
                   inverse: Buffer, n) -> Buffer:
    """Each group's place in order of first occurrence, into run b (free once sorted):
    walking the rows in order, a group is ranked at its first row, which comes no later
    than any other of its rows, so each row's inverse index is renumbered on the way."""
    rows, rank = runs
    r = fb.scalar("r", dtypes.int64, 0)
    for i in fb.range(n, name="i"):
        g = fb.let("g", inverse[i])
        with fb.if_(eq(rows[0, starts[g]], cast(i, dtypes.int64))):
            fb.store(rank, (0, g), r[()])
            fb.store(r, (), r[()] + 1)
        fb.store(inverse, (i,), rank[0, g])
    return rank


def _write(fb: FunctionBuilder, x: Buffer, outputs: tuple[Buffer, ...], rows: Buffer,
           starts: Buffer, count: Buffer, rank: Buffer | None) -> None:
    """Each group's first row, its index and its size, at its place: its number, or its
    rank where one is given; then the count."""
    y, first, _, counts, total = outputs
    for g in fb.range(count[()], name="g"):
        place = fb.let("place", g if rank is None else rank[0, g])
        head = fb.let("head", rows[0, starts[g]])
        fb.store(first, (place,), head)
        fb.store(counts, (place,), starts[g + 1] - starts[g])
        for t in fb.range(_row_length(x), name="t"):
            fb.store(y, _at(y, place, t), x[_at(x, head, t)])
    fb.store(total, (), count[()])


def _kernel(op: Operator, name: str) -> Kernel:
    (x,) = op.input_buffers
    outputs = tuple(c.buffer for c in op.definition)
    n = x.shape[0]
    consecutive = bool(op.attrs.get("consecutive", 0))
    by_first = not consecutive and not op.attrs.get("sorted", 1)
    with FunctionBuilder(name) as fb:
        for buffer in (x, *outputs):
            fb.add_param(buffer)
        runs = tuple(fb.param(f"rows{r}", dtypes.int64, [1, n]) for r in "ab")
        starts = fb.param("starts", dtypes.int64, [n + 1])
        for i in fb.range(n, name="i"):
            fb.store(runs[0], (0, i), cast(i, dtypes.int64))
        if not consecutive:
            _sort_rows(fb, x, runs, n)
        count = _group(fb, x, runs[0], starts, outputs[2], n)
        rank = _rank_by_first(fb, runs, starts, outputs[2], n) if by_first else None
        _write(fb, x, outputs, runs[0], starts, count, rank)
        fb.add_size_symbols((*x.shape, *outputs[0].shape))
    return canonical_kernel(fb.function, op.input_buffers, len(OUTPUTS))


@register("UniqueRows", internal=True, kernel=_kernel)
def unique_rows(ctx: OpContext) -> list[Compute]:
    """The distinct rows of ``x`` (its slices along axis 0), ``[count, *rest]``, in
    ascending lexicographic order (``sorted=1``), in order of first occurrence
    (``sorted=0``), or each run of equal neighbours once (``consecutive=1``); the index of
    each one's first row; each row's index among them; how many rows each stands for;
    and the count."""
    x = ctx.input(0)
    if not x.shape:
        raise ctx.error("needs rank 1 or more, got a scalar")
    n, rest = x.shape[0], x.shape[1:]
    consecutive = bool(ctx.attr("consecutive", 0))
    size = ctx.size_from_data(len(OUTPUTS) - 1, n)
    differ, ahead = _pairs(x)

    def leader(f):  # the first row of its group
        return eq(repeats[f], 0)

    def precedes(g, f):  # leader g's group comes before leader f's
        return ahead[g, f] > 0 if ctx.attr("sorted", 1) and not consecutive else g < f
    repeats = reduce("repeats", [n], [n], lambda f, g: cast(logical_and(
        g < f, eq(differ[f, g], 0), eq(g, f - 1) if consecutive else True), dtypes.int64))
    rank = reduce("rank", [n], [n], lambda f, g: cast(
        logical_and(leader(g), precedes(g, f)), dtypes.int64))
    position = reduce("position", [size], [n], lambda k, f: select(
        logical_and(leader(f), eq(rank[f], cast(k, dtypes.int64))), f, as_expr(-1)), "max")
    # Consecutive: the last leader up to f; otherwise the leader equal to f.
    leader_of = reduce("leader_of", [n], [n], lambda f, g: select(logical_and(
        leader(g), g <= f, True if consecutive else eq(differ[f, g], 0)), g, as_expr(-1)), "max")
    inverse = compute("inverse", [n], lambda f: rank[leader_of[f]])
    return [compute("y", [size, *rest], lambda k, *r: x[(position[k], *r)]),
            compute("first", [size], lambda k: cast(position[k], dtypes.int64)), inverse,
            reduce("counts", [size], [n], lambda k, f: cast(
                eq(inverse[f], cast(k, dtypes.int64)), dtypes.int64)),
            reduce("count", [], [n], lambda f: cast(leader(f), dtypes.int64))]


def _pairs(x: Buffer) -> tuple[Compute, Compute]:
    """For every pair of rows f, g of ``x``: how many of their elements differ, and
    whether f sorts before g (an element smaller where all before it are equal)."""
    n, length = x.shape[0], _row_length(x)

    def differs(f, g, t):
        return ne(x[_at(x, f, t)], x[_at(x, g, t)])
    differ = reduce("differ", [n, n], [length],
                    lambda f, g, t: cast(differs(f, g, t), dtypes.int64))
    before = reduce("differ_before", [n, n, length], [length], lambda f, g, t, s: cast(
        logical_and(s < t, differs(f, g, s)), dtypes.int64))
    ahead = reduce("ahead", [n, n], [length], lambda f, g, t: cast(logical_and(
        x[_at(x, f, t)] < x[_at(x, g, t)], eq(before[f, g, t], 0)), dtypes.int64))
    return differ, ahead


def unique(x: Tensor, axis: int | None, sort: bool, name: str, output: str | None = None,
           consecutive: bool = False) -> list[Tensor]:
    """ONNX's Unique (torch's unique with ``consecutive``): [y, first indices, inverse
    indices, counts], over the flattened elements where ``axis`` is None; the node
    ``name``, ``y`` the tensor ``output``."""
    if axis is None:
        flat = constant([-1], f"{name}/flat", dtypes.int64)
        x, axis = apply("Reshape", [x, flat], name=f"{name}/flatten")[0], 0
    if not -x.rank <= axis < x.rank:
        raise ShapeError(f"node {name!r} (Unique): axis {axis} is outside rank {x.rank}")
    axis %= x.rank
    attrs = {"sorted": int(sort), "consecutive": int(consecutive)}
    if axis == 0:
        return apply("UniqueRows", [x], attrs, name=name, output_names=[output])[:4]
    others = [d for d in range(x.rank) if d != axis]
    front = apply("Transpose", [x], {"perm": [axis, *others]}, name=f"{name}/front")[0]
    rows = apply("UniqueRows", [front], attrs, name=f"{name}/rows")
    back = [*range(1, axis + 1), 0, *range(axis + 1, x.rank)]
    y = apply("Transpose", [rows[0]], {"perm": back}, name=name, output_names=[output])[0]
    return [y, *rows[1:4]]
