"""C-family code generation for lowered tensor programs: the printer every C-like target
shares (GNU C11 and GCC vector extensions), as tables a target extends.

ABI. Each ``Function`` becomes ``int32_t kernel_<name>(<params in order>)`` (see
``c_name``): a buffer parameter is a ``restrict`` pointer to its element type, ``const``
when the kernel never stores to it, a scalar parameter has its C type. The kernel returns
0, or k when its k-th ``Assert`` failed; the NULL-terminated ``const char
*<symbol>__messages[]`` holds the assert messages so the runtime can raise them. Buffers
are row-major and indexed by flattening with their (possibly symbolic) shape.

A target is a subclass of ``CPrinter`` whose tables (``EXPR_PRINTERS``, ``CALL_PRINTERS``,
``STMT_PRINTERS``, ``LOOP_PRINTERS``) are the base ones with entries added or replaced, and
whose ``PREAMBLE`` is C it needs before the kernels; ``generate`` prints with one. Here
loops are serial or unrolled; the CPU target (``backend.cpu``) adds parallel and simd
loops and the intrinsics. A failure inside a loop a target prints specially (a parallel
body, an ``omp simd`` loop) cannot ``return`` from the kernel: an ``Assert`` there stores
its code in ``treadle_status`` and jumps to the end of the iteration; after the loop the
status is passed outward (``CPrinter.special_loop``).

Expressions get the parentheses C's precedence needs, plus a few for readability. Where
C's implicit conversions would compute in another type than the IR says (narrow integers
promote to int, same-width mixed signedness goes unsigned, two small int64 literals
multiply as int), the printer adds the cast.
"""
from __future__ import annotations

import math
from typing import Callable, ClassVar, Sequence

import numpy as np

from treadle.backend.c_names import Namer, kernel_symbol
from treadle.backend.c_prelude import Prelude, c_scalar_type
from treadle.errors import IRError
from treadle.ir import dtypes
from treadle.ir.dtypes import DataType
from treadle.ir.expr import (BIT_OPS, COMPARE_OPS, LOGIC_OPS, Binary, Broadcast, Buffer, Call,
                             Cast, Const, Expr, Load, Select, Unary, Var, as_expr)
from treadle.ir.functor import walk
from treadle.ir.simplify import simplify_expr
from treadle.ir.compute import combine
from treadle.ir.stmt import (Accumulate, Assert, Barrier, DeclBuffer, Evaluate, For, ForTask,
                             Function, If, Let, Seq, Stmt, Store)

PRIMARY, UNARY, TERNARY = 16, 15, 3  # C precedence levels; higher binds tighter

# IR binary op -> (C operator, precedence), after C11 6.5.
C_BINARY = {
    "*": ("*", 13), "/": ("/", 13), "//": ("/", 13), "%": ("%", 13),
    "+": ("+", 12), "-": ("-", 12), "<<": ("<<", 11), ">>": (">>", 11),
    "<": ("<", 10), "<=": ("<=", 10), ">": (">", 10), ">=": (">=", 10),
    "==": ("==", 9), "!=": ("!=", 9), "&": ("&", 8), "^": ("^", 7), "|": ("|", 6),
    "and": ("&&", 5), "or": ("||", 4),
}
C_UNARY = {"neg": "-", "~": "~", "not": "!"}
WIDENED_OPS = ("+", "-", "*", "//", "%", "<<", ">>", "&", "|", "^")  # C computes these in int
SHIFT_OPS = ("<<", ">>")

# libm functions by primitive; float32 calls the f-suffixed one.
LIBM = {"exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "erf": "erf",
        "sin": "sin", "cos": "cos", "floor": "floor", "ceil": "ceil", "round": "rint",
        "pow": "pow", "fmod": "fmod",
        **{f: f for f in ("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
                          "atanh")}}
# Functions generated code calls, so no local may shadow them.
CALLED = {name + suffix for name in (*LIBM.values(), "fabs", "fma") for suffix in ("", "f")}

# uint32 / uint64 literals keep their type; narrower ones promote to int anyway.
UNSIGNED_SUFFIX = {32: "U", 64: "UL"}

MAX_STACK_BYTES = 1 << 20  # a larger local array would overflow a thread's stack
UNROLL_CAP = 64



def c_name(func: Function) -> str:
    """The exported C symbol of ``func``."""
    return kernel_symbol(func.name)


