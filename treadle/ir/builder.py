"""A Python API for writing tensor programs with task mappings.

    with FunctionBuilder("copy") as fb:
        n = fb.symbol("n")
        a = fb.param("a", float32, [n])
        b = fb.param("b", float32, [n])
        for i in fb.range(n, kind="parallel"):
            b[i] = a[i]
    func = fb.function

Loops are Python ``for`` statements over generators that yield their variables once and
record the body when the generator resumes; ``buffer[idx] = value`` stores through the
builder that is active on this thread. Names are made unique, so helpers can be called
repeatedly without clashes.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator, Sequence

from treadle.errors import IRError
from treadle.ir import dtypes
from treadle.ir.dtypes import DataType
from treadle.ir.expr import Buffer, Expr, Var, as_expr
from treadle.ir.functor import free_vars
from treadle.ir.mapping import TaskMapping
from treadle.ir.stmt import (Accumulate, Assert, Barrier, DeclBuffer, Evaluate, For, ForTask,
                             Function, If, Let, Seq, Stmt, Store)

_active = threading.local()


def current_builder() -> FunctionBuilder:
    stack = getattr(_active, "stack", None)
    if not stack:
        raise IRError("no FunctionBuilder is active: write stores and task-mapping loops "
                      "inside `with FunctionBuilder(...) as fb:`")
    return stack[-1]


def seq(stmts: Sequence[Stmt]) -> Stmt:
    """A statement list as one statement, without wrapping a single item."""
    return stmts[0] if len(stmts) == 1 else Seq(tuple(stmts))


class FunctionBuilder:
    def __init__(self, name: str, attrs: dict | None = None):
        self.name = name
        self.attrs = dict(attrs or {})
        self._params: list = []
        self._scopes: list[list[Stmt]] = [[]]
        self._names: set[str] = set()
        self.function: Function | None = None

    def __enter__(self) -> FunctionBuilder:
        if not hasattr(_active, "stack"):
            _active.stack = []
        _active.stack.append(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        _active.stack.pop()
        if exc_type is None:
            self.function = self.finish()

    # ---- names and declarations -------------------------------------------------------
    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self._names:
            name, k = f"{base}_{k}", k + 1
        self._names.add(name)
        return name

    def symbol(self, name: str, dtype: DataType = dtypes.index_type) -> Var:
        """A scalar parameter, typically a symbolic size used in buffer shapes."""
        var = Var(self._declare_param_name(name), dtype)
        self._params.append(var)
        return var

    def add_param(self, param: Buffer | Var) -> Buffer | Var:
        """Makes an existing buffer or scalar variable a parameter, keeping its identity (for
        templates scheduling buffers that compute definitions already refer to)."""
        self._declare_param_name(param.name)
        self._params.append(param)
        return param

    def add_size_symbols(self, sizes: Sequence) -> None:
        """Makes every symbol the sizes name a parameter, in order of name, after the
        buffers (hand-written kernels take their symbolic sizes last)."""
        found = {v for d in sizes for v in free_vars(as_expr(d))}
        for symbol in sorted(found, key=lambda v: v.name):
            self.add_param(symbol)

    @property
    def params(self) -> tuple:
        return tuple(self._params)

    def param(self, name: str, dtype: DataType | str, shape: Sequence) -> Buffer:
        buf = Buffer(self._declare_param_name(name), dtypes.dtype_of(dtype), tuple(shape))
        self._params.append(buf)
        return buf

    def _declare_param_name(self, name: str) -> str:
        if name in self._names:
            raise IRError(f"function {self.name}: parameter name {name!r} is used twice")
        self._names.add(name)
        return name

    def buffer(self, name: str, dtype: DataType | str, shape: Sequence,
               scope: str = "local") -> Buffer:
        buf = Buffer(self.fresh(name), dtypes.dtype_of(dtype), tuple(shape), scope)
        self.emit(DeclBuffer(buf))
        return buf

    def scalar(self, name: str, dtype: DataType | str, init=None) -> Buffer:
        """A mutable local scalar (a rank-0 local buffer); read it with ``x[()]``."""
        buf = self.buffer(name, dtype, ())
        if init is not None:
            self.store(buf, (), init)
        return buf

    def let(self, name: str, value) -> Var:
        value = as_expr(value)
        var = Var(self.fresh(name), value.dtype)
        self.emit(Let(var, value))
        return var

    # ---- statements -------------------------------------------------------------------
    def emit(self, stmt: Stmt) -> None:
        self._scopes[-1].append(stmt)

    def store(self, buffer: Buffer, indices: Sequence, value) -> None:
        self.emit(Store(buffer, tuple(indices), value))

    def accumulate(self, acc: Buffer, op: str, value) -> None:
        """``acc = op(acc, value)`` into a local scalar, in any order (see ``Accumulate``)."""
        self.emit(Accumulate(acc, op, value))

    def barrier(self) -> None:
        self.emit(Barrier())

    def assert_(self, cond, message: str, value=None) -> None:
        self.emit(Assert(as_expr(cond), message, None if value is None else as_expr(value)))

    def evaluate(self, expr: Expr) -> None:
        self.emit(Evaluate(expr))

    def _open(self) -> None:
        self._scopes.append([])

    def _close(self) -> Stmt:
        return seq(self._scopes.pop() or [Seq(())])

    def range(self, extent, kind: str = "serial", name: str = "i") -> Iterator[Var]:
        var = Var(self.fresh(name))
        self._open()
        yield var
        self.emit(For(var, as_expr(extent), self._close(), kind))

    def for_task(self, mapping: TaskMapping, worker: Expr,
                 names: Sequence[str] = ()) -> Iterator[tuple[Var, ...]]:
        rank = len(mapping.task_shape)
        names = list(names) or (["i", "j", "k", "l"][:rank] if rank <= 4
                                else [f"t{d}" for d in range(rank)])
        task_vars = tuple(Var(self.fresh(n)) for n in names)
        self._open()
        yield task_vars
        self.emit(ForTask(mapping, worker, task_vars, self._close()))

    @contextmanager
    def if_(self, cond) -> Iterator[None]:
        if isinstance(cond, bool):  # `i == 0` compares expressions structurally
            raise IRError(f"if_() got the Python bool {cond}; compare IR expressions with "
                          "eq(a, b) / ne(a, b), not == / !=")
        self._open()
        yield
        self.emit(If(as_expr(cond), self._close()))

    @contextmanager
    def else_(self) -> Iterator[None]:
        scope = self._scopes[-1]
        if not scope or not isinstance(scope[-1], If) or scope[-1].otherwise is not None:
            raise IRError("else_() must directly follow an if_() block")
        self._open()
        yield
        body = self._close()
        branch = scope.pop()
        scope.append(If(branch.cond, branch.then, body))

    def finish(self) -> Function:
        if len(self._scopes) != 1:
            raise IRError(f"function {self.name}: a loop or if block was left open")
        return Function(self.name, tuple(self._params), seq(self._scopes[0] or [Seq(())]),
                        self.attrs)
