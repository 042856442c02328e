"""A scheduled kernel as CUDA launches: the rule-based schedule (and whatever fusion added
around a template's program) mapped onto blocks and threads.

A CPU kernel is a sequence of top-level statements; its parallel loops are the work. A
CUDA grid has no barrier across blocks, so each top-level statement that holds work
becomes a launch of its own, in order (the runtime runs them back to back on one stream,
which orders them); the asserts and pure lets before it are repeated in each.

* A template's program (one ``blocks`` loop) is a launch as it stands.
* A parallel loop over rows whose body reduces along the row (softmax's maximum and sum,
  a layer norm's moments: a column loop of one element around a reduction) takes a block
  of one warp per row. The lanes stride over the row's columns and over the reduction's
  innermost loop; the partial results are combined across the warp by shuffles
  (``shfl_xor``, every lane ends with the total), lane 0 stores it, and a barrier makes it
  visible to the lanes that read it next.
* A parallel loop over rows of at least a warp's width of columns is the same without
  reductions: lanes on consecutive columns, so loads and stores coalesce.
* Any other parallel loop is one thread per iteration, in blocks of ``THREADS``.
* Statements outside parallel loops run in a single thread.
"""
from __future__ import annotations

from dataclasses import replace

from treadle.ir.builder import seq
from treadle.ir.compute import combine
from treadle.ir.dtypes import int32
from treadle.ir.expr import (Const, Expr, Var, call, ceil_div, const, eq, logical_and,
                             select)
from treadle.ir.functor import rewrite, substitute, walk
from treadle.ir.stmt import (Accumulate, Assert, Barrier, DeclBuffer, For, Function, If, Let,
                             Seq, Stmt, Store)

THREADS = 256
WARP = 32


def split_launches(func: Function) -> list[Function]:
    """``func`` as the CUDA kernels that compute it, in launch order."""
    items = _dispatch_opened(_statements(func.body))
    preamble: list[Stmt] = []
    work: list[Stmt] = []
    serial: list[Stmt] = []

    def flush_serial():
        if serial:
            work.append(_single_thread(seq(serial)))
            serial.clear()

    for item in items:
        if isinstance(item, Assert) or (isinstance(item, Let) and not work and not serial):
            preamble.append(item)
        elif _is_grid(item):
            flush_serial()
            work.append(item)
        elif isinstance(item, For) and item.kind == "parallel":
            flush_serial()
            work.append(_grid(item))
        else:
            serial.append(item)
    flush_serial()
    if len(work) == 1:
        return [func.with_body(seq(preamble + work))]
    return [Function(f"{func.name}_{k}", func.params, seq(preamble + [stmt]), dict(func.attrs))
            for k, stmt in enumerate(work)]


def _statements(stmt: Stmt) -> list[Stmt]:
    """The kernel's top-level statements, with nested statement lists opened: fusion wraps
    a body it puts epilogues into (an instance norm's statistics and normalisation, its
    padding's borders), and a parallel loop inside would run on a single thread. A list
    that declares a buffer stays whole: its statements share the declaration."""
    if isinstance(stmt, Seq) and not any(isinstance(s, DeclBuffer) for s in stmt.stmts):
        return [s for item in stmt.stmts for s in _statements(item)]
    return [stmt]


def _dispatch_opened(items: list[Stmt]) -> list[Stmt]:
    """The items with each ``If`` whose branches hold grids (DietCode's dispatch between
    variants, ``schedule.dispatch``) opened into the statements of its branches, each
    guarded by the conditions that lead to it (``_guarded``): a grid cannot branch to
    another grid, so each variant is a launch of its own, and those not chosen launch
    no block. The conditions are written over the function's symbols, through the lets
    before them, as a grid's size must be."""
    lets: dict = {}
    found: list[Stmt] = []
    for item in items:
        if isinstance(item, Let):
            lets[item.var] = substitute(item.value, lets)
        found += _opened(item, None, lets) if isinstance(item, If) and _is_grid(item) \
            else [item]
    return found


def _opened(stmt: Stmt, cond: Expr | None, lets: dict) -> list[Stmt]:
    if not (isinstance(stmt, If) and _is_grid(stmt)):
        return [stmt if cond is None else _guarded(stmt, cond)]
    test = substitute(stmt.cond, lets)
    taken = test if cond is None else logical_and(cond, test)
    found = [s for item in _statements(stmt.then) for s in _opened(item, taken, lets)]
    if stmt.otherwise is not None:
        other = ~test if cond is None else logical_and(cond, ~test)
        found += [s for item in _statements(stmt.otherwise) for s in _opened(item, other, lets)]
    return found


def _guarded(stmt: Stmt, cond: Expr) -> Stmt:
    """``stmt`` done only where ``cond`` holds: a grid or parallel loop with no
    iterations elsewhere, a let as it is (pure, and later statements read it), anything
    else inside an ``If``."""
    if isinstance(stmt, Let):
        return stmt
    if isinstance(stmt, For) and stmt.kind == "parallel":
        return replace(stmt, extent=select(cond, stmt.extent, 0))
    if _is_grid(stmt):
        return rewrite(stmt, lambda s: replace(s, extent=select(cond, s.extent, 0))
                       if isinstance(s, For) and s.kind == "blocks" else None)
    return If(cond, stmt)


def _is_grid(stmt: Stmt) -> bool:
    return any(isinstance(s, For) and s.kind == "blocks" for s in walk(stmt))