def messages_symbol(func: Function) -> str:
    """The symbol of ``func``'s NULL-terminated table of assert messages."""
    return c_name(func) + "__messages"


def fault_symbol(func: Function) -> str:
    """The int64 where ``func`` leaves the value of its last failed ``Assert`` that has one
    (shared by concurrent calls: under a race it holds some call's offending value)."""
    return c_name(func) + "__fault"


def generate(functions: Sequence[Function], printer: type[CPrinter] | None = None) -> str:
    """One C source file defining every function of ``functions`` (already lowered), in
    the dialect of ``printer`` (this module's plain C by default)."""
    printer = printer or CPrinter
    prelude = printer.PRELUDE()
    owners: dict[str, str] = {}
    parts = []
    for func in functions:
        symbol = c_name(func)
        if symbol in owners:
            raise IRError(f"functions {owners[symbol]!r} and {func.name!r} would both be C "
                          f"symbol {symbol}; give them distinct names")
        owners[symbol] = func.name
        parts.append(printer(func, prelude).print())
    preamble = [printer.PREAMBLE] if printer.PREAMBLE else []
    return "\n\n".join(["/* Generated by treadle. */", prelude.text(), *preamble, *parts]) + "\n"


# Bytes that stand for themselves in a C string literal: printable ASCII except the quote,
# the backslash and `?` (trigraphs).
_PLAIN_BYTES = frozenset(bytes(range(32, 127))) - frozenset(b'"\\?')


def c_string(text: str) -> str:
    """A C string literal holding ``text`` (UTF-8), every other byte escaped in octal."""
    return '"' + "".join(chr(b) if b in _PLAIN_BYTES else f"\\{b:03o}"
                         for b in text.encode("utf-8")) + '"'


# ---- literals ---------------------------------------------------------------------------

def _float_literal(value: float, dtype: DataType) -> str:
    cast = "" if dtype == dtypes.float32 else f"({c_scalar_type(dtype)})"
    if math.isnan(value) or math.isinf(value):
        special = "NAN" if math.isnan(value) else "-INFINITY" if value < 0 else "INFINITY"
        return cast + special
    if dtype == dtypes.float64:
        return repr(float(value))
    # float16 values are exact in float32, so the float literal converts without error.
    rounded = np.float16(value) if dtype == dtypes.float16 else value
    return f"{cast}{np.float32(rounded)}f"


def _literal(value, dtype: DataType) -> str:
    if dtype.is_bool:
        return "true" if value else "false"
    if dtype == dtypes.bfloat16:
        return hex(int(dtypes.bfloat16_bits(value)))
    if dtype.is_float:
        return _float_literal(value, dtype)
    if dtype.kind == "uint":
        return str(value) + UNSIGNED_SUFFIX.get(dtype.bits, "")
    if dtype.bits >= 32 and value == -(1 << (dtype.bits - 1)):
        return f"INT{dtype.bits}_MIN"  # the literal's magnitude would not fit the type
    return str(value)


# ---- expressions ------------------------------------------------------------------------

def _const(p: CPrinter, e: Const):
    if e.dtype.is_vector:
        return p.call(p.helper("broadcast", e.dtype), _literal(e.value, e.dtype.scalar))
    text = _literal(e.value, e.dtype)
    return text, UNARY if text[0] in "-(" else PRIMARY


def _c_narrow(e: Expr) -> bool:
    """Whether C computes ``e`` in fewer than 64 bits: a narrower type, or a bare int64
    literal that fits in int."""
    if isinstance(e, Const) and e.dtype == dtypes.int64:
        return -(1 << 31) < e.value < (1 << 31)
    if isinstance(e, Unary):
        return _c_narrow(e.a)
    if isinstance(e, Select):
        return _c_narrow(e.then) and _c_narrow(e.otherwise)
    return e.dtype.bits < 64 and not e.dtype.is_float


def _clarify(parent: str, child: Expr) -> bool:
    """Parentheses C does not need but readers (and gcc -Wparentheses) want."""
    if not isinstance(child, Binary) or child.op == parent or child.op not in C_BINARY:
        return False
    return (parent in BIT_OPS or (parent == "or" and child.op == "and")
            or (parent in ("==", "!=") and child.op in COMPARE_OPS))


