"""Checks that a tensor program is well formed, between passes and before code generation.

Checked: every variable and buffer is defined before use and not redefined in scope;
index counts match buffer ranks and indices are integers; loop extents are integers and
conditions booleans; accumulators are local scalars; vector accesses fit the buffer's type; task-mapping loops run with
the worker count their mapping has; barriers sit where ``split_barriers`` can place them;
a lowered program has no task-mapping loops left, nor barriers outside GPU threads loops. A failure raises
``IRError`` quoting the statement at fault.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from treadle.errors import IRError
from treadle.ir.expr import Buffer, Expr, Load, Var
from treadle.ir.functor import walk
from treadle.ir.compute import REDUCERS
from treadle.ir.stmt import (Accumulate, Assert, Barrier, DeclBuffer, Evaluate, For, ForTask,
                             Function, If, Let, Seq, Stmt, Store)


@dataclass
class _Scope:
    vars: set = field(default_factory=set)
    buffers: set = field(default_factory=set)
    loop_extents: dict = field(default_factory=dict)  # loop var -> extent
    in_parallel: bool = False
    in_threads: bool = False  # inside a GPU threads loop, where barriers stay after lowering

    def child(self, **changes) -> _Scope:
        scope = _Scope(set(self.vars), set(self.buffers), dict(self.loop_extents),
                       self.in_parallel, self.in_threads)
        for key, value in changes.items():
            setattr(scope, key, value)
        return scope


def verify(func: Function, lowered: bool = False) -> None:
    scope = _Scope()
    for p in func.params:
        _define(scope, p, func.body)
    for buf in func.buffers:
        _check_expr_list(buf.shape, scope, func.body)
    _Verifier(func, lowered).stmt(func.body, scope, barrier_ok=False)


def _define(scope: _Scope, item, where) -> None:
    pool = scope.buffers if isinstance(item, Buffer) else scope.vars
    names = {x.name for x in pool}
    if item.name in names:
        raise IRError(f"'{item.name}' is defined twice in one scope:\n{where}")
    pool.add(item)


def _check_expr_list(exprs, scope: _Scope, where) -> None:
    for e in exprs:
        _check_expr(e, scope, where)


def _check_expr(expr: Expr, scope: _Scope, where) -> None:
    for node in walk(expr):
        if isinstance(node, Var) and node not in scope.vars:
            raise IRError(f"variable '{node.name}' is used before it is defined:\n{where}")
        if isinstance(node, Load):
            _check_access(node.buffer, node.indices, node.lanes, scope, where)


def _check_access(buffer: Buffer, indices, lanes: int, scope: _Scope, where) -> None:
    if buffer not in scope.buffers:
        raise IRError(f"buffer '{buffer.name}' is used before it is declared:\n{where}")
    if len(indices) != buffer.rank:
        raise IRError(f"buffer '{buffer.name}' has rank {buffer.rank} but is indexed with "
                      f"{len(indices)} indices:\n{where}")
    for index in indices:
        if not index.dtype.is_integer:
            raise IRError(f"index {index} of buffer '{buffer.name}' is {index.dtype}:\n{where}")
    if lanes > 1 and buffer.dtype.is_vector:
        raise IRError(f"vector access of {lanes} lanes into vector buffer '{buffer.name}':\n{where}")


class _Verifier:
    def __init__(self, func: Function, lowered: bool):
        self.func = func
        self.lowered = lowered

    def stmt(self, s: Stmt, scope: _Scope, barrier_ok: bool) -> None:
        handler = getattr(self, f"_{type(s).__name__.lower()}", None)
        if handler is None:
            raise IRError(f"verify has no rule for statement {type(s).__name__}")
        handler(s, scope, barrier_ok)

    def _seq(self, s: Seq, scope: _Scope, barrier_ok: bool) -> None:
        inner = scope.child()
        for item in s.stmts:
            self.stmt(item, inner, barrier_ok)

    def _for(self, s: For, scope: _Scope, barrier_ok: bool) -> None:
        _check_expr(s.extent, scope, s)
        if not s.extent.dtype.is_integer:
            raise IRError(f"loop extent {s.extent} is {s.extent.dtype}:\n{s}")
        inner = scope.child(loop_extents={**scope.loop_extents, s.var: s.extent},
                            in_parallel=scope.in_parallel or s.kind in ("parallel", "threads"),
                            in_threads=scope.in_threads or s.kind == "threads")
        _define(inner, s.var, s)
        # A barrier syncs the workers of the nearest parallel (or GPU threads) loop; serial
        # loops between it and the barrier are fine (split_barriers hoists them on the CPU).
        self.stmt(s.body, inner, barrier_ok=inner.in_parallel)

    def _fortask(self, s: ForTask, scope: _Scope, barrier_ok: bool) -> None:
        if self.lowered:
            raise IRError(f"task mapping loop left in lowered function {self.func.name}:\n{s}")
        _check_expr(s.worker, scope, s)
        extent = scope.loop_extents.get(s.worker)
        workers = s.mapping.num_workers
        if extent is not None and extent != workers and not (
                isinstance(workers, int) and getattr(extent, "value", None) == workers):
            raise IRError(f"task mapping {s.mapping!r} has {workers} workers but its worker "
                          f"{s.worker} runs over range({extent}):\n{s}")
        inner = scope.child()
        for v in s.vars:
            _define(inner, v, s)
        self.stmt(s.body, inner, barrier_ok)

    def _if(self, s: If, scope: _Scope, barrier_ok: bool) -> None:
        _check_expr(s.cond, scope, s)
        if s.cond.dtype.is_vector:
            raise IRError(f"if condition {s.cond} is a vector:\n{s}")
        for branch in (s.then, s.otherwise):
            if branch is not None:
                self.stmt(branch, scope.child(), barrier_ok)

    def _store(self, s: Store, scope: _Scope, barrier_ok: bool) -> None:
        _check_expr_list(s.indices, scope, s)
        _check_expr(s.value, scope, s)
        _check_access(s.buffer, s.indices, s.lanes, scope, s)
        if s.buffer.dtype.is_vector and s.value.dtype != s.buffer.dtype:
            raise IRError(f"store of {s.value.dtype} into {s.buffer.dtype} buffer "
                          f"'{s.buffer.name}':\n{s}")

    def _accumulate(self, s: Accumulate, scope: _Scope, barrier_ok: bool) -> None:
        _check_expr(s.value, scope, s)
        _check_access(s.buffer, (), 1, scope, s)
        if s.op not in REDUCERS:
            raise IRError(f"accumulate with unknown reduction {s.op!r}; known: "
                          f"{', '.join(REDUCERS)}:\n{s}")
        if s.buffer.scope != "local" or s.buffer.rank != 0:
            raise IRError(f"accumulator {s.buffer.name} is a {s.buffer.scope} buffer of rank "
                          f"{s.buffer.rank}; accumulate into a local scalar:\n{s}")

    def _let(self, s: Let, scope: _Scope, barrier_ok: bool) -> None:
        _check_expr(s.value, scope, s)
        _define(scope, s.var, s)

    def _declbuffer(self, s: DeclBuffer, scope: _Scope, barrier_ok: bool) -> None:
        _check_expr_list(s.buffer.shape, scope, s)
        _define(scope, s.buffer, s)

    def _barrier(self, s: Barrier, scope: _Scope, barrier_ok: bool) -> None:
        if self.lowered and not scope.in_threads:
            raise IRError(f"barrier left in lowered function {self.func.name} outside a "
                          "GPU threads loop")
        if not barrier_ok:
            raise IRError(f"barrier outside any parallel worker loop in {self.func.name}")

    def _assert(self, s: Assert, scope: _Scope, barrier_ok: bool) -> None:
        _check_expr(s.cond, scope, s)
        if s.value is not None:
            _check_expr(s.value, scope, s)

    def _evaluate(self, s: Evaluate, scope: _Scope, barrier_ok: bool) -> None:
        _check_expr(s.expr, scope, s)

