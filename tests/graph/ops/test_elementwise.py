"""Element-wise operators against numpy, with broadcasting and symbolic shapes."""
import math

import numpy as np
import pytest

from tests.harness import assert_close, random_array, run_graph, run_onnxruntime
from treadle.compiler import compile_graph
from treadle.errors import DTypeError, KernelError, ShapeError
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.tensor import Tensor, constant

ERF = np.vectorize(math.erf)

UNARY_REFERENCE = {
    "Relu": lambda x: np.maximum(x, 0),
    "Neg": np.negative, "Abs": np.abs, "Sign": np.sign,
    "Exp": np.exp, "Log": np.log, "Sqrt": np.sqrt,
    "Reciprocal": lambda x: 1 / x, "Tanh": np.tanh, "Sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "Erf": ERF, "Sin": np.sin, "Cos": np.cos, "Floor": np.floor, "Ceil": np.ceil,
    "Softplus": lambda x: np.log1p(np.exp(x)), "Softsign": lambda x: x / (1 + np.abs(x)),
    "LeakyRelu": lambda x: np.where(x < 0, 0.01 * x, x),
    "Elu": lambda x: np.where(x < 0, np.exp(x) - 1, x),
    "HardSigmoid": lambda x: np.clip(0.2 * x + 0.5, 0, 1),
    "HardSwish": lambda x: x * np.clip(x / 6 + 0.5, 0, 1),
    "Gelu": lambda x: 0.5 * x * (1 + ERF(x / np.sqrt(2))),
}
# Ops defined on part of the line get inputs from their domain.
DOMAIN = {"Log": lambda x: np.abs(x) + 0.5, "Sqrt": np.abs}

BINARY_REFERENCE = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide,
    "Equal": np.equal, "Less": np.less, "Greater": np.greater,
    "LessOrEqual": np.less_equal, "GreaterOrEqual": np.greater_equal,
}


def test_unary_ops_in_one_graph():
    x = Tensor("x", "float32", [3, 37])
    outs = [apply(op, [x], name=op.lower())[0] for op in UNARY_REFERENCE]
    value = random_array((3, 37), seed=1, low=-3, high=3)
    value[0, :3] = [0.5, -0.0, 1e-3]
    results = run_graph([(x, value)], outs)
    for op, result in zip(UNARY_REFERENCE, results):
        if op in DOMAIN:
            continue
        with np.errstate(divide="ignore"):
            expected = UNARY_REFERENCE[op](value.astype(np.float64)).astype(np.float32)
        assert_close(result, expected, reduction=100, context=op)


@pytest.mark.parametrize("op", sorted(DOMAIN))
def test_domain_restricted_unary_ops(op):
    x = Tensor("x", "float32", [61])
    value = DOMAIN[op](random_array((61,), seed=2, low=-4, high=4))
    (result,) = run_graph([(x, value)], [apply(op, [x])[0]])
    assert_close(result, UNARY_REFERENCE[op](value), context=op)


@pytest.mark.parametrize("shapes", [((7, 1, 5), (3, 1)), ((1,), (2, 3)), ((4, 1), (4, 97)), ((), (5,))])
def test_binary_ops_broadcast(shapes):
    a, b = Tensor("a", "float32", shapes[0]), Tensor("b", "float32", shapes[1])
    outs = [apply(op, [a, b], name=op)[0] for op in BINARY_REFERENCE]
    va = random_array(shapes[0], seed=3)
    vb = random_array(shapes[1], seed=4) + 2.0
    for op, result in zip(BINARY_REFERENCE, run_graph([(a, va), (b, vb)], outs)):
        assert_close(result, BINARY_REFERENCE[op](va, vb), context=op)


@pytest.mark.parametrize("exponent", [1.0, 2.0, 3.0, 4.0, 2.5, -1.0])
def test_pow_by_a_known_exponent(exponent):
    # Small integer powers become products (the generated loop vectorises); others pow().
    x = Tensor("x", "float32", [97])
    y = apply("Pow", [x, constant(np.float32(exponent))])[0]
    value = random_array((97,), seed=5, low=0.1, high=3)
    (result,) = run_graph([(x, value)], [y])
    assert_close(result, np.power(value, np.float32(exponent)), context=f"x ** {exponent}")
    uses_pow = "pow" in str(compile_graph(Graph.from_outputs([x], [y])).steps[0].kernel.function)
    assert uses_pow == (exponent not in (1.0, 2.0, 3.0, 4.0))


def _ort_pow(base: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    from onnx import helper
    graph = helper.make_graph(
        [helper.make_node("Pow", ["a", "b"], ["y"])], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in (("a", base), ("b", exponent))],
        [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)], ir_version=9)
    return run_onnxruntime(model, {"a": base, "b": exponent})[0]