def _binary(p: CPrinter, e: Binary):
    p.no_bfloat16(e, e.a, e.b)
    if e.op in ("min", "max"):
        return p.call(p.helper(e.op, e.dtype), p.text_as(e.a, e.dtype), p.text_as(e.b, e.dtype))
    if e.dtype.is_vector and (e.op in COMPARE_OPS + LOGIC_OPS or e.op in ("//", "%")):
        raise IRError(f"{e}: operator {e.op} is not supported for vector dtype {e.dtype}")
    if e.op in ("//", "%") and not (isinstance(e.b, Const) and e.b.value not in (0, -1)):
        name = p.helper("div" if e.op == "//" else "mod", e.dtype)
        return p.call(name, p.text_as(e.a, e.dtype), p.text_as(e.b, e.dtype))
    op, prec = p.table(C_BINARY, e.op, "C_BINARY")
    operand_type = dtypes.promote(e.a.dtype, e.b.dtype) if e.op in COMPARE_OPS else e.dtype
    left = p.operand(e.a, operand_type, prec, e.op)
    right = p.operand(e.b, operand_type, prec + 1, e.op)
    widened = e.op in WIDENED_OPS and not e.dtype.is_vector and not e.dtype.is_float
    if widened and e.dtype.bits == 64 and _c_narrow(e.a) and (
            e.op in SHIFT_OPS or _c_narrow(e.b)):
        left = f"({p.type(e.dtype)}){p.operand(e.a, operand_type, UNARY, e.op)}"
    text = f"{left} {op} {right}"
    if widened and e.dtype.bits < 32:
        return f"({p.type(e.dtype)})({text})", UNARY
    return text, prec


def _unary(p: CPrinter, e: Unary):
    p.no_bfloat16(e, e.a)
    # The operand must be primary: `- -x` would otherwise print as the decrement `--x`.
    text = p.table(C_UNARY, e.op, "C_UNARY") + p.wrap(e.a, PRIMARY)
    if e.op != "not" and not (e.dtype.is_vector or e.dtype.is_float) and e.dtype.bits < 32:
        return f"({p.type(e.dtype)})({text})", UNARY
    return text, UNARY


def _select(p: CPrinter, e: Select):
    if e.dtype.is_vector or e.cond.dtype.is_vector:
        raise IRError(f"{e}: select is not supported for vector dtype {e.dtype}")
    branches = [p.operand(x, e.dtype, TERNARY + 1, "?") for x in (e.then, e.otherwise)]
    return f"{p.wrap(e.cond, TERNARY + 1)} ? {branches[0]} : {branches[1]}", TERNARY


def _load(p: CPrinter, e: Load):
    return p.element(e.buffer, e.indices, e.lanes, store=False)


def _libm_call(p: CPrinter, base: str, dtype: DataType, args: Sequence[str]):
    name = base if dtype == dtypes.float64 else p.prelude.f32_math(base) or base + "f"
    text = f"{name}({', '.join(args)})"
    # float16 math runs in float and rounds back.
    return (f"(_Float16){text}", UNARY) if dtype == dtypes.float16 else (text, PRIMARY)


def scalar_float_call(p: CPrinter, e: Call, base: str):
    p.no_bfloat16(e, *e.args)
    if e.dtype.is_vector:
        raise IRError(f"{e}: {e.func} is not supported for vector dtype {e.dtype}")
    return _libm_call(p, base, e.dtype, [p.text_as(a, e.dtype) for a in e.args])




def _abs(p: CPrinter, e: Call):
    (arg,) = e.args
    if e.dtype.is_float or e.dtype.is_vector:
        return scalar_float_call(p, e, "fabs")
    if e.dtype.kind == "int":
        return p.call(p.helper("abs", e.dtype), p.text_as(arg, e.dtype))
    return p.expr(arg)  # unsigned and bool values are their own magnitude


def _reduce(p: CPrinter, e: Call):
    (arg,) = e.args
    p.no_bfloat16(e, arg)
    if not arg.dtype.is_vector:
        return p.expr(arg)
    return p.call(p.helper(e.func, arg.dtype), p.text(arg))




# Primitive name -> printer; each printer picks the spelling for the call's dtype.
CALL_PRINTERS: dict[str, Callable] = {
    **{name: (lambda p, e, base=base: scalar_float_call(p, e, base))
       for name, base in LIBM.items()},
    "fma": lambda p, e: scalar_float_call(p, e, "fma"),
    "abs": _abs,
    "reduce_add": _reduce,
    "reduce_max": _reduce,
    "reduce_min": _reduce,
    "prefetch": lambda p, e: ("0", PRIMARY),  # a hint; C has no portable spelling
}

