"""The IR's text: a function's header and one line per statement, indented by nesting;
expressions with only the parentheses precedence needs, checked by evaluating the printed
text as Python (whose precedence the printer follows) against the IR's own evaluation."""
import pytest

from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import boolean, float16, float32, float32x8, float64, int32
from treadle.ir.expr import (Buffer, Const, Expr, Var, broadcast, call, cast, eq,
                             maximum, minimum, select)
from treadle.ir.functor import evaluate
from treadle.ir.mapping import repeat, spatial
from treadle.ir.printer import format_buffer_type, format_expr, format_function, format_stmt
from treadle.ir.stmt import Seq, Stmt, Store

A, B, C = Var("a"), Var("b"), Var("c")
X = Var("x", float32)


def kernel():
    with FunctionBuilder("axpy") as fb:
        n = fb.symbol("n")
        x = fb.param("x", float32, [n, 3])
        y = fb.param("y", float16, [n])
        acc = fb.scalar("acc", float32, 0.0)
        for i in fb.range(n, kind="parallel"):
            t = fb.let("t", i * 2 + 1)
            with fb.if_(i < 3):
                y[i] = cast(x[i, 0] * 2.0 + 1.0, float16)
            with fb.else_():
                fb.accumulate(acc, "max", x[i, 1])
            fb.assert_(t > 0, "bad {value}", t)
        for w in fb.range(4, kind="parallel", name="w"):
            for (j,) in (spatial(2) * repeat(2)).on(w):
                fb.barrier()
        for k in fb.range(n, name="k"):
            fb.evaluate(call("exp", x[k, 2]))
    return fb.function


def test_function_header_lists_symbols_and_buffer_types():
    header = format_function(kernel()).splitlines()[0]
    assert header == "def axpy(n: int64, x: float32[n, 3], y: float16[n]):"


def test_statements_print_one_per_line_indented_by_nesting():
    lines = str(kernel()).splitlines()
    assert lines[1:4] == ["  local acc: float32[]", "  acc[] = 0.0",
                          "  for i in range(n) parallel:"]
    body = lines[lines.index("  for i in range(n) parallel:") + 1:]
    assert body[:6] == ["    let t: int64 = i * 2 + 1",
                        "    if i < 3:",
                        "      y[i] = float16(x[i, 0] * 2.0 + 1.0)",
                        "    else:",
                        "      acc max= x[i, 1]",
                        "    assert t > 0, 'bad {value}' % t"]


def test_task_loops_barriers_and_serial_loops():
    lines = str(kernel()).splitlines()
    at = lines.index("  for w in range(4) parallel:")
    # The task variable's default name, i, is taken: it gets a fresh one.
    assert lines[at + 1] == "    for i_1 in (spatial(2) * repeat(2)).on(w):"
    assert lines[at + 2] == "      barrier()"
    assert lines[at + 3:] == ["  for k in range(n):", "    exp(x[k, 2])"]  # serial: no kind


def test_statement_printing_takes_an_indent_and_an_empty_sequence_is_pass():
    a = Buffer("a", float32, (4,))
    assert format_stmt(Store(a, (1,), 2.5), indent=2) == "    a[1] = 2.5"
    assert format_stmt(Seq(())) == "pass"


def test_vector_accesses_and_declarations():
    a = Buffer("a", float32, (16,))
    regs = Buffer("regs", float32x8, (2,), "local")
    assert format_stmt(Store(a, (8,), a.vload((0,), 8))) == "a.vstore[8; 8] = a.vload[0; 8]"
    assert format_stmt(Store(regs, (1,), broadcast(X, 8))) == "regs[1] = broadcast(x, 8)"
    assert format_buffer_type(regs) == "float32x8[2]"
    assert format_buffer_type(Buffer("s", int32, ())) == "int32[]"


@pytest.mark.parametrize("expr, text", [
    ((A + 1) * 2, "(a + 1) * 2"),
    (A + 1 * B, "a + 1 * b"),
    (A - (B - C), "a - (b - c)"),
    (A - B - C, "a - b - c"),
    (A // B * C, "a // b * c"),
    (A * (B // C), "a * (b // c)"),
    (-(A + 1), "-(a + 1)"),
    (~(A < B), "not (a < b)"),
    ((A < B) & (B < C) | eq(A, 0), "a < b and b < c or a == 0"),
    (A << 2 | B & 3, "a << 2 | b & 3"),
    (minimum(A + 1, maximum(B, 2)), "min(a + 1, max(b, 2))"),
    (select(A < 3, B, C % 4), "select(a < 3, b, c % 4)"),
    (cast(X * 2.0, "float16"), "float16(x * 2.0)"),
    (call("sqrt", X + 1.0), "sqrt(x + 1.0)"),
])
def test_expression_text(expr, text):
    assert format_expr(expr) == text == str(expr)


@pytest.mark.parametrize("value, text", [
    (Const(3, int32), "3"), (Const(-2.5, float32), "-2.5"), (Const(1.5, float16), "float16(1.5)"),
    (Const(2.0, float64), "float64(2.0)"), (Const(1, boolean), "True")])
def test_constants_name_their_dtype_unless_float32_or_an_integer(value, text):
    assert format_expr(value) == text


EXPRESSIONS = [
    (A + B) * (C - 1), A - (B - C) + 7, A * B % 5 + C // 2, (A + B) // (C + 1),
    A << 2 | B & 3 ^ C, (A | B) & C, (A < B) & (B < C) | eq(C, 0), ~((A < B) | (B < C)),
    -(A - B) * C, minimum(A, B - C) + maximum(A * 2, C), select((A < B) & (B < C), A, B) * 3,
]


@pytest.mark.parametrize("expr", EXPRESSIONS, ids=str)
def test_printed_text_evaluates_as_the_expression(expr):
    """On non-negative operands Python's integer operators agree with C's, so the text, run
    as Python, gives the IR's value exactly when it has the parentheses it needs."""
    python = format_expr(expr).replace("select(", "_select(")
    for a, b, c in [(0, 1, 2), (7, 3, 13), (13, 61, 2), (5, 5, 5)]:
        names = {"a": a, "b": b, "c": c, "min": min, "max": max,
                 "_select": lambda cond, then, otherwise: then if cond else otherwise}
        assert eval(python, names) == evaluate(expr, {A: a, B: b, C: c}), python


def test_a_node_without_a_printer_entry_is_named():
    class Mystery(Expr):
        dtype = float32

    class Oddity(Stmt):
        pass
    with pytest.raises(TypeError, match="printer has no entry for expression node Mystery"):
        format_expr(Mystery())
    with pytest.raises(TypeError, match="printer has no entry for expression node Mystery"):
        format_expr(-Mystery() + 1.0)  # found inside another expression too
    with pytest.raises(TypeError, match="printer has no entry for statement node Oddity"):
        format_stmt(Seq((Oddity(),)))
