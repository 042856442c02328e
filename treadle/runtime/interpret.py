"""A numpy interpreter of the tensor-program IR: the second executor.

Tests run kernels here and through the C backend on small sizes and compare the results.
The interpreter follows the IR's meaning, not the lowering passes: a task-mapping loop
evaluates ``mapping.tasks(w)`` in Python, so a bug in ``lower_mapping`` shows up as a
difference instead of being reproduced. Values are numpy scalars of the IR dtype (vectors
are arrays of lanes), so float32 arithmetic stays float32 and integer ``//`` and ``%``
follow C.

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
from typing import Any, Callable, Sequence, Union

import numpy as np

from treadle.errors import IRError, KernelError, ShapeError, UnsupportedOpError
from treadle.ir import dtypes
from treadle.ir.compute import combine
from treadle.ir.dtypes import DataType
from treadle.ir.functor import walk
from treadle.ir.mapping import instantiate
from treadle.ir.expr import (Binary, Broadcast, Buffer, Call, Cast, Const, Expr, Load, Select,
                             Unary, Var, as_expr)
from treadle.ir.primitives import PRIMITIVES
from treadle.ir.stmt import (Accumulate, Assert, Barrier, DeclBuffer, Evaluate, For, ForTask,
                             Function, If, Let, Seq, Stmt, Store, fault_message)
from treadle.runtime.arguments import bind_arguments

# Variables map to numpy scalars or lane arrays, buffers to numpy arrays.
Env = dict[Union[Var, Buffer], Any]


def interpret(func: Function, *arrays: np.ndarray, **symbols: int) -> None:
    """Runs ``func`` on ``arrays`` (its buffer parameters, updated in place); symbols not
    readable from the arrays' shapes are passed by keyword."""
    values = bind_arguments(func, arrays, symbols)
    for buffer in func.buffers:  # refuse unsupported dtypes before the kernel runs
        numpy_type(buffer.dtype)
    env: Env = {var: _convert(value, var.dtype) for var, value in values.items()}
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
    extent = int(_eval(stmt.extent, env))
    if stmt.kind == "parallel" and _has_barrier(stmt.body):
        _run_workers(stmt, extent, env)
        return
    scope = dict(env)
    for i in range(extent):
        scope[stmt.var] = _convert(i, stmt.var.dtype)
        _block((stmt.body,), scope)


def _run_workers(stmt: For, extent: int, env: Env) -> None:
    group = _WorkerGroup(extent)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        scope = {**env, stmt.var: _convert(i, stmt.var.dtype), _GROUP: group}
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
    worker = int(_eval(stmt.worker, env))
    try:
        mapping = instantiate(stmt.mapping, lambda d: int(_eval(as_expr(d), env)))
        tasks = mapping.tasks(worker)
    except (ValueError, TypeError) as err:
        raise IRError(f"task mapping {stmt.mapping!r} on worker {stmt.worker} = {worker}: "
                      f"{err}") from None
    scope = dict(env)
    for task in tasks:
        scope.update((var, _convert(t, var.dtype)) for var, t in zip(stmt.vars, task))
        _block((stmt.body,), scope)


def _if(stmt: If, env: Env) -> None:
    branch = stmt.then if _eval(stmt.cond, env) else stmt.otherwise
    if branch is not None:
        _block((branch,), env)


def _store(stmt: Store, env: Env) -> None:
    array = _lookup(stmt.buffer, env)
    index = _element(stmt.buffer, array, stmt.indices, stmt.value.dtype.lanes, env)
    array[index] = _eval(stmt.value, env)


def _accumulate(stmt: Accumulate, env: Env) -> None:
    _store(Store(stmt.buffer, (), combine(stmt.op, stmt.buffer[()], stmt.value)), env)


def _let(stmt: Let, env: Env) -> None:
    env[stmt.var] = _eval(stmt.value, env)


def _decl_buffer(stmt: DeclBuffer, env: Env) -> None:
    buffer = stmt.buffer
    shape = tuple(int(_eval(d, env)) for d in buffer.shape)
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
    if not _eval(stmt.cond, env):
        value = None if stmt.value is None else int(_eval(stmt.value, env))
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
    Evaluate: lambda s, env: None if is_prefetch(s.expr) else _eval(s.expr, env),
}


def is_prefetch(e: Expr) -> bool:
    """A prefetch is only a hint: its address may lie past the buffer, so it is not read."""
    return isinstance(e, Call) and e.func == "prefetch"


# ---- memory ----------------------------------------------------------------------------

def _lookup(key: Union[Var, Buffer], env: Env):
    try:
        return env[key]
    except KeyError:
        kind = "buffer" if isinstance(key, Buffer) else "variable"
        raise IRError(f"{kind} {key.name} is not defined here (a declaration is visible only "
                      "in the rest of its sequence, and never after a barrier)") from None


