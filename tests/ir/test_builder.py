"""The function builder: Python loops, blocks and stores become the expected IR, compared
node by node; names are made unique; misuse raises IRError naming the problem."""
import pytest

from tests.ir.ir_compare import assert_ir_equal
from treadle.errors import IRError
from treadle.ir.builder import FunctionBuilder, current_builder, seq
from treadle.ir.dtypes import float32, index_type, int32
from treadle.ir.expr import Buffer, Const, Var, call, cast, eq
from treadle.ir.mapping import repeat, spatial
from treadle.ir.stmt import (Accumulate, Assert, Barrier, DeclBuffer, Evaluate, For, ForTask,
                             Function, If, Let, Seq, Store)


def test_copy_kernel_becomes_a_parallel_loop_over_a_symbolic_size():
    with FunctionBuilder("copy", {"note": "x"}) as fb:
        n = fb.symbol("n")
        a = fb.param("a", float32, [n])
        b = fb.param("b", "float32", [n])
        for i in fb.range(n, kind="parallel"):
            b[i] = a[i]
    n, i = Var("n"), Var("i")
    a, b = Buffer("a", float32, (n,)), Buffer("b", float32, (n,))
    expected = Function("copy", (n, a, b), For(i, n, Store(b, (i,), a[i]), "parallel"))
    assert_ir_equal(fb.function.body, expected.body)
    assert fb.function == expected and fb.function.attrs == {"note": "x"}


def test_nested_blocks_lets_and_scalars():
    """Row sums over a [7, 13] tensor, negative ones clamped to zero."""
    with FunctionBuilder("rows") as fb:
        x = fb.param("x", float32, [7, 13])
        y = fb.param("y", float32, [7])
        for r in fb.range(7, name="r"):
            acc = fb.scalar("acc", float32, 0.0)
            for c in fb.range(13, kind="unroll", name="c"):
                fb.accumulate(acc, "sum", x[r, c])
            total = fb.let("total", acc[()])
            with fb.if_(total < 0.0):
                y[r] = 0.0
            with fb.else_():
                y[r] = total
    r, c = Var("r"), Var("c")
    acc, total = Buffer("acc", float32, (), "local"), Var("total", float32)
    x, y = fb.function.buffers
    body = For(r, 7, Seq((
        DeclBuffer(acc),
        Store(acc, (), 0.0),
        For(c, 13, Accumulate(acc, "sum", x[r, c]), "unroll"),
        Let(total, acc[()]),
        If(total < 0.0, Store(y, (r,), 0.0), Store(y, (r,), total)),
    )))
    assert_ir_equal(fb.function.body, body)


def test_task_mapping_loops_become_task_statements():
    with FunctionBuilder("tiles") as fb:
        a = fb.param("a", float32, [6, 10])
        for w in fb.range(6, kind="parallel", name="w"):
            for i, j in (spatial(3, 2) * repeat(2, 5)).on(w):
                a[i, j] = 1.0
            fb.barrier()
    body = fb.function.body
    assert isinstance(body, For) and isinstance(body.body, Seq)
    task, barrier = body.body.stmts
    assert isinstance(task, ForTask) and isinstance(barrier, Barrier)
    assert task.worker == body.var and [v.name for v in task.vars] == ["i", "j"]
    assert task.mapping.task_shape == (6, 10)
    assert task.body == Store(fb.function.buffers[0], task.vars, 1.0)


def test_more_than_four_task_dimensions_are_numbered():
    with FunctionBuilder("deep") as fb:
        a = fb.param("a", float32, [1, 1, 1, 1, 1])
        for idx in repeat(1, 1, 1, 1, 1).on(0):
            a[idx] = 0.0
    assert [v.name for v in fb.function.body.vars] == ["t0", "t1", "t2", "t3", "t4"]


def test_repeated_names_are_made_unique():
    with FunctionBuilder("names") as fb:
        a = fb.param("a", float32, [3, 5])
        for i in fb.range(3):
            for i2 in fb.range(5):
                a[i, i2] = 0.0
        t1, t2 = fb.let("t", 1), fb.let("t", 2)
        s1, s2 = fb.scalar("s", float32), fb.scalar("s", float32)
    assert (i.name, i2.name) == ("i", "i_1")
    assert (t1.name, t2.name) == ("t", "t_1")
    assert (s1.name, s2.name) == ("s", "s_1")
    assert fb.fresh("a") == "a_1"  # parameters take part too


