"""A numpy interpreter of the tensor-program IR: the second executor.

Tests run kernels here and through the C backend on small sizes and compare the results.
The interpreter follows the IR's meaning, not the lowering passes: a task-mapping loop
evaluates ``mapping.tasks(w)`` in Python, so a bug in ``lower_mapping`` shows up as a
difference instead of being reproduced. Expressions are evaluated by ``ir.evaluate``, which
graph-level constant folding shares: values are numpy scalars of the IR dtype, so float32
arithmetic stays float32 and integer ``//`` and ``%`` follow C.

Workers and barriers. A parallel loop whose body contains a barrier is a group of workers
that run together: each iteration runs on its own Python thread and a barrier is a
``threading.Barrier`` over them, so a barrier inside serial loops or ifs in the worker body
means exactly what it means on a GPU. This is independent of ``split_barriers``, which
gets the same meaning on the CPU by loop fission. Workers that disagree about reaching a
barrier raise ``KernelError`` instead of hanging. A barrier outside such a loop is an error.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Sequence

import numpy as np

from treadle.errors import IRError, KernelError
from treadle.ir.compute import combine
from treadle.ir.evaluate import Env, convert, element_index, evaluate_expr, lookup, numpy_type
from treadle.ir.functor import walk
from treadle.ir.mapping import instantiate
from treadle.ir.expr import Call, Expr, as_expr
from treadle.ir.stmt import (Accumulate, Assert, Barrier, DeclBuffer, Evaluate, For, ForTask,
                             Function, If, Let, Seq, Stmt, Store, fault_message)
from treadle.runtime.arguments import bind_arguments


def interpret(func: Function, *arrays: np.ndarray, **symbols: int) -> None:
    """Runs ``func`` on ``arrays`` (its buffer parameters, updated in place); symbols not
    readable from the arrays' shapes are passed by keyword."""
    values = bind_arguments(func, arrays, symbols)
    for buffer in func.buffers:  # refuse unsupported dtypes before the kernel runs
        numpy_type(buffer.dtype)
    env: Env = {var: convert(value, var.dtype) for var, value in values.items()}
    env.update(zip(func.buffers, arrays))
    # C arithmetic: float overflow gives inf and integers wrap, without warnings.
    with np.errstate(all="ignore"):
        execute(func.body, env)


# ---- statements ------------------------------------------------------------------------

def execute(stmt: Stmt, env: Env) -> None:
    """Runs one statement; declarations it makes are added to ``env``."""
    run = STMT_EXEC.get(type(stmt))
    if run is None:
        raise TypeError(f"interpreter table STMT_EXEC has no entry for {type(stmt).__name__}")
    run(stmt, env)


def _block(stmts: Sequence[Stmt], env: Env) -> None:
    """Runs statements in a fresh scope: their declarations vanish at the end."""
    scope = dict(env)
    for stmt in stmts:
        execute(stmt, scope)


# The barrier of the worker group a statement runs in, stored in its environment.
_GROUP = object()
BARRIER_TIMEOUT_S = 30.0


class _WorkerGroup:
    def __init__(self, size: int):
        self.barrier = threading.Barrier(size, timeout=BARRIER_TIMEOUT_S)
        self.finished = 0
        self.lock = threading.Lock()

    def wait(self) -> None:
        with self.lock:
            if self.finished:  # a worker already left, so this barrier can never fill up
                self.barrier.abort()
        self.barrier.wait()

    def leave(self) -> None:
        with self.lock:
            self.finished += 1
            if self.barrier.n_waiting:
                self.barrier.abort()


@functools.lru_cache(maxsize=None)
def _has_barrier(stmt: Stmt) -> bool:
    return any(isinstance(n, Barrier) for n in walk(stmt))


