"""Expressions: what Python operators build, the dtype every node computes on construction,
and the type errors raised where an expression is written, each naming the problem."""
import numpy as np
import pytest

from treadle.ir.dtypes import (boolean, float16, float32, float32x4, float32x8, float64,
                               index_type, int8, int32, int64, vector)
from treadle.ir.expr import (Binary, Broadcast, Buffer, Call, Cast, Const, Load, Select, Unary,
                             Var, as_expr, broadcast, call, cast, ceil_div, const, eq,
                             logical_and, maximum, minimum, ne, select)
from treadle.ir.functor import evaluate

I, J = Var("i"), Var("j")
X, Y = Var("x", float32), Var("y", float32)
H = Var("h", float16)


def test_operators_build_binary_nodes_in_operand_order():
    assert I + 1 == Binary("+", I, Const(1, index_type))
    assert 2 - I == Binary("-", Const(2, index_type), I)
    assert I * J // 3 % 5 == Binary("%", Binary("//", Binary("*", I, J), Const(3, int64)),
                                     Const(5, int64))
    assert 1.5 / X == Binary("/", Const(1.5, float32), X)
    assert -X == Unary("neg", X) and ~I == Unary("~", I) and ~(I < J) == Unary("not", I < J)


def test_equality_is_structural_and_eq_builds_a_comparison():
    assert I + 1 == Var("i") + 1 and hash(I + 1) == hash(Var("i") + 1)
    assert I + 1 != I + 2 and Var("i", int32) != I
    assert eq(I, 3) == Binary("==", I, Const(3, int64)) and eq(I, 3).dtype == boolean
    assert ne(X, 0.5) == Binary("!=", X, Const(0.5, float32))
    assert minimum(I, 4) == Binary("min", I, Const(4, int64))
    assert maximum(X, 0.0).dtype == float32


def test_a_python_number_takes_the_other_operands_dtype():
    assert (H * 2).b == Const(2, float16) and (H * 2).dtype == float16
    assert (Var("k", int8) + 1).dtype == int8
    assert (X + 1).b == Const(1.0, float32)
    assert (I + 0.5).dtype == float32  # a float next to an index is float32


@pytest.mark.parametrize("a, b, expected", [
    (Var("a", int32), Var("b", float16), float16),
    (Var("a", int8), Var("b", int64), int64),
    (X, Var("d", float64), float64),
    (Var("v", float32x8), X, float32x8),
])
def test_arithmetic_promotes(a, b, expected):
    for op in ("+", "-", "*", "min", "max"):
        assert Binary(op, a, b).dtype == expected


def test_comparisons_are_bool_with_the_operands_lanes():
    assert (I < J).dtype == boolean and (X >= 0.0).dtype == boolean
    v = Var("v", float32x4)
    assert (v > X).dtype == vector(boolean, 4)


def test_logic_of_conditions_and_bits_of_integers():
    both = (I < 3) & (J > 2)
    assert both.op == "and" and both.dtype == boolean
    assert ((I < 3) | (J > 2)).op == "or"
    assert (I & 7).op == "&" and (I & 7).dtype == int64
    assert logical_and(I < 3, J < 4, I < J) == Binary("and", Binary("and", I < 3, J < 4),
                                                      I < J)