def _single_thread(body: Stmt) -> Stmt:
    return For(Var("blk"), 1, For(Var("t"), 1, body, "threads"), "blocks")


def _grid(loop: For) -> Stmt:
    if _by_columns(loop.body) and (_row_reductions(loop.body) or _wide_columns(loop.body)):
        return _warp_per_row(loop)
    b, t = Var(f"{loop.var.name}_b"), Var(f"{loop.var.name}_t")
    index = b * THREADS + t
    body = Seq((Let(loop.var, index), If(index < loop.extent, loop.body)))
    return For(b, ceil_div(loop.extent, THREADS), For(t, THREADS, body, "threads"), "blocks")


def _row_items(body: Stmt) -> tuple[Stmt, ...]:
    """The statements of a row: lets and loops along columns, or one reduction (an
    output without columns)."""
    return body.stmts if isinstance(body, Seq) and not _is_reduction(body) else (body,)


def _column_loops(body: Stmt) -> list[For]:
    return [s for s in _row_items(body) if isinstance(s, For)]


def _row_reductions(body: Stmt) -> bool:
    return _is_reduction(body) or any(
        _is_single(c) and any(isinstance(s, Accumulate) for s in walk(c.body))
        for c in _column_loops(body))


def _wide_columns(body: Stmt) -> bool:
    return any(not isinstance(c.extent, Const) or c.extent.value >= WARP
               for c in _column_loops(body))


def _by_columns(body: Stmt) -> bool:
    """Whether each loop of the row runs along its columns (its variable the last index of
    every element it writes) or over one element, so its iterations can go to separate
    lanes; a column reduction (rules._columns) loops over the reduced axes outside."""
    return all(_is_single(c) or all(s.indices and s.indices[-1] == c.var for s in walk(c.body)
                                    if isinstance(s, Store) and s.buffer.scope == "global")
               for c in _column_loops(body))


def _is_single(loop: For) -> bool:
    return isinstance(loop.extent, Const) and loop.extent.value == 1


def _warp_per_row(loop: For) -> Stmt:
    lane = Var(f"{loop.var.name}_lane")
    body = [_row_item(item, lane) for item in _row_items(loop.body)]
    threads = For(lane, WARP, Seq((Let(loop.var, _block_var(loop)), *body)), "threads")
    return For(_block_var(loop), loop.extent, threads, "blocks")


def _block_var(loop: For) -> Var:
    return Var(f"{loop.var.name}_row")


def _row_item(item: Stmt, lane: Var) -> Stmt:
    """One statement of a row's body, spread over the warp's lanes."""
    if _is_reduction(item):
        return _lane_zero_stores(_strided_reduction(item, lane), lane)
    if not isinstance(item, For):
        return item  # a let binding a row value: every lane needs it
    if _is_single(item):
        # The one element of a column: reductions spread over the lanes, the rest on lane 0.
        inner = rewrite(item.body, lambda s: _strided_reduction(s, lane)
                        if _is_reduction(s) else None)
        inner = _lane_zero_stores(inner, lane)
        return Seq((Let(item.var, Const(0, item.var.dtype)), inner, Barrier()))
    jj = Var(f"{item.var.name}_step")
    column = jj * WARP + lane
    return For(jj, ceil_div(item.extent, WARP),
               Seq((Let(item.var, column), If(column < item.extent, item.body))))


def _is_reduction(s: Stmt) -> bool:
    return reduction_parts(s) is not None


def _strided_reduction(s: Seq, lane: Var) -> Stmt:
    """The rules' reduction (declare, initialise, loops, store) with its innermost loop
    strided over the lanes and the lanes' partial results combined by shuffles."""
    decl, init, loops, store = reduction_parts(s)
    acc = decl.buffer
    op = next(n.op for n in walk(loops) if isinstance(n, Accumulate))
    combined = [Store(acc, (), combine(op, acc[()], call("shfl_xor", acc[()], const(m, int32))))
                for m in (16, 8, 4, 2, 1)]
    return Seq((decl, init, _stride_innermost(loops, lane), *combined, store))


def _stride_innermost(loops: Stmt, lane: Var) -> Stmt:
    if isinstance(loops, For) and isinstance(loops.body, For):
        return replace(loops, body=_stride_innermost(loops.body, lane))
    step = Var(f"{loops.var.name}_step")
    index = step * WARP + lane
    return For(step, ceil_div(loops.extent, WARP),
               Seq((Let(loops.var, index), If(index < loops.extent, loops.body))))


def _lane_zero_stores(body: Stmt, lane: Var) -> Stmt:
    """Global stores by lane 0 alone: every lane holds the same value."""
    def visit(node):
        if isinstance(node, Store) and node.buffer.scope == "global":
            return If(eq(lane, 0), node)
        return None
    return rewrite(body, visit)


def reduction_parts(stmt: Stmt) -> tuple[DeclBuffer, Store, Stmt, Store] | None:
    """The parts of one element of a reduction as ``_element`` writes it (the
    accumulator's declaration, its initialisation, the loops accumulating into it, the
    store of the result), for schedules that rearrange them; None for anything else."""
    if not (isinstance(stmt, Seq) and len(stmt.stmts) == 4
            and isinstance(stmt.stmts[0], DeclBuffer)):
        return None
    decl, init, loops, store = stmt.stmts
    accumulates = any(isinstance(n, Accumulate) and n.buffer == decl.buffer for n in walk(loops))
    return (decl, init, loops, store) if accumulates else None