def _pow_operands(base_dtype, exponent_dtype, base_shape, exponent_shape, seed):
    """Bases and exponents whose powers fit the base's dtype: integer exponents from -3
    on (negative ones truncate to 0 but for bases 1 and -1), fractional ones of positive
    bases only, and no 0 to a negative power (infinite, with no integer value)."""
    gen = np.random.default_rng(seed)
    if np.issubdtype(np.dtype(exponent_dtype), np.integer):
        base = gen.integers(-6, 7, base_shape)
        exponent = gen.integers(-3, 11, exponent_shape)
    else:
        base = gen.integers(1, 10, base_shape)
        exponent = gen.uniform(-1.5, 3.0, exponent_shape)
    base = base.astype(base_dtype)
    exponent = exponent.astype(exponent_dtype)
    b_base, b_exponent = np.broadcast_arrays(base, exponent)
    if np.any((b_base == 0) & (b_exponent < 0)):
        exponent = np.abs(exponent)
    return base, exponent


@pytest.mark.parametrize("base_dtype, exponent_dtype", [
    ("int32", "int32"), ("int64", "int64"), ("int32", "int64"), ("int64", "int32"),
    ("int32", "float32"), ("int64", "float32"), ("int64", "float64")])
def test_integer_pow_matches_onnxruntime(base_dtype, exponent_dtype):
    a, b = Tensor("a", base_dtype, ["n", 1, 13]), Tensor("b", exponent_dtype, [5, 1])
    known = constant(np.array(3 if "int" in exponent_dtype else 0.5, exponent_dtype))
    outs = [apply("Pow", [a, b])[0], apply("Pow", [a, known])[0]]
    program = compile_graph(Graph.from_outputs([a, b], outs))
    for n in (0, 1, 7):
        base, exponent = _pow_operands(base_dtype, exponent_dtype, (n, 1, 13), (5, 1), n)
        got = program(base, exponent)
        for actual, ref in zip(got, (_ort_pow(base, exponent), _ort_pow(base, known.data))):
            assert actual.dtype == ref.dtype and actual.shape == ref.shape
            np.testing.assert_array_equal(actual, ref, err_msg=f"n={n}")


def test_symbolic_broadcast_compiles_once():
    a = Tensor("a", "float32", ["batch", "seq", 8])
    bias = constant(random_array((8,), seed=5), "bias")
    y = apply("Add", [a, bias])[0]
    model = compile_graph(Graph.from_outputs([a], [y]))
    for shape in [(1, 1, 8), (2, 7, 8), (3, 61, 8)]:
        value = random_array(shape, seed=6)
        assert_close(model(value)[0], value + bias.data)


def test_symbolic_against_concrete_broadcast_is_checked_at_run_time():
    a = Tensor("a", "float32", ["n"])
    b = Tensor("b", "float32", [4])
    model = compile_graph(Graph.from_outputs([a, b], [apply("Add", [a, b], name="add")[0]]))
    ones = np.ones(4, np.float32)
    assert_close(model(ones, ones)[0], ones * 2)
    with pytest.raises(Exception, match="add"):
        model(np.ones(3, np.float32), ones)



@pytest.mark.parametrize("a_shape,b_shape", [
    ((3,), (1,)), ((1,), (5,)), ((0,), (1,)), ((1,), (0,)), ((7,), (7,)), ((1,), (1,))])
def test_a_symbol_that_is_one_at_run_time_broadcasts_against_another(a_shape, b_shape):
    a, b = Tensor("a", "float32", ["p"]), Tensor("b", "float32", ["q"])
    model = compile_graph(Graph.from_outputs([a, b], [apply("Add", [a, b])[0]]))
    va, vb = random_array(a_shape, seed=1), random_array(b_shape, seed=2)
    assert_close(model(va, vb)[0], va + vb, context=f"{a_shape} + {b_shape}")


def test_symbols_of_size_one_broadcast_in_every_position():
    c = Tensor("c", "bool", ["n", 1])
    a, b = Tensor("a", "float32", ["m", "k"]), Tensor("b", "float32", [13])
    where = apply("Where", [c, a, b])[0]
    x, w = Tensor("x", "float32", ["s", 3, 5]), Tensor("w", "float32", ["t", 5, 2])
    product = apply("MatMul", [x, w])[0]
    model = compile_graph(Graph.from_outputs([c, a, b, x, w], [where, product]))
    for n, m, k, s, t in [(1, 7, 13, 1, 4), (7, 1, 1, 3, 1), (7, 7, 13, 2, 2)]:
        vc = np.random.default_rng(n).random((n, 1)) < 0.5
        va, vb = random_array((m, k), seed=3), random_array((13,), seed=4)
        vx, vw = random_array((s, 3, 5), seed=5), random_array((t, 5, 2), seed=6)
        got = model(vc, va, vb, vx, vw)
        assert_close(got[0], np.where(vc, va, vb), context=f"where n={n} m={m} k={k}")
        assert_close(got[1], np.matmul(vx, vw), reduction=5, context=f"matmul s={s} t={t}")


