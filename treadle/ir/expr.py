"""Expressions of the tensor-program IR.

Nodes are frozen dataclasses: they compare and hash structurally, so simplifier tables can
match them and passes can memoise on them. Arithmetic and ordering operators build nodes
(``i * 8 + j``, ``i < n``); equality is ``eq(a, b)`` / ``ne(a, b)`` because ``==`` keeps
its structural meaning. Every node computes its dtype on construction, so a type error
surfaces where the expression is written, not in generated C.

Integer ``//`` and ``%`` follow C: the quotient rounds toward zero and the remainder takes
the dividend's sign. Index arithmetic is almost always non-negative, where this agrees
with Python; choosing C's rule keeps generated code a direct transcription.

Float ``min`` and ``max`` are numpy's ``minimum`` and ``maximum``: a NaN operand makes the
result NaN, so every reduction, pooling and clamp built on them propagates NaN as numpy
and ONNX Runtime's element-wise Max and Min do.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from treadle.ir import dtypes
from treadle.ir.dtypes import DataType, index_type

ARITH_OPS = ("+", "-", "*", "/", "//", "%", "min", "max")
COMPARE_OPS = ("<", "<=", ">", ">=", "==", "!=")
LOGIC_OPS = ("and", "or")
BIT_OPS = ("&", "|", "^", "<<", ">>")
UNARY_OPS = ("neg", "not", "~")


class Expr:
    dtype: DataType

    def __add__(self, other): return Binary("+", self, as_expr(other, self.dtype))
    def __radd__(self, other): return Binary("+", as_expr(other, self.dtype), self)
    def __sub__(self, other): return Binary("-", self, as_expr(other, self.dtype))
    def __rsub__(self, other): return Binary("-", as_expr(other, self.dtype), self)
    def __mul__(self, other): return Binary("*", self, as_expr(other, self.dtype))
    def __rmul__(self, other): return Binary("*", as_expr(other, self.dtype), self)
    def __truediv__(self, other): return Binary("/", self, as_expr(other, self.dtype))
    def __rtruediv__(self, other): return Binary("/", as_expr(other, self.dtype), self)
    def __floordiv__(self, other): return Binary("//", self, as_expr(other, self.dtype))
    def __rfloordiv__(self, other): return Binary("//", as_expr(other, self.dtype), self)
    def __mod__(self, other): return Binary("%", self, as_expr(other, self.dtype))
    def __rmod__(self, other): return Binary("%", as_expr(other, self.dtype), self)
    def __lt__(self, other): return Binary("<", self, as_expr(other, self.dtype))
    def __le__(self, other): return Binary("<=", self, as_expr(other, self.dtype))
    def __gt__(self, other): return Binary(">", self, as_expr(other, self.dtype))
    def __ge__(self, other): return Binary(">=", self, as_expr(other, self.dtype))
    def __and__(self, other): return _logic_or_bits("and", "&", self, other)
    def __or__(self, other): return _logic_or_bits("or", "|", self, other)
    def __xor__(self, other): return Binary("^", self, as_expr(other, self.dtype))
    def __lshift__(self, other): return Binary("<<", self, as_expr(other, self.dtype))
    def __rshift__(self, other): return Binary(">>", self, as_expr(other, self.dtype))
    def __neg__(self): return Unary("neg", self)
    def __invert__(self): return Unary("not" if self.dtype.is_bool else "~", self)

    def __bool__(self):
        raise TypeError(f"the truth value of IR expression {self} is not known until run time; "
                        "use builder.if_() or select() instead of Python `if`/`and`/`or`")

    def __str__(self) -> str:
        from treadle.ir.printer import format_expr
        return format_expr(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self}>"


def _logic_or_bits(logic: str, bits: str, a: Expr, b) -> Expr:
    b = as_expr(b, a.dtype)
    return Binary(logic if a.dtype.is_bool else bits, a, b)


@dataclass(frozen=True, eq=True, repr=False)
class Var(Expr):
    name: str
    dtype: DataType = index_type

    def __repr__(self) -> str:
        return f"Var({self.name}: {self.dtype})"


@dataclass(frozen=True, eq=True, repr=False)
class Const(Expr):
    value: Union[int, float, bool]
    dtype: DataType

    def __post_init__(self):
        kind = self.dtype.scalar.kind
        cast = {"float": float, "int": int, "uint": int, "bool": bool}[kind]
        object.__setattr__(self, "value", cast(self.value))

    def __repr__(self) -> str:
        return f"Const({self.value}: {self.dtype})"


@dataclass(frozen=True, eq=True, repr=False)
class Binary(Expr):
    op: str
    a: Expr
    b: Expr
    dtype: DataType = field(init=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "dtype", _binary_dtype(self.op, self.a, self.b))


@dataclass(frozen=True, eq=True, repr=False)
class Unary(Expr):
    op: str
    a: Expr
    dtype: DataType = field(init=False, compare=False)

    def __post_init__(self):
        if self.op not in UNARY_OPS:
            raise ValueError(f"unknown unary op {self.op!r}")
        if self.op == "not" and not self.a.dtype.is_bool:
            raise TypeError(f"logical not of non-bool {self.a}")
        object.__setattr__(self, "dtype", self.a.dtype)


@dataclass(frozen=True, eq=True, repr=False)
class Select(Expr):
    cond: Expr
    then: Expr
    otherwise: Expr
    dtype: DataType = field(init=False, compare=False)

    def __post_init__(self):
        if not self.cond.dtype.scalar.is_bool:
            raise TypeError(f"select condition {self.cond} is {self.cond.dtype}, not bool")
        object.__setattr__(self, "dtype", dtypes.promote(self.then.dtype, self.otherwise.dtype))


@dataclass(frozen=True, eq=True, repr=False)
class Cast(Expr):
    value: Expr
    dtype: DataType


@dataclass(frozen=True, eq=True, repr=False)
class Broadcast(Expr):
    """A scalar repeated over every lane of a vector."""
    value: Expr
    lanes: int
    dtype: DataType = field(init=False, compare=False)

    def __post_init__(self):
        if self.value.dtype.is_vector:
            raise TypeError(f"broadcast of vector {self.value}")
        object.__setattr__(self, "dtype", self.value.dtype.with_lanes(self.lanes))


@dataclass(frozen=True, eq=True, repr=False)
class Load(Expr):
    """``buffer[indices]``; with lanes > 1, that many consecutive elements as a vector."""
    buffer: Buffer
    indices: tuple[Expr, ...]
    lanes: int = 1
    dtype: DataType = field(init=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "indices", tuple(as_expr(i) for i in self.indices))
        # An element of a vector-typed buffer (a register array) is itself a whole vector.
        dtype = self.buffer.dtype if self.lanes == 1 else self.buffer.dtype.with_lanes(self.lanes)
        object.__setattr__(self, "dtype", dtype)


@dataclass(frozen=True, eq=True, repr=False)
class Call(Expr):
    """A call of a primitive function (``exp``, ``fma``, ``reduce_add`` ...)."""
    func: str
    args: tuple[Expr, ...]
    dtype: DataType = field(init=False, compare=False)

    def __post_init__(self):
        from treadle.ir.primitives import lookup
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "dtype", lookup(self.func).result_dtype(self.args))


SCOPES = ("global", "shared", "local")


@dataclass(frozen=True, eq=True, repr=False)
class Buffer:
    """A named, typed, row-major array in a memory scope.

    ``global`` buffers are kernel parameters, ``shared`` ones are visible to all workers of
    a group, ``local`` ones are private to a worker (registers or stack). A rank-0 local
    buffer is a mutable scalar variable.
    """
    name: str
    dtype: DataType
    shape: tuple[Expr, ...]
    scope: str = "global"

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(as_expr(d) for d in self.shape))
        if self.scope not in SCOPES:
            raise ValueError(f"buffer {self.name}: unknown scope {self.scope!r}")
        if self.dtype.is_vector and self.scope == "global":
            raise TypeError(f"global buffer {self.name} must have a scalar dtype")

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __getitem__(self, indices) -> Load:
        return Load(self, _index_tuple(indices))

    def __setitem__(self, indices, value) -> None:
        from treadle.ir.builder import current_builder
        current_builder().store(self, _index_tuple(indices), value)

    def vload(self, indices, lanes: int) -> Load:
        return Load(self, _index_tuple(indices), lanes)

    def __repr__(self) -> str:
        return f"Buffer({self.name}: {self.dtype}{list(self.shape)} {self.scope})"

    def __str__(self) -> str:
        return self.name


def _index_tuple(indices) -> tuple[Expr, ...]:
    items = indices if isinstance(indices, tuple) else (indices,)
    return tuple(as_expr(i) for i in items)


# A dimension of a shape: a size, or an expression of symbols (``seq * 12``).
Dim = Union[int, Expr]


def as_expr(value, dtype: DataType | None = None) -> Expr:
    """Wraps a Python number as a constant, typed like the other operand when given."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return Const(value, dtypes.boolean)
    if isinstance(value, int):
        if dtype is not None and not dtype.scalar.is_bool:
            return Const(value, dtype.scalar)
        return Const(value, index_type)
    if isinstance(value, float):
        if dtype is not None and dtype.scalar.is_float:
            return Const(value, dtype.scalar)
        return Const(value, dtypes.float32)
    if hasattr(value, "dtype") and hasattr(value, "item"):  # numpy scalar
        return Const(value.item(), dtypes.dtype_of(value.dtype))
    raise TypeError(f"cannot use {value!r} ({type(value).__name__}) as an IR expression")


