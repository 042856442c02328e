"""widen_half: half-precision arithmetic becomes float32 arithmetic, rounded back per op."""
import numpy as np

from tests.ir.ir_compare import assert_ir_equal
from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import bfloat16, float32
from treadle.ir.expr import Binary, Var, cast, maximum
from treadle.ir.passes.widen_half import widen_half
from treadle.ir.stmt import For, Seq, Store
from treadle.compiler import compile_graph
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.tensor import Tensor


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


def test_a_fused_float16_chain_rounds_after_every_operation():
    """(x * y + z) / w fuses into one kernel; each step still rounds to float16, as the four
    ONNX nodes (and numpy) compute it. Kept in float from one step to the next, about one
    element in ten would differ in its last bit."""
    tensors = [Tensor(n, "float16", [997]) for n in "xyzw"]
    x, y, z, w = tensors
    product = apply("Mul", [x, y])[0]
    total = apply("Add", [product, z])[0]
    out = apply("Div", [total, w])[0]
    run = compile_graph(Graph.from_outputs(tensors, [out]))
    rng = np.random.default_rng(7)
    arrays = [rng.uniform(0.5, 2.0, 997).astype(np.float16) for _ in range(4)]
    a, b, c, d = arrays
    np.testing.assert_array_equal(run(*arrays)[0], (a * b + c) / d)
