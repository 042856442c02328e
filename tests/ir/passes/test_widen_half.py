"""widen_half: bfloat16 arithmetic becomes float32 arithmetic, rounded back once."""
from tests.ir.ir_compare import assert_ir_equal
from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import bfloat16, float32
from treadle.ir.expr import Binary, Var, cast, maximum
from treadle.ir.passes.widen_half import widen_half
from treadle.ir.stmt import For, Seq, Store


def test_arithmetic_and_comparisons_run_in_float32():
    with FunctionBuilder("f") as fb:
        a = fb.param("a", bfloat16, [4])
        b = fb.param("b", bfloat16, [4])
        m = fb.param("m", "bool", [4])
        for i in fb.range(4, name="i"):
            a[i] = maximum(a[i] * b[i], b[i])
            m[i] = a[i] < b[i]
    i = Var("i")
    a, b, m = fb.function.params
    wide = [cast(x[i], float32) for x in (a, b)]
    product = cast(Binary("*", *wide), bfloat16)
    larger = cast(maximum(cast(product, float32), wide[1]), bfloat16)
    expected = For(i, 4, Seq((Store(a, (i,), larger), Store(m, (i,), Binary("<", *wide)))))
    assert_ir_equal(widen_half(fb.function).body, expected)


def test_float32_programs_are_left_alone():
    with FunctionBuilder("f") as fb:
        a = fb.param("a", float32, [4])
        for i in fb.range(4, name="i"):
            a[i] = a[i] * 2.0
    assert widen_half(fb.function) == fb.function