def _binary_dtype(op: str, a: Expr, b: Expr) -> DataType:
    if op in COMPARE_OPS:
        lanes = max(a.dtype.lanes, b.dtype.lanes)
        dtypes.promote(a.dtype, b.dtype)
        return dtypes.boolean.with_lanes(lanes)
    if op in LOGIC_OPS:
        if not (a.dtype.scalar.is_bool and b.dtype.scalar.is_bool):
            raise TypeError(f"logical {op} of non-bool operands {a} and {b}")
        return dtypes.promote(a.dtype, b.dtype)
    if op in BIT_OPS and not (a.dtype.scalar.is_integer and b.dtype.scalar.is_integer):
        raise TypeError(f"bitwise {op} of non-integer operands {a} and {b}")
    if op not in ARITH_OPS + BIT_OPS:
        raise ValueError(f"unknown binary op {op!r}")
    result = dtypes.promote(a.dtype, b.dtype)
    if op in ("//", "%") and not result.scalar.is_integer:
        raise TypeError(f"{op} needs integer operands, got {a.dtype} {a} and {b.dtype} {b}")
    if op == "/" and not result.scalar.is_float:
        raise TypeError(f"/ needs float operands, got {a.dtype} {a} and {b.dtype} {b}; "
                        "use // for integers")
    return result