def test_a_parameter_name_used_twice_is_named():
    with pytest.raises(IRError, match="function f: parameter name 'n' is used twice"):
        with FunctionBuilder("f") as fb:
            n = fb.symbol("n")
            fb.param("n", float32, [n])


def test_symbols_and_existing_params_keep_their_identity():
    m = Var("m")
    shared = Buffer("w", float32, (m, 3))
    with FunctionBuilder("f") as fb:
        k = fb.symbol("k", int32)
        assert fb.add_param(shared) is shared
        fb.add_size_symbols([m * 2, 4, Var("b") + m])
    assert fb.function.params == (Var("k", int32), shared, Var("b"), m)  # sorted by name
    assert k.dtype == int32 and fb.params == fb.function.params


def test_statements_emitted_directly():
    with FunctionBuilder("misc") as fb:
        a = fb.param("a", float32, [4])
        n = fb.symbol("n")
        fb.assert_(n > 0, "n is {value}", n)
        fb.evaluate(call("exp", a[0]))
        fb.store(a, (1,), cast(n, float32))
        fb.emit(Barrier())
    assert_ir_equal(fb.function.body, Seq((
        Assert(Var("n") > 0, "n is {value}", Var("n")),
        Evaluate(call("exp", a[0])),
        Store(a, (Const(1, index_type),), cast(Var("n"), float32)),
        Barrier())))


def test_empty_function_and_empty_loop_bodies_are_empty_sequences():
    with FunctionBuilder("empty") as fb:
        for _ in fb.range(4):
            pass
    assert fb.function.body == For(Var("i"), 4, Seq(()))
    with FunctionBuilder("nothing") as fb:
        pass
    assert fb.function.body == Seq(())


def test_seq_does_not_wrap_a_single_statement():
    s = Barrier()
    assert seq([s]) is s and seq([s, s]) == Seq((s, s))


def test_stores_go_to_the_innermost_active_builder():
    with FunctionBuilder("outer") as outer:
        a = outer.param("a", float32, [2])
        a[0] = 1.0
        with FunctionBuilder("inner") as inner:
            b = inner.param("b", float32, [2])
            b[1] = 2.0
            assert current_builder() is inner
        a[1] = 3.0
    assert inner.function.body == Store(b, (1,), 2.0)
    assert outer.function.body == Seq((Store(a, (0,), 1.0), Store(a, (1,), 3.0)))


def test_a_store_outside_any_builder_is_named():
    a = Buffer("a", float32, (2,))
    with pytest.raises(IRError, match="no FunctionBuilder is active"):
        a[0] = 1.0


def test_a_failing_body_leaves_no_function_and_no_active_builder():
    fb = FunctionBuilder("broken")
    with pytest.raises(RuntimeError, match="body failed"):
        with fb:
            fb.param("a", float32, [2])
            raise RuntimeError("body failed")
    assert fb.function is None
    with pytest.raises(IRError, match="no FunctionBuilder is active"):
        current_builder()


def test_a_python_bool_condition_is_refused():
    with FunctionBuilder("f") as fb:
        i = fb.let("i", 3)
        with pytest.raises(IRError, match=r"if_\(\) got the Python bool .*eq\(a, b\)"):
            with fb.if_(i == Var("j")):
                pass
        with fb.if_(eq(i, 3)):
            pass


def test_else_must_follow_an_if_block():
    with FunctionBuilder("f") as fb:
        a = fb.param("a", float32, [1])
        with pytest.raises(IRError, match=r"else_\(\) must directly follow an if_\(\) block"):
            with fb.else_():
                pass
        with fb.if_(a[0] > 0.0):
            a[0] = 0.0
        with fb.else_():
            a[0] = 1.0
        with pytest.raises(IRError, match="directly follow"):  # a second else
            with fb.else_():
                pass


def test_a_block_left_open_is_named():
    with pytest.raises(IRError, match="function open: a loop or if block was left open"):
        with FunctionBuilder("open") as fb:
            next(iter(fb.range(4)))
