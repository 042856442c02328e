"""The CPU template for sliding-window reductions: depthwise and grouped convolution,
pooling, any reduction whose reduce domain is a small constant window (at most
``MAX_WINDOW`` points, ``MAX_WINDOW_2D`` over several axes) and whose last output axis
has a static extent.

The rule-based schedule runs the window innermost for each output element, so nothing
vectorises and padding costs a select and two clamps per tap. Here a thread takes whole
output rows (every axis but the last): the row's accumulators live in a local buffer, the
window's outer axes loop around a loop along the row, and the last window axis is
unrolled inside that loop, so the compiler vectorises along the row with the taps'
weights in registers. The row splits into a left border, an interior and a right border;
in the interior, interval simplification proves the padding selects and index clamps away
(they are the compute's own expression, nothing convolution-specific is matched), which
leaves plain strided loads. Where the row is one pixel's channels (channels-last), no
check varies along it: the kernel branches per row on the padding checks and sums every
tap in one pass, with no select left (_one_pass).

Each element still combines its taps in the compute's order, starting from the
identity, so results equal the rule-based schedule's bit for bit. Loads of inputs and
stores of the output stay scalar; the output is written once per element, never read.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

from treadle.ir.compute import Compute, combine, identity_of, producer_of, reachable
from treadle.ir.expr import Binary, Buffer, Const, Expr, Load, Select, Var, as_expr
from treadle.ir.functor import free_vars, rewrite, substitute, walk
from treadle.ir.interval import Interval
from treadle.ir.mapping import unravel
from treadle.ir.simplify import simplify_expr
from treadle.ir.stmt import Assert, DeclBuffer, For, Function, If, Let, Seq, Stmt, Store
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import Inliner, canonical_kernel, split_epilogue

# Window points (see _too_many_points): a 1-D reduction longer than MAX_WINDOW is a row's
# sum, better vectorised along itself by the rule-based loops; 2-D windows up to 13 x 13
# (MixNet's mixed depthwise kernels) are windows. Larger ones with a long last axis are
# left to GEMM or the rule-based loops.
MAX_WINDOW, MAX_WINDOW_2D = 64, 169
MAX_ROW_BYTES = 1 << 14  # the row of accumulators, on each thread's stack
MAX_BORDER = 16  # output positions searched from each end of a row for the interior
MAX_UNROLLED = 16  # window points summed in one pass along the row (see _one_pass)
MAX_CHECKS = 4  # padding checks a one-pass kernel branches on: 2 ** MAX_CHECKS passes


@dataclass(frozen=True)
class WindowPattern:
    """``output`` is ``epilogue`` (over the reduction's axes, reading the reduction at
    exactly those axes) of ``reduction``, whose value ``window`` reads only inputs."""
    reduction: Compute
    window: Expr
    output: Buffer
    epilogue: Expr


def match_window(out: Compute) -> WindowPattern | None:
    split = split_epilogue(out)
    if split is None:
        return None
    red, epilogue = split
    window = Inliner(reachable([red]))(red.value)
    if any(producer_of(n.buffer) is not None for n in walk(window) if isinstance(n, Load)):
        return None
    extents = red.reduce_extents
    if not red.shape or not extents or not all(isinstance(e, Const) for e in extents):
        return None
    width = red.shape[-1]
    if (_too_many_points(extents)
            or not isinstance(width, Const)
            or width.value * red.dtype.nbytes > MAX_ROW_BYTES
            or red.axes[-1] not in free_vars(window)):
        return None
    return WindowPattern(red, window, out.buffer, epilogue)


def _too_many_points(extents: Sequence[Const]) -> bool:
    """Whether a window is too large for the template: its passes along the row unroll
    the last axis, which must be short (a 1-D reduction longer than MAX_WINDOW is a
    row's sum); over several axes, the outer ones loop, so any number of them is a
    window where the last axis is MAX_UNROLLED points at most (a convolution to a few
    channels: 32 channels x 9 x 9 taps), else up to MAX_WINDOW_2D points."""
    points = math.prod(e.value for e in extents)
    if len(extents) == 1:
        return points > MAX_WINDOW
    return points > MAX_WINDOW_2D and extents[-1].value > MAX_UNROLLED


def sliding_window(out: Compute) -> bool:
    """Whether ``out`` is a window the template takes that slides along the row (more
    than one tap on the last axis): a convolution's, not a 1 x 1 one's. For a product
    narrower than a GEMM's columns the window's passes beat the GEMM, which would pack
    every tap of every pixel for the few output channels to read: a 3 x 3 convolution
    from 256 to 6 channels ran in 0.55 ms here and 2.6 ms as a GEMM; a 1 x 1 one reads
    each pixel once either way, and the GEMM was faster."""
    window = match_window(out)
    return window is not None and window.reduction.reduce_extents[-1].value > 1


def schedule_window(name: str, inputs: Sequence[Buffer | None], pattern: WindowPattern,
                    checks: Sequence[tuple[Expr, str]] = ()) -> Kernel:
    """The window kernel for ``pattern``; ``checks`` are the operator's run-time
    conditions on symbolic sizes, asserted before any work."""
    red = pattern.reduction
    *outer_shape, width = red.shape
    row = Var("row")
    rows = math.prod(outer_shape, start=as_expr(1))
    body: list[Stmt] = [Let(a, i) for a, i in zip(red.axes[:-1], unravel(row, outer_shape))]
    body.append(_one_pass(pattern) or _row_of_accumulators(pattern))
    stmts: list[Stmt] = [Assert(cond, message) for cond, message in checks]
    stmts.append(For(row, rows, Seq(tuple(body)), "parallel"))
    body_stmt = Seq(tuple(stmts))
    used = {n.buffer for n in walk(body_stmt) if isinstance(n, Load)}
    params: list = [b for b in inputs if b is not None and b in used] + [pattern.output]
    bound = {n.var for n in walk(body_stmt) if isinstance(n, (For, Let))}
    symbols = {v for p in params for d in p.shape for v in free_vars(d)}
    symbols |= free_vars(body_stmt) - bound
    func = Function(name, tuple(params) + tuple(sorted(symbols, key=lambda v: v.name)), body_stmt)
    return canonical_kernel(func, inputs, 1)


def _row_of_accumulators(pattern: WindowPattern) -> Stmt:
    """The row's accumulators in a local buffer, the window's outer axes looping around
    passes along the row, the epilogue stored in a last pass."""
    red = pattern.reduction
    col, width = red.axes[-1], red.shape[-1]
    acc = Buffer(f"{red.name}_row", red.dtype, (width,), "local")
    identity = identity_of(red.reduce_op, red.dtype)
    return Seq((DeclBuffer(acc), For(col, width, Store(acc, (col,), identity)),
                _window_loops(pattern, acc), For(col, width, _store(pattern, acc[(col,)]))))


def _store(pattern: WindowPattern, value: Expr) -> Store:
    """The output's element at the reduction's axes: the epilogue of ``value``."""
    red = pattern.reduction
    result = rewrite(pattern.epilogue, lambda n: value if isinstance(n, Load)
                     and n.buffer == red.buffer else None)
    return Store(pattern.output, red.axes, result)


def _one_pass(pattern: WindowPattern) -> Stmt | None:
    """Where no padding check depends on the row's axis (a channels-last depthwise
    convolution or pooling: a row is one pixel's channels), each check holds or fails for
    the whole row: the kernel branches on the checks (at most MAX_CHECKS of them), and in
    each branch the whole window is unrolled in one pass along the row, each select
    resolved — a tap outside the input reads no input, its padding value stands in.
    Each element's taps are summed in registers, in the compute's order, and stored
    through the epilogue. None where a check varies along the row or holds a select, or
    there are too many checks or window points."""
    red = pattern.reduction
    col, width = red.axes[-1], red.shape[-1]
    points = list(itertools.product(*(range(e.value) for e in red.reduce_extents)))
    if len(points) > MAX_UNROLLED:
        return None
    ranges = _ranges(red)
    taps = [simplify_expr(substitute(pattern.window,
                                     dict(zip(red.reduce_axes, map(as_expr, point)))), ranges)
            for point in points]
    checks = list(dict.fromkeys(atom for tap in taps for n in walk(tap)
                                if isinstance(n, Select) for atom in _conjuncts(n.cond)))
    # A check that holds a select itself (a scatter's wrapped index compared with the
    # position) would be rewritten while resolving its own select: such taps stay rolled.
    if (len(checks) > MAX_CHECKS or any(col in free_vars(c) for c in checks)
            or any(isinstance(n, Select) for c in checks for n in walk(c))):
        return None

    def row_pass(holds: dict[Expr, bool]) -> Stmt:
        value = identity_of(red.reduce_op, red.dtype)
        for tap in taps:
            value = combine(red.reduce_op, value, rewrite(tap, lambda n: _resolved(n, holds)))
        return For(col, width, _store(pattern, value), "vectorize")

    def branches(holds: dict[Expr, bool]) -> Stmt:
        if len(holds) == len(checks):
            return row_pass(holds)
        check = checks[len(holds)]
        return If(check, branches({**holds, check: True}), branches({**holds, check: False}))
    return branches({})


def _resolved(node: Expr, holds: dict[Expr, bool]) -> Expr | None:
    """A select whose checks are all decided: its branch, with that branch resolved."""
    if not isinstance(node, Select):
        return None
    taken = all(holds[atom] for atom in _conjuncts(node.cond))
    return rewrite(node.then if taken else node.otherwise, lambda n: _resolved(n, holds))


def _conjuncts(cond: Expr) -> list[Expr]:
    """The conditions ``cond`` is the conjunction of."""
    if isinstance(cond, Binary) and cond.op == "and":
        return _conjuncts(cond.a) + _conjuncts(cond.b)
    return [cond]


def _ranges(red: Compute) -> dict[Var, Interval]:
    """What interval simplification may assume: every axis within its extent."""
    axes = list(zip(red.axes, red.shape)) + list(zip(red.reduce_axes, red.reduce_extents))
    return {v: Interval(0, e.value - 1 if isinstance(e, Const) else None) for v, e in axes}


def _window_loops(pattern: WindowPattern, acc: Buffer) -> Stmt:
    """Loops over the window's outer axes around the three segments of the row."""
    red = pattern.reduction
    col, width = red.axes[-1], red.shape[-1].value
    ranges = _ranges(red)
    lo, hi = _interior(pattern.window, col, width, ranges)
    unrolled = _unrolled_axes(red) if _plain_interior(pattern.window, col, lo, hi, ranges) \
        else 1
    segments = [(0, lo, "serial"), (lo, hi, "vectorize"), (hi, width, "serial")]
    stmt: Stmt = Seq(tuple(_segment(pattern, acc, ranges, unrolled, *s)
                           for s in segments if s[0] < s[1]))
    outer = list(zip(red.reduce_axes, red.reduce_extents))[:len(red.reduce_axes) - unrolled]
    for var, extent in reversed(outer):
        stmt = For(var, extent, stmt)
    return stmt


def _plain_interior(window: Expr, col: Var, lo: int, hi: int,
                    ranges: dict[Var, Interval]) -> bool:
    """Whether the interior of the row reads the window without a select: gcc vectorises
    a pass of several selecting taps no more (MixNet's channels-last 5 x 5 depthwise
    convolutions, five padded taps a pass: 4.5x slower than one a pass)."""
    if lo >= hi:
        return False
    inside = simplify_expr(window, {**ranges, col: Interval(lo, hi - 1)})
    return not any(isinstance(n, Select) for n in walk(inside))


def _unrolled_axes(red: Compute) -> int:
    """How many of the window's last axes a pass along the row unrolls: the last one,
    and the ones before it while the pass sums at most MAX_UNROLLED taps. Each pass
    loads and stores the row's accumulators once, so a 3 x 3 convolution's taps summed
    three to a pass spent as many memory accesses on them as on the input (a 64 to 4
    channel convolution ran at half the speed of the same one as a GEMM)."""
    count, taps = 1, red.reduce_extents[-1].value
    for extent in reversed(red.reduce_extents[:-1]):
        if taps * extent.value > MAX_UNROLLED:
            break
        count, taps = count + 1, taps * extent.value
    return count


def _segment(pattern: WindowPattern, acc: Buffer, ranges: dict[Var, Interval], unrolled: int,
             begin: int, end: int, kind: str) -> Stmt:
    """``acc[col] = op(acc[col], tap)`` for every position of the ``unrolled`` last window
    axes, in the compute's order, for ``col`` in ``begin..end``, each tap simplified for
    that range."""
    red = pattern.reduction
    col, taps = red.axes[-1], red.reduce_axes[-unrolled:]
    known = {**ranges, col: Interval(begin, end - 1)}
    value = acc[(col,)]
    for point in itertools.product(*(range(e.value) for e in red.reduce_extents[-unrolled:])):
        at = dict(zip(taps, map(as_expr, point)))
        value = combine(red.reduce_op, value,
                        simplify_expr(substitute(pattern.window, at), known))
    offset = Var(f"{col.name}_offset")
    update = Seq((Let(col, offset + begin), Store(acc, (col,), value)))
    return For(offset, end - begin, update, kind)


def _interior(window: Expr, col: Var, width: int, ranges: dict[Var, Interval]) -> tuple[int, int]:
    """The widest range ``lo..hi`` (exclusive) of ``col`` where the window simplifies to an
    expression with no select or clamp depending on ``col``; (0, 0) if none is found
    within MAX_BORDER positions of either end."""
    def clean(lo: int, hi: int) -> bool:
        value = simplify_expr(window, {**ranges, col: Interval(lo, hi - 1)})
        return not any(col in free_vars(n.cond if isinstance(n, Select) else n)
                       for n in walk(value) if isinstance(n, Select)
                       or (isinstance(n, Binary) and n.op in ("min", "max")))
    lo = next((v for v in range(min(width, MAX_BORDER)) if clean(v, v + 1)), None)
    if lo is None:
        return 0, 0
    hi = next((v + 1 for v in range(width - 1, max(lo, width - MAX_BORDER) - 1, -1)
               if clean(v, v + 1)), None)
    if hi is None or not clean(lo, hi):
        return 0, 0
    return lo, hi
