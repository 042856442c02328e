"""simplify: every expression of a function simplified, and the statements that become
trivial removed: ifs with a constant condition, loops that run zero times or once, empty
and nested sequences.

Expressions are simplified knowing the ranges the program guarantees: a loop variable
lies in ``[0, extent)``, a let variable in the range of its value, a task variable in its
mapping's task shape, and an int64 scalar parameter that appears in the shape of a buffer
parameter is a size, so it is assumed to be >= 0 (other scalar parameters are plain
values and may be negative). Declarations (``Let``, ``DeclBuffer``) scope over the rest
of their sequence, so a nested sequence that declares something is kept as it is.
"""
from __future__ import annotations

from typing import Callable

from treadle.ir.dtypes import index_type
from treadle.ir.expr import Const, Expr, Var, as_expr
from treadle.ir.functor import free_vars, substitute, walk
from treadle.ir.interval import Interval, bound
from treadle.ir.simplify import simplify_expr
from treadle.ir.stmt import (GPU_LOOP_KINDS, Accumulate, Assert, Barrier, DeclBuffer, Evaluate,
                             For, ForTask, Function, If, Let, Seq, Stmt, Store)

__all__ = ["simplify"]

Env = dict[Var, Interval]
EMPTY = Seq(())


def simplify(func: Function) -> Function:
    in_shapes = {v for buf in func.buffers for d in buf.shape for v in free_vars(d)}
    sizes = {v: Interval(0, None) for v in func.symbols
             if v.dtype == index_type and v in in_shapes}
    return func.with_body(_stmt(func.body, sizes))


def _stmt(s: Stmt, env: Env) -> Stmt:
    if type(s) not in STMT_RULES:
        raise TypeError(f"simplify: statement {type(s).__name__} has no entry in STMT_RULES")
    return STMT_RULES[type(s)](s, env)


def _declares(s: Stmt) -> bool:
    return isinstance(s, (Let, DeclBuffer))


def _scoped(s: Stmt) -> Stmt:
    """s in place of a loop or if: a lone declaration must not leak into the parent."""
    return Seq((s,)) if _declares(s) else s


def _seq(s: Seq, env: Env) -> Stmt:
    env = dict(env)  # lets bind for the rest of this sequence only
    items: list[Stmt] = []
    for item in s.stmts:
        new = _stmt(item, env)
        if isinstance(new, Let):
            env[new.var] = bound(new.value, env)
        # Splicing a nested sequence would widen the scope of its declarations.
        spliced = isinstance(new, Seq) and not any(_declares(x) for x in new.stmts)
        items += new.stmts if spliced else [new]
    return items[0] if len(items) == 1 and not _declares(items[0]) else Seq(tuple(items))


def _below(extent: Expr, env: Env) -> Interval:
    """The range of a variable counting up to extent (exclusive)."""
    hi = bound(extent, env).hi
    return Interval(0, None if hi is None else max(hi - 1, 0))


def _for(s: For, env: Env) -> Stmt:
    extent = simplify_expr(s.extent, env)
    if s.kind in GPU_LOOP_KINDS:  # the kernel's launch shape: kept at any extent
        return For(s.var, extent, _stmt(s.body, {**env, s.var: _below(extent, env)}), s.kind)
    hi = bound(extent, env).hi
    if hi is not None and hi <= 0:
        return EMPTY
    # A one-iteration worker loop holding a barrier stays: split_barriers needs it.
    if extent == Const(1, extent.dtype) and not any(isinstance(n, Barrier) for n in walk(s.body)):
        return _scoped(_stmt(substitute(s.body, {s.var: Const(0, s.var.dtype)}), env))
    body = _stmt(s.body, {**env, s.var: _below(extent, env)})
    return EMPTY if body == EMPTY else For(s.var, extent, body, s.kind)


def _for_task(s: ForTask, env: Env) -> Stmt:
    tasks = {v: _below(as_expr(d), env) for v, d in zip(s.vars, s.mapping.task_shape)}
    return ForTask(s.mapping, simplify_expr(s.worker, env), s.vars,
                   _stmt(s.body, {**env, **tasks}))


def _if(s: If, env: Env) -> Stmt:
    cond = simplify_expr(s.cond, env)
    if isinstance(cond, Const):
        branch = s.then if cond.value else s.otherwise
        return EMPTY if branch is None else _scoped(_stmt(branch, env))
    then = _stmt(s.then, env)
    otherwise = None if s.otherwise is None else _stmt(s.otherwise, env)
    otherwise = None if otherwise == EMPTY else otherwise
    return EMPTY if then == EMPTY and otherwise is None else If(cond, then, otherwise)


def _assert(s: Assert, env: Env) -> Stmt:
    cond = simplify_expr(s.cond, env)
    if cond == Const(True, cond.dtype):
        return EMPTY
    value = None if s.value is None else simplify_expr(s.value, env)
    return Assert(cond, s.message, value)


STMT_RULES: dict[type, Callable[[Stmt, Env], Stmt]] = {
    Seq: _seq,
    For: _for,
    ForTask: _for_task,
    If: _if,
    Store: lambda s, env: Store(s.buffer, tuple(simplify_expr(i, env) for i in s.indices),
                                simplify_expr(s.value, env)),
    Accumulate: lambda s, env: Accumulate(s.buffer, s.op, simplify_expr(s.value, env)),
    Let: lambda s, env: Let(s.var, simplify_expr(s.value, env)),
    DeclBuffer: lambda s, env: s,
    Barrier: lambda s, env: s,
    Assert: _assert,
    Evaluate: lambda s, env: Evaluate(simplify_expr(s.expr, env)),
}
