"""Statements, functions and modules of the tensor-program IR.

Declarations (``Let``, ``DeclBuffer``) behave like C declarations: they are items of a
``Seq`` and are in scope for the rest of it. Loops always run from 0 to ``extent``.
``ForTask`` is the task-mapping loop written by programmers; ``lower_mapping`` turns it
into ordinary loops and index arithmetic before code generation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from treadle.ir.expr import Buffer, Expr, Var, as_expr

# "blocks" and "threads" are a GPU's workers: the iterations of a blocks loop are the
# blocks of a grid, those of a threads loop (inside it) the threads of one block.
LOOP_KINDS = ("serial", "parallel", "unroll", "vectorize", "blocks", "threads")
GPU_LOOP_KINDS = ("blocks", "threads")


class Stmt:
    def __str__(self) -> str:
        from treadle.ir.printer import format_stmt
        return format_stmt(self)


@dataclass(frozen=True, eq=True, repr=False)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]


@dataclass(frozen=True, eq=True, repr=False)
class For(Stmt):
    var: Var
    extent: Expr
    body: Stmt
    kind: str = "serial"

    def __post_init__(self):
        object.__setattr__(self, "extent", as_expr(self.extent))
        if self.kind not in LOOP_KINDS:
            raise ValueError(f"loop over {self.var.name}: unknown kind {self.kind!r}; "
                             f"expected one of {LOOP_KINDS}")


@dataclass(frozen=True, eq=True, repr=False)
class ForTask(Stmt):
    """``for vars in mapping.on(worker): body`` before lowering."""
    mapping: Any  # treadle.ir.mapping.TaskMapping
    worker: Expr
    vars: tuple[Var, ...]
    body: Stmt

    def __post_init__(self):
        object.__setattr__(self, "worker", as_expr(self.worker))
        if len(self.vars) != len(self.mapping.task_shape):
            raise ValueError(f"task mapping {self.mapping} has {len(self.mapping.task_shape)} "
                             f"dimensions but {len(self.vars)} loop variables were given")


@dataclass(frozen=True, eq=True, repr=False)
class If(Stmt):
    cond: Expr
    then: Stmt
    otherwise: Optional[Stmt] = None

    def __post_init__(self):
        if not self.cond.dtype.is_bool:
            raise TypeError(f"if condition {self.cond} is {self.cond.dtype}, not bool")


@dataclass(frozen=True, eq=True, repr=False)
class Store(Stmt):
    """``buffer[indices] = value``; a vector value stores its lanes consecutively."""
    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr

    def __post_init__(self):
        object.__setattr__(self, "indices", tuple(as_expr(i) for i in self.indices))
        value = as_expr(self.value, self.buffer.dtype)
        if value.dtype.scalar != self.buffer.dtype.scalar:
            raise TypeError(f"store of {value.dtype} value into {self.buffer.dtype} buffer "
                            f"{self.buffer.name}; cast it explicitly")
        object.__setattr__(self, "value", value)

    @property
    def lanes(self) -> int:
        """Consecutive scalar elements written: >1 for a vector stored into a scalar buffer."""
        return 1 if self.buffer.dtype.is_vector else self.value.dtype.lanes


@dataclass(frozen=True, eq=True, repr=False)
class Accumulate(Stmt):
    """``buffer = op(buffer, value)`` into a local scalar (``op`` a reduction of
    ``treadle.ir.compute.REDUCERS``), in whatever order and grouping the enclosing loops
    like. A ``vectorize`` loop around it becomes a reduction loop, keeping one partial
    result per vector lane: a float sum then rounds differently from the sequential order;
    max and min are exact."""
    buffer: Buffer
    op: str
    value: Expr

    def __post_init__(self):
        value = as_expr(self.value, self.buffer.dtype)
        if value.dtype != self.buffer.dtype:
            raise TypeError(f"accumulate of {value.dtype} value into {self.buffer.dtype} "
                            f"accumulator {self.buffer.name}; cast it explicitly")
        object.__setattr__(self, "value", value)


@dataclass(frozen=True, eq=True, repr=False)
class Let(Stmt):
    """Binds an immutable variable for the rest of the enclosing Seq."""
    var: Var
    value: Expr

    def __post_init__(self):
        if self.var.dtype != self.value.dtype:
            raise TypeError(f"let {self.var.name}: {self.var.dtype} bound to "
                            f"{self.value.dtype} value {self.value}")


@dataclass(frozen=True, eq=True, repr=False)
class DeclBuffer(Stmt):
    """Declares a shared or local buffer for the rest of the enclosing Seq."""
    buffer: Buffer

    def __post_init__(self):
        if self.buffer.scope == "global":
            raise ValueError(f"buffer {self.buffer.name}: global buffers are function "
                             "parameters, not declarations")


@dataclass(frozen=True, eq=True, repr=False)
class Barrier(Stmt):
    """Every worker of the enclosing worker loop reaches this point before any goes on."""


@dataclass(frozen=True, eq=True, repr=False)
class Assert(Stmt):
    """Fails the kernel with ``message`` unless ``cond`` holds; a ``value`` (an integer
    the kernel computes, such as an offending index) replaces ``{value}`` in the message."""
    cond: Expr
    message: str
    value: Optional[Expr] = None


def fault_message(message: str, value: Optional[int]) -> str:
    """An ``Assert``'s message with the value the kernel reported in place of ``{value}``."""
    return message if value is None else message.replace("{value}", str(value))


@dataclass(frozen=True, eq=True, repr=False)
class Evaluate(Stmt):
    expr: Expr


Param = Union[Buffer, Var]


@dataclass(frozen=True, eq=True, repr=False)
class Function:
    """A kernel: buffers and scalar symbols as parameters, one body.

    Scalar ``Var`` parameters are the symbolic sizes (and other scalars) the caller binds
    at run time; they may appear in the shapes of buffer parameters.
    """
    name: str
    params: tuple[Param, ...]
    body: Stmt
    attrs: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        return tuple(p for p in self.params if isinstance(p, Buffer))

    @property
    def symbols(self) -> tuple[Var, ...]:
        return tuple(p for p in self.params if isinstance(p, Var))

    def with_body(self, body: Stmt) -> Function:
        return Function(self.name, self.params, body, dict(self.attrs))

    def __str__(self) -> str:
        from treadle.ir.printer import format_function
        return format_function(self)


@dataclass(frozen=True, repr=False)
class Module:
    name: str
    functions: tuple[Function, ...]

    def __str__(self) -> str:
        return "\n\n".join(str(f) for f in self.functions)