def test_symbols_that_cannot_broadcast_are_refused_at_run_time():
    a, b = Tensor("a", "float32", ["p"]), Tensor("b", "float32", ["q"])
    model = compile_graph(Graph.from_outputs([a, b], [apply("Add", [a, b], name="add")[0]]))
    with pytest.raises(KernelError, match="'add'"):
        model(np.ones(3, np.float32), np.ones(2, np.float32))

def test_integer_ops_follow_onnx():
    a, b = Tensor("a", "int64", [6]), Tensor("b", "int64", [6])
    va = np.array([7, -7, 7, -7, 0, 5], np.int64)
    vb = np.array([2, 2, -2, -2, 3, 5], np.int64)
    div, mod, fmod = (apply("Div", [a, b])[0], apply("Mod", [a, b])[0],
                      apply("Mod", [a, b], {"fmod": 1})[0])
    got = run_graph([(a, va), (b, vb)], [div, mod, fmod])
    np.testing.assert_array_equal(got[0], np.trunc(va / vb).astype(np.int64))
    np.testing.assert_array_equal(got[1], np.mod(va, vb))
    np.testing.assert_array_equal(got[2], np.fmod(va, vb))


def _mod_operands(dtype) -> tuple[np.ndarray, np.ndarray]:
    """Dividends as a column and divisors as a row: quotients far past the mantissa, both
    signs, zeros, a subnormal, infinities and NaN, with random ones up to the type's
    largest value (31 x 13: a vector loop and its tail)."""
    gen = np.random.default_rng(5)
    big = np.finfo(dtype).max
    specials = [5.536e7, 8.858e8, 1.417e10, big, -big, 7.5, -7.5, 5.0, -5.0, 0.0, -0.0,
                np.finfo(dtype).smallest_subnormal, np.inf, -np.inf, np.nan]
    scale = 10.0 ** gen.uniform(0, np.log10(big), 16)
    a = np.concatenate([np.clip(specials, -big, big), scale * gen.choice([-1, 1], 16)])
    b = [7.0, -7.0, 100.0, 0.1, -3.0, 1.0, 2.0 ** -10, np.inf, -np.inf, 0.0, np.nan,
         float(gen.uniform(1, 9)), -float(gen.uniform(1, 9))]
    return a.astype(dtype)[:, None], np.array(b, dtype)[None, :]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_float_mod_is_exact_for_any_quotient(dtype):
    """Mod with fmod=1 is C's fmod (the dividend's sign), without: numpy.mod (the
    divisor's sign, opset 28's infinite divisor), both exact however large the quotient."""
    va, vb = _mod_operands(dtype)
    a, b = Tensor("a", dtype, va.shape), Tensor("b", dtype, vb.shape)
    outs = [apply("Mod", [a, b], {"fmod": 1})[0], apply("Mod", [a, b])[0]]
    fmod, mod = run_graph([(a, va), (b, vb)], outs)
    with np.errstate(invalid="ignore", divide="ignore"):
        np.testing.assert_array_equal(fmod, np.fmod(va, vb))
        np.testing.assert_array_equal(mod, np.mod(va, vb))


def test_bfloat16_mod_is_exact():
    """bfloat16 (raw bits, the float32 operands truncated) is worked on in float32: the
    exact remainder of two bfloat16 values is a bfloat16 value."""
    bits = [(v.view(np.uint32) >> 16).astype(np.uint16) for v in _mod_operands("float32")]
    va, vb = ((b.astype(np.uint32) << 16).view(np.float32) for b in bits)
    a, b = Tensor("a", "bfloat16", va.shape), Tensor("b", "bfloat16", vb.shape)
    outs = [apply("Mod", [a, b], {"fmod": 1})[0], apply("Mod", [a, b])[0]]
    got = run_graph([(a, bits[0]), (b, bits[1])], outs)
    with np.errstate(invalid="ignore", divide="ignore"):
        for result, expected in zip(got, (np.fmod(va, vb), np.mod(va, vb))):
            widened = (result.astype(np.uint32) << 16).view(np.float32)
            np.testing.assert_array_equal(widened, expected)


def test_sign_keeps_nan():
    """ONNX's reference is numpy.sign, and ONNX Runtime agrees: NaN stays NaN."""
    for dtype in ("float32", "float16"):
        x = Tensor("x", dtype, [61])
        value = np.resize(np.array([np.nan, -2.5, 0.0, -0.0, 3.0, np.inf, -np.inf, 1e-30],
                                   dtype), 61)
        (result,) = run_graph([(x, value)], [apply("Sign", [x])[0]])
        np.testing.assert_array_equal(result, np.sign(value), err_msg=dtype)