def _for(stmt: For, env: Env) -> None:
    extent = int(evaluate_expr(stmt.extent, env))
    if stmt.kind == "parallel" and _has_barrier(stmt.body):
        _run_workers(stmt, extent, env)
        return
    scope = dict(env)
    for i in range(extent):
        scope[stmt.var] = convert(i, stmt.var.dtype)
        _block((stmt.body,), scope)


def _run_workers(stmt: For, extent: int, env: Env) -> None:
    group = _WorkerGroup(extent)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        scope = {**env, stmt.var: convert(i, stmt.var.dtype), _GROUP: group}
        try:
            with np.errstate(all="ignore"):
                _block((stmt.body,), scope)
        except threading.BrokenBarrierError:
            errors.append(KernelError(f"the workers of loop {stmt.var.name} do not all reach "
                                      "the same barriers"))
        except BaseException as err:  # re-raised on the calling thread below
            errors.append(err)
            group.barrier.abort()
        finally:
            group.leave()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(extent)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise next((e for e in errors if not isinstance(e, KernelError)), errors[0])


def _for_task(stmt: ForTask, env: Env) -> None:
    worker = int(evaluate_expr(stmt.worker, env))
    try:
        mapping = instantiate(stmt.mapping, lambda d: int(evaluate_expr(as_expr(d), env)))
        tasks = mapping.tasks(worker)
    except (ValueError, TypeError) as err:
        raise IRError(f"task mapping {stmt.mapping!r} on worker {stmt.worker} = {worker}: "
                      f"{err}") from None
    scope = dict(env)
    for task in tasks:
        scope.update((var, convert(t, var.dtype)) for var, t in zip(stmt.vars, task))
        _block((stmt.body,), scope)


def _if(stmt: If, env: Env) -> None:
    branch = stmt.then if evaluate_expr(stmt.cond, env) else stmt.otherwise
    if branch is not None:
        _block((branch,), env)


def _store(stmt: Store, env: Env) -> None:
    array = lookup(stmt.buffer, env)
    index = element_index(stmt.buffer, array, stmt.indices, stmt.value.dtype.lanes, env)
    array[index] = evaluate_expr(stmt.value, env)


def _accumulate(stmt: Accumulate, env: Env) -> None:
    _store(Store(stmt.buffer, (), combine(stmt.op, stmt.buffer[()], stmt.value)), env)


def _let(stmt: Let, env: Env) -> None:
    env[stmt.var] = evaluate_expr(stmt.value, env)


def _decl_buffer(stmt: DeclBuffer, env: Env) -> None:
    buffer = stmt.buffer
    shape = tuple(int(evaluate_expr(d, env)) for d in buffer.shape)
    if buffer.dtype.is_vector:
        shape += (buffer.dtype.lanes,)
    target = numpy_type(buffer.dtype)
    # NaN rather than zero, so a kernel that reads memory it never wrote fails here too.
    env[buffer] = np.full(shape, np.nan if target.kind == "f" else 0, target)


def _barrier(stmt: Barrier, env: Env) -> None:
    group = env.get(_GROUP)
    if group is None:
        raise IRError("barrier() outside a parallel worker loop")
    group.wait()


def _assert(stmt: Assert, env: Env) -> None:
    if not evaluate_expr(stmt.cond, env):
        value = None if stmt.value is None else int(evaluate_expr(stmt.value, env))
        raise KernelError(fault_message(stmt.message, value))


STMT_EXEC: dict[type, Callable[[Any, Env], None]] = {
    Seq: lambda s, env: _block(s.stmts, env),
    For: _for,
    ForTask: _for_task,
    If: _if,
    Store: _store,
    Accumulate: _accumulate,
    Let: _let,
    DeclBuffer: _decl_buffer,
    Barrier: _barrier,
    Assert: _assert,
    Evaluate: lambda s, env: None if is_prefetch(s.expr) else evaluate_expr(s.expr, env),
}


def is_prefetch(e: Expr) -> bool:
    """A prefetch is only a hint: its address may lie past the buffer, so it is not read."""
    return isinstance(e, Call) and e.func == "prefetch"