EXPR_PRINTERS: dict[type, Callable] = {
    Var: lambda p, e: (p.name_of(e), PRIMARY),
    Const: _const,
    Binary: _binary,
    Unary: _unary,
    Select: _select,
    Cast: lambda p, e: p.cast(e.value, e.dtype),
    Broadcast: lambda p, e: p.call(p.helper("broadcast", e.dtype), p.text(e.value)),
    Load: _load,
    Call: lambda p, e: p.table(p.CALL_PRINTERS, e.func, "CALL_PRINTERS")(p, e),
}


# ---- statements -------------------------------------------------------------------------

def _seq(p: CPrinter, s: Seq) -> None:
    for item in s.stmts:
        p.stmt(item)


def _if(p: CPrinter, s: If) -> None:
    p.emit(f"if ({p.text(s.cond)}) {{")
    p.block(s.then)
    other = s.otherwise
    while isinstance(other, If):
        p.emit(f"}} else if ({p.text(other.cond)}) {{")
        p.block(other.then)
        other = other.otherwise
    if other is not None:
        p.emit("} else {")
        p.block(other)
    p.emit("}")


def print_store(p: CPrinter, s: Store) -> None:
    target, _ = p.element(s.buffer, s.indices, s.lanes, store=True)
    value_type = s.buffer.dtype if s.buffer.dtype.is_vector else s.value.dtype
    p.emit(f"{target} = {p.text_as(s.value, value_type)};")


def _accumulate(p: CPrinter, s: Accumulate) -> None:
    print_store(p, Store(s.buffer, (), combine(s.op, s.buffer[()], s.value)))


def print_let(p: CPrinter, s: Let) -> None:
    value = p.text(s.value)
    p.let_values[s.var] = s.value
    p.emit(f"const {p.type(s.var.dtype)} {p.names.declare(s.var, s.var.name)} = {value};")


def _decl_buffer(p: CPrinter, s: DeclBuffer) -> None:
    b = s.buffer
    if not all(isinstance(d, Const) for d in b.shape):
        raise IRError(f"{b.scope} buffer {b.name} has symbolic shape {list(map(str, b.shape))}; "
                      "stack arrays need constant sizes")
    count = math.prod(d.value for d in b.shape)
    if count * b.dtype.nbytes > MAX_STACK_BYTES:
        raise IRError(f"{b.scope} buffer {b.name} needs {count * b.dtype.nbytes} bytes of "
                      f"stack, more than {MAX_STACK_BYTES}")
    ctype, name = p.type(b.dtype), p.names.declare(b, b.name)
    if b.rank == 0:
        p.emit(f"{ctype} {name};")
    else:
        p.emit(f"{ctype} {name}[{count}] __attribute__((aligned({p.STACK_ALIGNMENT})));")


def _assert(p: CPrinter, s: Assert) -> None:
    p.messages.append(s.message)
    p.emit(f"if (!{p.wrap(s.cond, PRIMARY)}) {{")
    p.depth += 1
    if s.value is not None:
        p.reports_value = True
        p.emit(f"{fault_symbol(p.func)} = (int64_t)({p.expr(s.value)[0]});")
    p.fail(str(len(p.messages)))
    p.depth -= 1
    p.emit("}")














def _for(p: CPrinter, s: For) -> None:
    kind = s.kind
    # One level of parallelism (a parallel body runs on one thread), and OpenMP cannot
    # nest simd inside simd.
    if kind in p.special_loops and kind in ("parallel", "vectorize"):
        kind = "serial"
    p.table(p.LOOP_PRINTERS, kind, "LOOP_PRINTERS")(p, s)


def print_loop(p: CPrinter, s: For, pragma: str | None = None, special: str | None = None) -> None:
    """A C for loop, after ``pragma``; with ``special``, its body printed as that kind of
    special loop (see CPrinter.special_loop)."""
    if pragma:
        p.emit(pragma)
    extent = p.wrap(s.extent, C_BINARY["<"][1] + 1)  # a select binds looser than <
    p.names.push()
    var = p.names.declare(s.var, s.var.name)
    p.emit(f"for ({p.type(s.var.dtype)} {var} = 0; {var} < {extent}; ++{var}) {{")
    if special:
        label = p.special_loop(s.body, special)
        p.emit("}")
        p.pass_failure_outward(label)
    else:
        p.block(s.body)
        p.emit("}")
    p.names.pop()


