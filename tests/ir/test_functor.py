"""Generic traversal: children and walk order, bottom-up and top-down rewrites that share
unchanged subtrees, substitution, the variables a tree names or binds, and the scalar
evaluator's C integer division and numpy min/max, checked against numpy."""
import numpy as np
import pytest

from treadle.ir.dtypes import float32, index_type, int8, int32
from treadle.ir.expr import (Binary, Buffer, Cast, Const, Var, call, cast, const, maximum, minimum,
                             select)
from treadle.ir.functor import (bound_vars, children, evaluate, free_vars, rewrite,
                                rewrite_outermost, substitute, walk)
from treadle.ir.mapping import spatial
from treadle.ir.stmt import For, ForTask, If, Let, Seq, Store

N = Var("n")
I, J = Var("i"), Var("j")
A = Buffer("a", float32, (N, 7))


def test_children_in_field_order():
    e = select(I < N, A[I, J], 0.0)
    assert list(children(e)) == [I < N, A[I, J], Const(0.0, float32)]
    assert list(children(A[I, J])) == [I, J]  # the buffer is a leaf
    assert list(children(I)) == []
    loop = For(I, N, Store(A, (I, 0), 1.0))
    assert list(children(loop)) == [I, N, loop.body]


def test_walk_visits_parents_before_children_left_to_right():
    e = (I + 1) * J
    assert list(walk(e)) == [e, I + 1, I, Const(1, index_type), J]


def test_walk_enters_statements_and_their_expressions():
    body = Seq((Let(J, I * 2), Store(A, (J, 0), cast(I, float32))))
    loop = For(I, N, body)
    nodes = list(walk(loop))
    assert nodes[:4] == [loop, I, N, body]
    assert [n for n in nodes if isinstance(n, Var)] == [I, N, J, I, J, I]
    assert not any(isinstance(n, Buffer) for n in nodes)


def test_rewrite_is_bottom_up_and_sees_rebuilt_nodes():
    """x·1 folds to x only once the inner rewrite has made the 1: rewrite runs children
    first and hands ``fn`` the rebuilt parent."""
    e = I * (J - J) + I * (Const(1, index_type) + 0)

    def fold(node):
        if isinstance(node, Binary) and node.op == "-" and node.a == node.b:
            return Const(0, index_type)
        if isinstance(node, Binary) and node.op == "+" and node.b == Const(0, index_type):
            return node.a
        if isinstance(node, Binary) and node.op == "*" and node.b == Const(1, index_type):
            return node.a
        return None
    assert rewrite(e, fold) == I * 0 + I


def test_rewrite_shares_unchanged_subtrees():
    left, right = I * 2 + J, N - 1
    e = left * right
    assert rewrite(e, lambda n: None) is e
    changed = rewrite(e, lambda n: J if n == N else None)
    assert changed == left * (J - 1) and changed.a is left


def test_rewrite_rebuilds_statements_and_recomputes_dtypes():
    x = Var("x", float32)
    stmt = For(I, N, Store(A, (I, 0), cast(I, float32) * 2.0))
    new = rewrite(stmt, lambda n: x if isinstance(n, Cast) else None)
    assert new == For(I, N, Store(A, (I, 0), x * 2.0))
    assert new.body.value.dtype == float32


def test_rewrite_outermost_stops_at_the_first_replacement():
    inner = I + 1
    e = (inner + 1) * inner
    seen = []

    def outer_sums(node):
        seen.append(node)
        return J if isinstance(node, Binary) and node.op == "+" else None
    assert rewrite_outermost(e, outer_sums) == J * J
    assert seen == [e, inner + 1, inner]  # never inside a node it replaced
    assert rewrite_outermost(e, lambda n: None) is e


def test_substitute_replaces_variables_in_expressions_and_statements():
    x = Var("x", float32)
    assert substitute(I * 3 + J, {I: J + 1}) == (J + 1) * 3 + J
    assert substitute(cast(I, float32) + 1.0, {I: Const(2, index_type)}) \
        == cast(Const(2, index_type), float32) + 1.0
    loop = For(I, N, Store(A, (I, J), 1.0))
    assert substitute(loop, {N: Const(13, index_type), J: Const(6, index_type)}) \
        == For(I, 13, Store(A, (I, 6), 1.0))
    assert substitute(I + 1, {I: x}).dtype == float32  # dtypes follow what was put in
    e = I + J
    assert substitute(e, {}) is e


def test_substitute_leaves_buffer_shapes_alone():
    """Buffers are leaves: their shapes are part of their identity."""
    load = A[I, 0]
    assert substitute(load, {N: Const(5, index_type)}).buffer.shape == (N, Const(7, index_type))


def test_free_vars_are_every_variable_named_and_bound_vars_those_bound():
    assert free_vars(I * N + J) == {I, N, J}
    assert free_vars(Const(1, index_type)) == set()
    assert free_vars(A[0, 1]) == set()  # the shape's n belongs to the buffer
    w = Var("w")
    k = Var("k", int32)
    stmt = Seq((
        Let(k, cast(N, int32)),
        For(I, N, If(I < k, Store(A, (I, J), 1.0))),
        ForTask(spatial(4), w, (J,), Store(A, (J, 0), 0.0)),
    ))
    assert bound_vars(stmt) == {k, I, J}
    assert free_vars(stmt) == {k, N, I, J, w}
    assert free_vars(stmt) - bound_vars(stmt) == {N, w}  # what the caller must supply


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_division_and_remainder_follow_c(dtype):
    """The quotient rounds toward zero, the remainder takes the dividend's sign."""
    for a in range(-13, 14):
        for b in (-7, -3, -1, 1, 2, 5, 13):
            x, y = const(a, dtype), const(b, dtype)
            assert evaluate(Binary("//", x, y)) == int(np.trunc(a / b)), (a, b)
            assert evaluate(Binary("%", x, y)) == int(np.fmod(a, b)), (a, b)


def test_float_division_is_true_division():
    x, y = Var("x", float32), Var("y", float32)
    assert evaluate(x / y, {x: 7.0, y: 2.0}) == 3.5


def test_constant_min_max_fold_like_numpy():
    nan = const(float("nan"), "float32")
    for op in (maximum, minimum):
        assert np.isnan(evaluate(op(nan, 1.0)))
        assert np.isnan(evaluate(op(const(1.0, "float32"), nan)))


def test_min_max_of_numbers():
    assert evaluate(minimum(I, J), {I: 3, J: -2}) == -2
    assert evaluate(maximum(I, 4), {I: 3}) == 4


def test_casts_convert_as_c():
    assert evaluate(cast(const(2.9, "float32"), int32)) == 2
    assert evaluate(cast(const(-2.9, "float32"), int32)) == -2
    assert evaluate(cast(const(3, "int64"), float32)) == 3.0
    assert evaluate(cast(I, int8), {I: 7}) == 7


def test_select_evaluates_only_the_branch_taken():
    undefined = Var("undefined")
    assert evaluate(select(I < 3, I * 2, undefined), {I: 1}) == 2
    with pytest.raises(KeyError, match="variable undefined has no value"):
        evaluate(select(I < 3, I * 2, undefined), {I: 5})


def test_what_cannot_be_evaluated_is_named():
    with pytest.raises(TypeError, match="cannot evaluate Load a\\[i, 0\\] at compile time"):
        evaluate(A[I, 0], {I: 0})
    with pytest.raises(TypeError, match="cannot evaluate Call"):
        evaluate(call("exp", const(1.0, "float32")))
