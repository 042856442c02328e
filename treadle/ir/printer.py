"""Readable text for tensor programs, used by dumps, error messages and tests.

Expressions print with Python-like operators and only the parentheses precedence needs;
statements print one per line, indented by nesting.
"""
from __future__ import annotations

from treadle.ir.expr import (Binary, Broadcast, Buffer, Call, Cast, Const, Expr, Load, Select,
                             Unary, Var)
from treadle.ir.stmt import (Accumulate, Assert, Barrier, DeclBuffer, Evaluate, For, ForTask,
                             Function, If, Let, Seq, Stmt, Store)

# Binding strength of binary operators; higher binds tighter.
PRECEDENCE = {"or": 1, "and": 2, "<": 4, "<=": 4, ">": 4, ">=": 4, "==": 4, "!=": 4,
              "|": 5, "^": 6, "&": 7, "<<": 8, ">>": 8, "+": 9, "-": 9,
              "*": 10, "/": 10, "//": 10, "%": 10}
ATOM = 12
UNARY_TEXT = {"neg": "-", "not": "not ", "~": "~"}
# Accumulate prints as an augmented assignment: `acc += v`, `acc max= v`.
ACCUMULATE_TEXT = {"sum": "+=", "prod": "*=", "max": "max=", "min": "min="}


def _const(e: Const) -> tuple[str, int]:
    text = repr(e.value)
    return (text if e.dtype.kind != "float" or e.dtype.name == "float32"
            else f"{e.dtype}({text})"), ATOM


def _binary(e: Binary) -> tuple[str, int]:
    if e.op in ("min", "max"):
        return f"{e.op}({format_expr(e.a)}, {format_expr(e.b)})", ATOM
    prec = PRECEDENCE[e.op]
    # Left-associative: the right operand needs parentheses at equal precedence.
    return f"{_wrap(e.a, prec)} {e.op} {_wrap(e.b, prec + 1)}", prec


def _load(e: Load) -> tuple[str, int]:
    index = ", ".join(format_expr(i) for i in e.indices)
    if e.lanes > 1:
        return f"{e.buffer.name}.vload[{index}; {e.lanes}]", ATOM
    return f"{e.buffer.name}[{index}]", ATOM


EXPR_FORMAT = {
    Var: lambda e: (e.name, ATOM),
    Const: _const,
    Binary: _binary,
    Unary: lambda e: (f"{UNARY_TEXT[e.op]}{_wrap(e.a, 11)}", 11),
    Select: lambda e: (f"select({format_expr(e.cond)}, {format_expr(e.then)}, "
                       f"{format_expr(e.otherwise)})", ATOM),
    Cast: lambda e: (f"{e.dtype}({format_expr(e.value)})", ATOM),
    Broadcast: lambda e: (f"broadcast({format_expr(e.value)}, {e.lanes})", ATOM),
    Load: _load,
    Call: lambda e: (f"{e.func}({', '.join(format_expr(a) for a in e.args)})", ATOM),
}


def _format(e: Expr) -> tuple[str, int]:
    try:
        return EXPR_FORMAT[type(e)](e)
    except KeyError:
        raise TypeError(f"printer has no entry for expression node {type(e).__name__}") from None


def _wrap(e: Expr, min_prec: int) -> str:
    text, prec = _format(e)
    return text if prec >= min_prec else f"({text})"


def format_expr(e: Expr) -> str:
    return _format(e)[0]


def format_buffer_type(b: Buffer) -> str:
    return f"{b.dtype}[{', '.join(format_expr(d) for d in b.shape)}]"


def _indices(indices) -> str:
    return ", ".join(format_expr(i) for i in indices)


def _store(s: Store, pad: str) -> list[str]:
    lanes = s.lanes
    target = (f"{s.buffer.name}.vstore[{_indices(s.indices)}; {lanes}]" if lanes > 1
              else f"{s.buffer.name}[{_indices(s.indices)}]")
    return [f"{pad}{target} = {format_expr(s.value)}"]


def _for(s: For, pad: str) -> list[str]:
    kind = "" if s.kind == "serial" else f" {s.kind}"
    return [f"{pad}for {s.var.name} in range({format_expr(s.extent)}){kind}:",
            *_lines(s.body, pad + "  ")]


def _for_task(s: ForTask, pad: str) -> list[str]:
    names = ", ".join(v.name for v in s.vars)
    return [f"{pad}for {names} in ({s.mapping!r}).on({format_expr(s.worker)}):",
            *_lines(s.body, pad + "  ")]


def _if(s: If, pad: str) -> list[str]:
    lines = [f"{pad}if {format_expr(s.cond)}:", *_lines(s.then, pad + "  ")]
    if s.otherwise is not None:
        lines += [f"{pad}else:", *_lines(s.otherwise, pad + "  ")]
    return lines


STMT_FORMAT = {
    Seq: lambda s, pad: [line for item in s.stmts for line in _lines(item, pad)] or [f"{pad}pass"],
    For: _for,
    ForTask: _for_task,
    If: _if,
    Store: _store,
    Accumulate: lambda s, pad: [f"{pad}{s.buffer.name} {ACCUMULATE_TEXT[s.op]} "
                                f"{format_expr(s.value)}"],
    Let: lambda s, pad: [f"{pad}let {s.var.name}: {s.var.dtype} = {format_expr(s.value)}"],
    DeclBuffer: lambda s, pad: [f"{pad}{s.buffer.scope} {s.buffer.name}: "
                                f"{format_buffer_type(s.buffer)}"],
    Barrier: lambda s, pad: [f"{pad}barrier()"],
    Assert: lambda s, pad: [f"{pad}assert {format_expr(s.cond)}, {s.message!r}"
                            + ("" if s.value is None else f" % {format_expr(s.value)}")],
    Evaluate: lambda s, pad: [f"{pad}{format_expr(s.expr)}"],
}


def _lines(s: Stmt, pad: str) -> list[str]:
    try:
        return STMT_FORMAT[type(s)](s, pad)
    except KeyError:
        raise TypeError(f"printer has no entry for statement node {type(s).__name__}") from None


def format_stmt(s: Stmt, indent: int = 0) -> str:
    return "\n".join(_lines(s, "  " * indent))


def format_function(f: Function) -> str:
    params = ", ".join(f"{p.name}: {format_buffer_type(p)}" if isinstance(p, Buffer)
                       else f"{p.name}: {p.dtype}" for p in f.params)
    return "\n".join([f"def {f.name}({params}):", *_lines(f.body, "  ")])