def _unrolled(p: CPrinter, s: For) -> None:
    pragma = (f"#pragma GCC unroll {max(1, min(s.extent.value, UNROLL_CAP))}"
              if isinstance(s.extent, Const) else None)
    print_loop(p, s, pragma)


# Loop kind -> printer. A vectorize loop is serial unless a target vectorises it; a
# parallel one has no plain C spelling.
LOOP_PRINTERS: dict[str, Callable] = {
    "serial": lambda p, s: print_loop(p, s),
    "unroll": _unrolled,
    "vectorize": lambda p, s: print_loop(p, s),
}








STMT_PRINTERS: dict[type, Callable] = {
    Seq: _seq,
    For: _for,
    If: _if,
    Store: print_store,
    Accumulate: _accumulate,
    Let: print_let,
    DeclBuffer: _decl_buffer,
    Assert: _assert,
    Evaluate: lambda p, s: p.emit(f"(void){p.wrap(s.expr, UNARY)};"),
}
NOT_LOWERED = (ForTask, Barrier)


# ---- one function -----------------------------------------------------------------------

class CPrinter:
    """Prints one function; a target subclasses it with tables of its own."""
    EXPR_PRINTERS: ClassVar[dict] = EXPR_PRINTERS
    CALL_PRINTERS: ClassVar[dict] = CALL_PRINTERS
    STMT_PRINTERS: ClassVar[dict] = STMT_PRINTERS
    LOOP_PRINTERS: ClassVar[dict] = LOOP_PRINTERS
    PREAMBLE: ClassVar[str] = ""
    PRELUDE: ClassVar[type[Prelude]] = Prelude
    STACK_ALIGNMENT: ClassVar[int] = 16  # bytes local arrays are aligned to

    def __init__(self, func: Function, prelude: Prelude):
        self.func = func
        self.prelude = prelude
        self.names = Namer(CALLED)
        self.lines: list[str] = []
        self.depth = 1
        self.messages: list[str] = []
        self.reports_value = False  # an Assert stores its value in fault_symbol
        self.special_loops: list[str] = []  # kinds of the enclosing parallel and simd loops
        self.fail_label: str | None = None  # where a failure jumps inside such a loop
        self.status_address = "&treadle_status"  # in an outlined body, a pointer to it
        self.outlined: list[str] = []  # parallel loop bodies, printed before the kernel
        self.let_values: dict[Var, Expr] = {}
        self.used_labels: set[str] = set()
        self.where: Stmt | None = None
        self.stored = {s.buffer for s in walk(func.body) if isinstance(s, Store)}

    def print(self) -> str:
        try:
            params = [self.param(p) for p in self.func.params]
            self.stmt(self.func.body)
        except IRError as err:
            where = f"\n  in: {str(self.where).splitlines()[0]}" if self.where else ""
            raise IRError(f"C backend, function {self.func.name!r}: {err}{where}") from None
        symbol = c_name(self.func)
        head = f"int32_t {symbol}({', '.join(params) or 'void'}) {{"
        if len(head) > 100:
            head = f"int32_t {symbol}(\n    " + ",\n    ".join(params) + ") {"
        status = ["    int32_t treadle_status = 0;"] if self.used_labels else []
        table = ",\n".join([*(f"    {c_string(m)}" for m in self.messages), "    NULL"])
        fault = [f"int64_t {fault_symbol(self.func)};\n"] if self.reports_value else []
        return "\n".join([*fault, *(f"{body}\n" for body in self.outlined), head, *status,
                          *self.lines, "    return 0;", "}", "",
                          f"const char *{messages_symbol(self.func)}[] = {{", table, "};"])

    def param(self, p) -> str:
        if isinstance(p, Var):
            return f"{self.type(p.dtype)} {self.names.declare(p, p.name)}"
        const = "" if p in self.stored else "const "
        return f"{const}{self.type(p.dtype)} *restrict {self.names.declare(p, p.name)}"

    # ---- output ----
    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def stmt(self, s: Stmt) -> None:
        self.where = s
        printer = self.STMT_PRINTERS.get(type(s))
        if printer is None:
            if isinstance(s, NOT_LOWERED):
                raise IRError(f"{type(s).__name__} left in the program; lower it first "
                              "(treadle.ir.lower.lower)")
            raise IRError(f"statement {type(s).__name__} has no entry in table STMT_PRINTERS")
        printer(self, s)

    def block(self, s: Stmt) -> None:
        self.depth += 1
        self.names.push()
        self.stmt(s)
        self.names.pop()
        self.depth -= 1

    # ---- failures inside parallel and simd loops ----
    def fail(self, code: str) -> None:
        """Leaves the kernel with status ``code`` (a C expression)."""
        if self.fail_label is None:
            self.emit(f"return {code};")
            return
        if code != "treadle_status":
            self.emit(f"__atomic_store_n({self.status_address}, {code}, __ATOMIC_RELAXED);")
        self.emit(f"goto {self.fail_label};")
        self.used_labels.add(self.fail_label)

    def special_loop(self, body: Stmt, kind: str) -> str:
        """Prints the body of a parallel or simd loop; returns the label its failures jump
        to, unique in the C function it lands in (the kernel's lines only grow; an
        outlined body's restart, under a new count of outlined loops)."""
        outer = self.fail_label
        label = f"treadle_fail_{len(self.outlined)}_{len(self.lines)}"
        self.fail_label = label
        self.special_loops.append(kind)
        self.block(body)
        if label in self.used_labels:
            self.emit(f"    {label}:;")
        self.special_loops.pop()
        self.fail_label = outer
        return label

    def pass_failure_outward(self, label: str) -> None:
        """After a parallel or simd loop whose body can fail: fail here too if it did."""
        if label not in self.used_labels:
            return
        status = (f"__atomic_load_n({self.status_address}, __ATOMIC_RELAXED)"
                  if self.special_loops else "treadle_status")
        self.emit(f"if ({status} != 0) {{")
        self.depth += 1
        self.fail("treadle_status")
        self.depth -= 1
        self.emit("}")

    # ---- expressions ----
    def expr(self, e: Expr) -> tuple[str, int]:
        return self.table(self.EXPR_PRINTERS, type(e), "EXPR_PRINTERS")(self, e)

    def text(self, e: Expr) -> str:
        return self.expr(e)[0]

    def wrap(self, e: Expr, min_prec: int) -> str:
        text, prec = self.expr(e)
        return text if prec >= min_prec else f"({text})"

    def converted(self, e: Expr, target: DataType, operand: bool = False) -> tuple[str, int]:
        """``e`` as a ``target`` value. C converts implicitly except between same-width
        integers of opposite sign (it would pick unsigned) and into vectors; a scalar
        operand of a vector operator needs no broadcast when it has the element type."""
        src = e.dtype
        implicit = (src == target or (operand and target.is_vector and src == target.scalar)
                    or (not src.is_vector and not target.is_vector and not (
                        src.is_integer and target.is_integer and src.bits == target.bits)))
        return self.expr(e) if implicit else self.cast(e, target)

    def text_as(self, e: Expr, target: DataType) -> str:
        return self.converted(e, target)[0]

    def operand(self, e: Expr, target: DataType, min_prec: int, parent: str) -> str:
        text, prec = self.converted(e, target, operand=True)
        if prec < min_prec or (prec < UNARY and _clarify(parent, e)):
            return f"({text})"
        return text

    def cast(self, e: Expr, target: DataType) -> tuple[str, int]:
        src = e.dtype
        if src == target:
            return self.expr(e)
        if dtypes.bfloat16 in (src.scalar, target.scalar):
            return self.bfloat16_cast(e, target)
        if target.is_vector and not src.is_vector:
            return self.call(self.helper("broadcast", target), self.text_as(e, target.scalar))
        if target.is_vector:
            if src.lanes != target.lanes:
                raise IRError(f"cast of {src} {e} to {target} changes the number of lanes")
            return self.call("__builtin_convertvector", self.text(e), self.type(target))
        if src.is_vector:
            raise IRError(f"cast of vector {src} {e} to scalar {target}")
        return f"({self.type(target)}){self.wrap(e, UNARY)}", UNARY

    def bfloat16_cast(self, e: Expr, target: DataType) -> tuple[str, int]:
        src = e.dtype
        if (src, target) == (dtypes.bfloat16, dtypes.float32):
            return self.call(self.prelude.bfloat16_conversion(False), self.text(e))
        if (src, target) == (dtypes.float32, dtypes.bfloat16):
            return self.call(self.prelude.bfloat16_conversion(True), self.text(e))
        raise IRError(f"cast of {src} {e} to {target}: bfloat16 converts only to and from "
                      "scalar float32; cast through float32")

    def no_bfloat16(self, e: Expr, *operands: Expr) -> None:
        if any(x.dtype.scalar == dtypes.bfloat16 for x in operands):
            raise IRError(f"{e}: arithmetic on bfloat16 is not supported; cast the operands "
                          "to float32 and the result back")

    def call(self, name: str, *args: str) -> tuple[str, int]:
        return f"{name}({', '.join(args)})", PRIMARY

    def element(self, buffer: Buffer, indices, lanes: int, store: bool) -> tuple[str, int]:
        """The C lvalue of ``buffer[indices]`` (``lanes`` consecutive elements)."""
        name = self.name_of(buffer)
        if len(indices) != buffer.rank:
            raise IRError(f"buffer {buffer.name} has rank {buffer.rank}, accessed with "
                          f"{len(indices)} indices")
        if lanes > 1 and (buffer.dtype.is_vector or buffer.rank == 0):
            raise IRError(f"{lanes}-lane access to {buffer.dtype} buffer {buffer.name} of "
                          f"rank {buffer.rank}")
        if buffer.rank == 0 and buffer.scope != "global":
            return name, PRIMARY  # a local scalar is a plain C variable
        index = self.text(_offset(buffer.shape, indices))
        if lanes == 1:
            return f"{name}[{index}]", PRIMARY
        vector = self.type(buffer.dtype.with_lanes(lanes))
        return f"*({'' if store else 'const '}{vector}_u *)&{name}[{index}]", UNARY

    # ---- names and tables ----
    def name_of(self, key: Var | Buffer) -> str:
        name = self.names.lookup(key)
        if name is None:
            kind = "variable" if isinstance(key, Var) else "buffer"
            raise IRError(f"{kind} {key.name} is used but not defined here")
        return name

    def type(self, dtype: DataType) -> str:
        return self.prelude.type(dtype)

    def helper(self, kind: str, dtype: DataType) -> str:
        return self.prelude.helper(kind, dtype)

    def table(self, table: dict, key, table_name: str):
        try:
            return table[key]
        except KeyError:
            label = key.__name__ if isinstance(key, type) else repr(key)
            raise IRError(f"the C backend has no entry for {label} in table {table_name}") \
                from None


