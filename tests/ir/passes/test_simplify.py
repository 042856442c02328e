"""simplify: expressions simplified with the ranges the program implies, trivial
statements removed, declarations kept in their scope."""
from tests.ir.ir_compare import assert_ir_equal
from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import float32
from treadle.ir.expr import Buffer, Var, const
from treadle.ir.passes.simplify import simplify
from treadle.ir.stmt import Barrier, For, Function, If, Let, Seq, Store
from treadle.ir.verify import verify

a = Buffer("a", float32, (64,))
b = Buffer("b", float32, (64,))
i, j, t = Var("i"), Var("j"), Var("t")


def _func(body) -> Function:
    return Function("f", (a, b), body)


def _simplified(func: Function) -> Function:
    result = simplify(func)
    verify(result)
    return result


def test_constant_if_keeps_the_branch_taken():
    body = For(i, 8, Seq((If(i < 8, Store(b, (i,), a[i]), Store(b, (i,), a[0])),
                          If(i >= 8, Store(b, (0,), a[i])),
                          If(i > 8, Store(b, (0,), a[i]), Store(b, (1,), a[i + 0])))))
    result = _simplified(_func(body))
    assert_ir_equal(result.body, For(i, 8, Seq((Store(b, (i,), a[i]), Store(b, (1,), a[i])))))


def test_undecided_if_stays_with_its_condition_simplified():
    body = For(i, 8, If(i + 0 < 4, Store(b, (i,), a[i]), Seq(())))
    assert_ir_equal(_simplified(_func(body)).body, For(i, 8, If(i < 4, Store(b, (i,), a[i]))))


def test_loops_of_extent_one_and_zero_go():
    body = Seq((For(i, 1, Store(b, (i * 8 + 3,), a[i])),
                For(j, 0, Store(b, (j,), a[j]))))
    result = _simplified(_func(body))
    assert_ir_equal(result.body, Store(b, (3,), a[0]))


def test_indices_are_simplified_with_loop_ranges():
    with FunctionBuilder("f") as fb:
        x = fb.param("x", float32, [8, 8])
        y = fb.param("y", float32, [64])
        for w in fb.range(64, name="w"):
            y[w // 8 * 8 + w % 8] = x[w // 8 % 8, w % 8 % 8]
    result = _simplified(fb.function)
    w = Var("w")
    assert_ir_equal(result.body, For(w, 64, Store(y, (w,), x[w // 8, w % 8])))


def test_symbolic_sizes_are_non_negative():
    with FunctionBuilder("f") as fb:
        n, m = fb.symbol("n"), fb.symbol("m")
        y = fb.param("y", float32, [n * 8 + 8])
        y[(n * 8 + 3) // 8] = 1.0
        y[(m * 8 + 3) // 8] = 2.0  # m is a plain scalar, perhaps negative
    result = _simplified(fb.function)
    assert_ir_equal(result.body, Seq((Store(y, (n,), 1.0), Store(y, ((m * 8 + 3) // 8,), 2.0))))


def test_let_values_give_ranges_and_stay_in_their_sequence():
    inner = Seq((Let(t, j % 4), Store(b, (t // 4 + t,), a[t])))
    body = For(j, 16, Seq((inner, Seq((Store(b, (j,), a[j]),)), Seq(()))))
    result = _simplified(_func(body))
    expected = For(j, 16, Seq((Seq((Let(t, j % 4), Store(b, (t,), a[t]))),
                               Store(b, (j,), a[j]))))
    assert_ir_equal(result.body, expected)


def test_unit_loop_body_with_a_declaration_keeps_its_scope():
    body = Seq((For(i, 1, Seq((Let(t, i + 2), Store(b, (t,), a[t])))), Store(b, (0,), a[0])))
    result = _simplified(_func(body))
    expected = Seq((Seq((Let(t, const(2)), Store(b, (t,), a[t]))), Store(b, (0,), a[0])))
    assert_ir_equal(result.body, expected)


def test_unit_worker_loop_with_a_barrier_stays():
    body = For(i, 1, Seq((Store(b, (i,), a[i]), Barrier())), "parallel")
    assert_ir_equal(simplify(_func(body)).body, body)