def test_where_cast_clip_and_variadic():
    c = Tensor("c", "bool", [5, 1])
    x, y = Tensor("x", "float32", [5, 3]), Tensor("y", "float32", [3])
    outs = [apply("Where", [c, x, y])[0],
            apply("Cast", [x], {"to": 7})[0],
            apply("Clip", [x, constant(np.float32(-0.5)), constant(np.float32(0.25))])[0],
            apply("Max", [x, y])[0], apply("Min", [x, y, x])[0], apply("Sum", [x, y])[0],
            apply("Mean", [x, y])[0]]
    vc = np.array([[True], [False], [True], [False], [True]])
    vx, vy = random_array((5, 3), seed=7, low=-3, high=3), random_array((3,), seed=8)
    got = run_graph([(c, vc), (x, vx), (y, vy)], outs)
    assert_close(got[0], np.where(vc, vx, vy))
    np.testing.assert_array_equal(got[1], vx.astype(np.int64))
    assert_close(got[2], np.clip(vx, -0.5, 0.25))
    assert_close(got[3], np.maximum(vx, vy))
    assert_close(got[4], np.minimum(vx, vy))
    assert_close(got[5], vx + vy)
    assert_close(got[6], (vx + vy) / 2)


def test_mismatched_dtypes_name_the_node():
    a, b = Tensor("a", "float32", [3]), Tensor("b", "int64", [3])
    with pytest.raises(DTypeError, match="plus"):
        apply("Add", [a, b], name="plus")


def test_incompatible_shapes_name_the_node():
    a, b = Tensor("a", "float32", [3]), Tensor("b", "float32", [4])
    with pytest.raises(ShapeError, match="plus"):
        apply("Add", [a, b], name="plus")


def test_float_only_op_rejects_integers():
    with pytest.raises(ShapeError, match="needs a float"):
        apply("Exp", [Tensor("a", "int32", [3])])


def test_max_min_relu_and_clip_propagate_nan():
    """A NaN on either side of Max and Min (variadic) wins, as in numpy and ONNX Runtime;
    Relu and Clip of NaN are NaN. 61 elements: vector loop and scalar tail."""
    pattern = [[np.nan, 1.0, np.nan, -np.inf, np.inf, 2.0, 0.5],
               [1.0, np.nan, np.nan, np.nan, 2.0, -np.inf, -0.5],
               [0.0, 0.0, 3.0, 1.0, np.nan, np.nan, 0.25]]
    va, vb, vc = (np.resize(np.array(p, np.float32), 61) for p in pattern)
    a, b, c = (Tensor(n, "float32", ["n"]) for n in "abc")
    outs = [apply("Max", [a, b])[0], apply("Max", [b, a, c])[0], apply("Min", [a, b])[0],
            apply("Min", [c, b, a])[0], apply("Relu", [a])[0],
            apply("Clip", [b, constant(np.float32(-1)), constant(np.float32(1))])[0]]
    got = run_graph([(a, va), (b, vb), (c, vc)], outs)
    refs = [np.maximum(va, vb), np.maximum(np.maximum(vb, va), vc), np.minimum(va, vb),
            np.minimum(np.minimum(vc, vb), va), np.maximum(va, 0), np.clip(vb, -1, 1)]
    for k, (actual, ref) in enumerate(zip(got, refs)):
        np.testing.assert_array_equal(actual, ref, err_msg=f"output {k}")


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("bounds", [(None, None), (None, 1.0), (-1.0, None), (-1.0, 1.0)])
def test_a_missing_clip_bound_is_the_largest_finite_value(dtype, bounds):
    """ONNX's Clip bounds default to the type's lowest and largest values, so an infinity
    clips to them, as ONNX Runtime does (numpy's clip without a bound would keep it); NaN
    stays NaN. 61 elements: vector loop and scalar tail."""
    x = Tensor("x", dtype, ["n"])
    operands = [x] + [None if b is None else constant(np.array(b, dtype)) for b in bounds]
    y = apply("Clip", operands)[0]
    xs = np.resize(np.array([np.nan, np.inf, -np.inf, 2.0, -3.0, 0.5, -0.0], dtype), 61)
    largest = np.finfo(dtype).max
    low, high = (-largest if bounds[0] is None else bounds[0],
                 largest if bounds[1] is None else bounds[1])
    (actual,) = run_graph([(x, xs)], [y])
    np.testing.assert_array_equal(actual, np.clip(xs, low, high).astype(dtype))


@pytest.mark.parametrize("op", ["Not", "BitwiseNot"])
def test_complementing_floats_is_a_dtype_error(op):
    from treadle import ops
    with pytest.raises(DTypeError, match="bool or integer"):
        ops.op(op, ops.input("x", "float32", [3]))