def _offset(shape: Sequence[Expr], indices: Sequence[Expr]) -> Expr:
    """The flat offset, simplified where that saves divisions: digits the schedule split
    (a row of K merging a filter row with its channels) add back up to the contiguous
    offset they came from. Otherwise as written, which the C compiler strength-reduces
    best (simplifying every offset made ResNet-50 8% slower)."""
    flat = _flat_index(shape, indices)
    if _divisions(flat) == 0:
        return flat
    simplified = simplify_expr(flat)
    return simplified if _divisions(simplified) < _divisions(flat) else flat


def _divisions(e: Expr) -> int:
    return sum(1 for n in walk(e) if isinstance(n, Binary) and n.op in ("//", "%"))


def _flat_index(shape: Sequence[Expr], indices: Sequence[Expr]) -> Expr:
    """Row-major offset ``i * (d1 * d2) + j * d2 + k``, folding constant strides."""
    strides: list = []
    stride = 1
    for dim in reversed(shape):
        strides.append(stride)
        if isinstance(dim, Const) and isinstance(stride, int):
            stride *= dim.value
        else:
            stride = dim if isinstance(stride, int) and stride == 1 else dim * stride
    terms = []
    for index, stride in zip(indices, reversed(strides)):
        if isinstance(index, Const) and isinstance(stride, int):
            if index.value != 0:
                terms.append(Const(index.value * stride, dtypes.index_type))
        elif isinstance(stride, int) and stride == 1:
            terms.append(index)
        else:
            terms.append(Binary("*", index, as_expr(stride)))
    if not terms:
        return Const(0, dtypes.index_type)
    flat = terms[0]
    for term in terms[1:]:
        flat = flat + term
    return flat