@pytest.mark.parametrize("build, message", [
    (lambda: I / J, "/ needs float operands.*use // for integers"),
    (lambda: X // Y, "// needs integer operands"),
    (lambda: X % 2.0, "% needs integer operands"),
    (lambda: X & Y, "bitwise & of non-integer operands"),
    (lambda: X << 1, "bitwise << of non-integer operands"),
    (lambda: Binary("and", I, I < J), "logical and of non-bool operands"),
    (lambda: Unary("not", I), "logical not of non-bool"),
    (lambda: Var("v", float32x4) + Var("w", float32x8), "cannot combine vector types"),
])
def test_type_errors_name_the_operation(build, message):
    with pytest.raises(TypeError, match=message):
        build()


def test_unknown_operators_are_named():
    with pytest.raises(ValueError, match="unknown binary op 'pow'"):
        Binary("pow", I, J)
    with pytest.raises(ValueError, match="unknown unary op 'abs'"):
        Unary("abs", X)


def test_an_expression_has_no_python_truth_value():
    with pytest.raises(TypeError, match=r"truth value of IR expression i < 3 .*select\(\)"):
        if I < 3:
            pass


@pytest.mark.parametrize("value, dtype, expected", [
    (3, float32, 3.0), (2.9, int32, 2), (-2.9, int64, -2), (1, boolean, True),
    (0, boolean, False), (7, float16, 7.0)])
def test_constants_hold_values_of_their_dtype(value, dtype, expected):
    c = Const(value, dtype)
    assert c.value == expected and type(c.value) is type(expected)


def test_as_expr_wraps_python_and_numpy_numbers():
    assert as_expr(True) == Const(True, boolean)
    assert as_expr(4) == Const(4, index_type)
    assert as_expr(4, float16) == Const(4.0, float16)
    assert as_expr(4, boolean) == Const(4, index_type)  # an int never becomes a bool
    assert as_expr(0.25) == Const(0.25, float32)
    assert as_expr(0.25, float64) == Const(0.25, float64)
    assert as_expr(0.25, int32) == Const(0.25, float32)  # a float never becomes an int
    assert as_expr(np.float16(1.5)) == Const(1.5, float16)
    assert as_expr(np.int8(-3)) == Const(-3, int8)
    assert as_expr(I) is I
    assert const(5, "int32") == Const(5, int32)


def test_as_expr_names_what_it_cannot_wrap():
    with pytest.raises(TypeError, match=r"cannot use 'n' \(str\) as an IR expression"):
        as_expr("n")
    with pytest.raises(TypeError, match=r"\(NoneType\)"):
        I + None


def test_select_promotes_its_branches_and_needs_a_bool_condition():
    s = select(I < 3, X, 0)
    assert isinstance(s, Select) and s.otherwise == Const(0.0, float32)
    assert s.dtype == float32
    assert select(I < 3, Var("a", int32), H).dtype == float16
    with pytest.raises(TypeError, match="select condition i is int64, not bool"):
        select(I, X, Y)


def test_cast_to_the_same_dtype_is_the_value_itself():
    assert cast(X, float32) is X
    assert cast(X, "float16") == Cast(X, float16) and cast(X, "float16").dtype == float16
    assert cast(3, float32) == Cast(Const(3, index_type), float32)


def test_broadcast_repeats_a_scalar_over_lanes():
    b = broadcast(X, 8)
    assert b == Broadcast(X, 8) and b.dtype == float32x8
    assert broadcast(1, 4).dtype == vector(int64, 4)
    with pytest.raises(TypeError, match="broadcast of vector"):
        broadcast(b, 2)


def test_buffers_hold_shapes_as_expressions():
    n = Var("n")
    a = Buffer("a", float32, (n, 3))
    assert a.shape == (n, Const(3, index_type)) and a.rank == 2 and a.scope == "global"
    assert Buffer("s", float32, ()).rank == 0
    with pytest.raises(ValueError, match="buffer t: unknown scope 'texture'"):
        Buffer("t", float32, (4,), "texture")
    with pytest.raises(TypeError, match="global buffer g must have a scalar dtype"):
        Buffer("g", float32x8, (4,))


def test_loads_index_buffers_and_vector_loads_widen_the_dtype():
    a = Buffer("a", float16, (Var("n"), 13))
    load = a[I, 2]
    assert load == Load(a, (I, Const(2, index_type))) and load.dtype == float16
    assert a[I, J + 1].indices[1] == J + 1
    assert a.vload((I, 0), 4).dtype == vector(float16, 4) and a.vload((I, 0), 4).lanes == 4
    regs = Buffer("regs", float32x8, (2,), "local")
    assert regs[1].dtype == float32x8  # an element of a register array is a whole vector
    assert Buffer("v", float32, (5,))[3] == Buffer("v", float32, (5,))[(3,)]


def test_calls_take_their_dtype_from_the_primitive():
    assert call("exp", X) == Call("exp", (X,)) and call("exp", X).dtype == float32
    assert call("sqrt", Var("d", float64)).dtype == float64
    with pytest.raises(KeyError, match="unknown primitive function 'nope'"):
        call("nope", X)


@pytest.mark.parametrize("a", [0, 1, 6, 7, 13, 2039])
@pytest.mark.parametrize("b", [1, 3, 7])
def test_ceil_div_of_numbers_and_of_expressions(a, b):
    expected = -(-a // b)
    assert ceil_div(a, b) == expected and isinstance(ceil_div(a, b), int)
    n = Var("n")
    assert evaluate(ceil_div(n, b), {n: a}) == expected


def test_printing_an_expression_shows_its_text():
    assert str(I * 2 + 1) == "i * 2 + 1"
    assert repr(I) == "Var(i: int64)" and repr(Const(2, float16)) == "Const(2.0: float16)"
    assert repr(X + 1.0) == "<Binary x + 1.0>"