def const(value, dtype: DataType | str = index_type) -> Const:
    return Const(value, dtypes.dtype_of(dtype))


def _typed_binary(op: str):
    """A builder of ``a op b`` where a Python number b takes a's dtype."""
    def build(a, b) -> Binary:
        a = as_expr(a)
        return Binary(op, a, as_expr(b, a.dtype))
    build.__name__ = {"==": "eq", "!=": "ne", "min": "minimum", "max": "maximum"}[op]
    return build


eq, ne, minimum, maximum = (_typed_binary(op) for op in ("==", "!=", "min", "max"))


def logical_and(*conds) -> Expr:
    result = as_expr(conds[0])
    for c in conds[1:]:
        result = Binary("and", result, as_expr(c))
    return result


def select(cond, then, otherwise) -> Select:
    then = as_expr(then)
    return Select(as_expr(cond), then, as_expr(otherwise, then.dtype))


def cast(value, dtype: DataType | str) -> Expr:
    dtype = dtypes.dtype_of(dtype)
    value = as_expr(value)
    return value if value.dtype == dtype else Cast(value, dtype)


def broadcast(value, lanes: int) -> Broadcast:
    return Broadcast(as_expr(value), lanes)


def call(func: str, *args) -> Call:
    return Call(func, tuple(as_expr(a) for a in args))


def ceil_div(a, b):
    """Ceiling division for non-negative ints or index expressions."""
    if isinstance(a, int) and isinstance(b, int):
        return -(-a // b)
    return (as_expr(a) + (b - 1)) // b