def _element(buffer: Buffer, array: np.ndarray, indices: Sequence[Expr], lanes: int,
             env: Env) -> tuple:
    """The numpy index of an access, checked against the bounds: numpy would wrap negative
    indices around where C reads the wrong memory."""
    if len(indices) != buffer.rank:
        raise IRError(f"buffer {buffer.name} has rank {buffer.rank}, accessed with "
                      f"{len(indices)} indices")
    index = [int(_eval(i, env)) for i in indices]
    # An element of a vector-typed buffer is a whole vector; a vector access to a scalar
    # buffer covers `lanes` consecutive elements along the last dimension.
    span = 1 if buffer.dtype.is_vector else lanes
    if span > 1 and buffer.rank == 0:
        raise IRError(f"{span}-lane access to scalar buffer {buffer.name}")
    last = [i + (span - 1 if axis == buffer.rank - 1 else 0) for axis, i in enumerate(index)]
    shape = array.shape[:buffer.rank]
    if not all(0 <= i and j < n for i, j, n in zip(index, last, shape)):
        what = f"{span}-lane access at index" if span > 1 else "index"
        raise ShapeError(f"buffer {buffer.name}: {what} {index} is out of bounds for shape "
                         f"{list(shape)}")
    if span > 1:
        return (*index[:-1], slice(index[-1], index[-1] + span))
    return tuple(index)


# ---- expressions -----------------------------------------------------------------------

def _eval(expr: Expr, env: Env):
    run = EXPR_EVAL.get(type(expr))
    if run is None:
        raise TypeError(f"interpreter table EXPR_EVAL has no entry for {type(expr).__name__}")
    return run(expr, env)


def numpy_type(dtype: DataType) -> np.dtype:
    if dtype.scalar == dtypes.bfloat16:
        raise UnsupportedOpError("the interpreter has no bfloat16 values: numpy stores "
                                 "bfloat16 as raw uint16 bits, so arithmetic would be wrong")
    return dtype.numpy


def _convert(value, dtype: DataType):
    """``value`` as ``dtype`` with C conversion rules: a numpy scalar, or a fresh array of
    lanes for a vector type (a scalar is repeated over the lanes)."""
    target = numpy_type(dtype)
    if dtype.is_vector:
        return np.broadcast_to(value, dtype.lanes).astype(target)
    return target.type(value)


def _as(expr: Expr, dtype: DataType, env: Env):
    value = _eval(expr, env)
    return value if expr.dtype == dtype else _convert(value, dtype)


def _c_div(a, b):
    """Integer division rounding toward zero, element-wise."""
    return (np.abs(a) // np.abs(b)) * (np.sign(a) * np.sign(b))


def _c_mod(a, b):
    """The remainder of ``_c_div``: it takes the sign of the dividend."""
    return a - _c_div(a, b) * b


NUMPY_BINARY: dict[str, Callable] = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide,
    "//": _c_div, "%": _c_mod, "min": np.minimum, "max": np.maximum,
    "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
    "==": np.equal, "!=": np.not_equal, "and": np.logical_and, "or": np.logical_or,
    "&": np.bitwise_and, "|": np.bitwise_or, "^": np.bitwise_xor,
    "<<": np.left_shift, ">>": np.right_shift,
}
NUMPY_UNARY: dict[str, Callable] = {"neg": np.negative, "not": np.logical_not, "~": np.invert}


def _binary(e: Binary, env: Env):
    common = dtypes.promote(e.a.dtype, e.b.dtype).scalar
    a = _as(e.a, common.with_lanes(e.a.dtype.lanes), env)
    # Scalar `and` / `or` short-circuit as in C: `i < n and A[i] > 0` must not load A[n].
    if e.op in ("and", "or") and np.ndim(a) == 0 and bool(a) == (e.op == "or"):
        return a
    b = _as(e.b, common.with_lanes(e.b.dtype.lanes), env)
    if e.op in ("//", "%") and np.any(b == 0):
        raise KernelError(f"integer division by zero in {e}")
    return NUMPY_BINARY[e.op](a, b)


def _select(e: Select, env: Env):
    cond = _eval(e.cond, env)
    if np.ndim(cond) == 0:  # like C's `?:`, evaluate only the chosen side
        return _as(e.then if cond else e.otherwise, e.dtype, env)
    return np.where(cond, _as(e.then, e.dtype, env), _as(e.otherwise, e.dtype, env))


def _load(e: Load, env: Env):
    array = _lookup(e.buffer, env)
    value = array[_element(e.buffer, array, e.indices, e.lanes, env)]
    # A vector is a value, not a view: a later store must not change it.
    return value.copy() if isinstance(value, np.ndarray) else value


def _call(e: Call, env: Env):
    args = [_eval(a, env) for a in e.args]
    return _convert(PRIMITIVES[e.func].numpy(*args), e.dtype)


EXPR_EVAL: dict[type, Callable[[Any, Env], Any]] = {
    Var: _lookup,
    Const: lambda e, env: _convert(e.value, e.dtype),
    Binary: _binary,
    Unary: lambda e, env: NUMPY_UNARY[e.op](_eval(e.a, env)),
    Select: _select,
    Cast: lambda e, env: _convert(_eval(e.value, env), e.dtype),
    Broadcast: lambda e, env: _convert(_eval(e.value, env), e.dtype),
    Load: _load,
    Call: _call,
}
