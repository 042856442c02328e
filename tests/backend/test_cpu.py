"""The C backend: generated text, and compiled kernels checked against numpy and against
the IR's own scalar meaning (functor.evaluate)."""
from __future__ import annotations

import random
import re
import struct
from dataclasses import replace

import numpy as np
import pytest

import treadle.backend.cpu as cpu_backend
from treadle.backend.c import c_name
from treadle.backend.cpu import generate
from treadle.errors import IRError, KernelError
from treadle.ir import dtypes
from treadle.ir.builder import FunctionBuilder
from treadle.ir.expr import (Binary, Unary, broadcast, call, cast, const, eq, logical_and,
                             maximum, minimum, ne, select)
from treadle.ir.functor import evaluate
from treadle.ir.mapping import spatial
from treadle.ir.primitives import PRIMITIVES
from treadle.backend.cpu import build
from treadle.runtime.interpret import interpret
from treadle.runtime.module import load
from treadle.target import cpu
from treadle.target.cpu import host

SCALAR_DTYPES = [t for t in dtypes.BY_NAME.values() if not t.is_vector]


def _compile(*functions):
    """Generated C as is, without the lowering pipeline (these programs are lowered)."""
    return load(build(generate(functions), "test_c"), functions)


def _scale_rows():
    """B[i, k] = 2 * A[i, k] over a parallel row loop."""
    with FunctionBuilder("scale") as fb:
        M, K = fb.symbol("M"), fb.symbol("K")
        A = fb.param("A", "float32", [M, K])
        B = fb.param("B", "float32", [M, K])
        for i in fb.range(M, kind="parallel"):
            for k in fb.range(K, name="k"):
                B[i, k] = A[i, k] * 2.0
    return fb.function


# ---- generated text --------------------------------------------------------------------

def test_signature_pointers_and_outlined_parallel_loop():
    text = generate([_scale_rows()])
    assert ("int32_t kernel_scale(int64_t M, int64_t K, const float *restrict A, "
            "float *restrict B) {") in text
    # The body is a function of an iteration range; what it uses travels in a struct.
    assert "static void kernel_scale__loop0(void *treadle_ctx, int64_t treadle_begin" in text
    assert "for (int64_t i = treadle_begin; i < treadle_end; ++i) {" in text
    assert "const int64_t K = treadle_c->K;" in text
    assert "float *restrict B = treadle_c->B;" in text
    assert "treadle_parallel_for(M, kernel_scale__loop0, &kernel_scale__loop0_ctx);" in text
    assert "B[i * K + k] = A[i * K + k] * 2.0f;" in text
    assert "void treadle_set_parallel(treadle_parallel_fn run)" in text
    assert "void treadle_set_num_threads(int n)" in text
    assert "const char *kernel_scale__messages[] = {" in text


def test_nested_parallel_loop_prints_serial_and_pragmas():
    with FunctionBuilder("loops") as fb:
        A = fb.param("A", "float32", [4, 1000])
        for i in fb.range(4, kind="parallel"):
            for j in fb.range(1000, kind="parallel", name="j"):
                A[i, j] = 0.0
            for u in fb.range(4, kind="unroll", name="u"):
                A[i, u] = 1.0
            for u in fb.range(1000, kind="unroll", name="w"):
                A[i, u] = 2.0
            for v in fb.range(8, kind="vectorize", name="v"):
                A[i, v] = 3.0
    text = generate([fb.function])
    assert text.count("treadle_parallel_for(") == 2  # the helper's definition and one call
    assert "#pragma GCC unroll 4\n" in text and "#pragma GCC unroll 64\n" in text
    assert "#pragma omp simd" in text


@pytest.mark.parametrize("m, n", [(1, 1), (2, 3), (7, 13), (97, 5), (1000, 3)])
def test_parallel_body_sees_what_is_declared_outside_it(m, n):
    """A parallel body runs in a function of its own: values computed without memory are
    computed again there (the C compiler sees constants), a value read from memory and a
    stack array filled before the loop are passed in, and symbols that only appear in a
    buffer's shape (its row stride) reach the body too."""
    with FunctionBuilder("outlined") as fb:
        M, N = fb.symbol("M"), fb.symbol("N")
        A = fb.param("A", "float32", [M, N])
        B = fb.param("B", "float32", [M, N])
        offset = fb.let("offset", const(3) - const(1))
        first = fb.let("first", A[0, 0])
        weights = fb.buffer("weights", "float32", [4])
        for w in fb.range(4, name="w"):
            weights[w] = cast(w + offset, "float32")
        for i in fb.range(M, kind="parallel"):
            for j in fb.range(N, name="j"):
                B[i, j] = A[i, j] * weights[i % 4] + first + cast(offset, "float32")
    text = generate([fb.function])
    assert "const int64_t offset = (int64_t)3 - 1;" in text.split("__loop0(void")[1]
    assert "const float first = treadle_c->first;" in text
    assert "float *restrict weights = __builtin_assume_aligned(treadle_c->weights, 64);" in text
    a = np.random.default_rng(m).standard_normal((m, n)).astype(np.float32)
    b = np.zeros_like(a)
    _compile(fb.function).outlined(a, b)
    expected = a * (np.arange(m) % 4 + 2)[:, None].astype(np.float32) + a[0, 0] + 2
    np.testing.assert_allclose(b, expected, rtol=1e-6, atol=1e-6)


def test_parallel_loop_racing_on_an_outer_scalar_is_rejected():
    with FunctionBuilder("racy") as fb:
        A = fb.param("A", "float32", [16])
        total = fb.scalar("total", "float32", 0.0)
        for i in fb.range(16, kind="parallel"):
            total[()] = total[()] + A[i]
        A[0] = total[()]
    with pytest.raises(IRError, match="racy.*parallel loop over i uses the scalar total"):
        generate([fb.function])


def test_local_buffers():
    with FunctionBuilder("locals") as fb:
        A = fb.param("A", "float32", [64])
        acc = fb.scalar("acc", "float32", 0.0)
        tile = fb.buffer("tile", "float32", [8, 8])
        for i in fb.range(64):
            tile[i // 8, i % 8] = A[i]
            acc[()] = acc[()] + tile[i // 8, i % 8]
        A[0] = acc[()]
    text = generate([fb.function])
    assert "    float acc;\n    acc = 0.0f;" in text
    assert "float tile[64] __attribute__((aligned(64)));" in text
    # The flat offset is simplified: the two digits of i add back up to i.
    assert "tile[i] = A[i];" in text



def test_loop_extent_that_is_a_select_keeps_its_precedence():
    # A broadcast dimension is select(a == 1, b, a); `i < a == 1 ? b : a` would loop
    # past the end.
    with FunctionBuilder("count") as fb:
        a, b = fb.symbol("a"), fb.symbol("b")
        out = fb.param("out", "int64", [1])
        out[0] = const(0)
        for _ in fb.range(select(eq(a, 1), b, a)):
            out[0] = out[0] + 1
    assert "< (a == 1 ? b : a);" in generate([fb.function])
    kernel = _compile(fb.function).functions["count"]
    for va, vb, expected in [(1, 5, 5), (3, 1, 3), (4, 4, 4), (0, 1, 0)]:
        result = np.zeros(1, np.int64)
        kernel(result, a=va, b=vb)
        assert result[0] == expected, (va, vb)

def test_symbolic_local_buffer_is_rejected():
    with FunctionBuilder("symbolic_local") as fb:
        n = fb.symbol("n")
        fb.buffer("scratch", "float32", [n])
    with pytest.raises(IRError, match="symbolic_local.*scratch.*symbolic"):
        generate([fb.function])


def test_unlowered_task_mapping_is_rejected():
    with FunctionBuilder("unlowered") as fb:
        A = fb.param("A", "float32", [4])
        for w in fb.range(4, kind="parallel", name="w"):
            for (i,) in spatial(4).on(w):
                A[i] = 0.0
    with pytest.raises(IRError, match="'unlowered'.*ForTask"):
        generate([fb.function])


def test_bfloat16_arithmetic_and_odd_casts_are_rejected():
    with FunctionBuilder("bf16_add") as fb:
        A = fb.param("A", "bfloat16", [4])
        A[0] = A[1] + A[2]
    with pytest.raises(IRError, match="bf16_add.*bfloat16"):
        generate([fb.function])
    with FunctionBuilder("bf16_to_f64") as fb:
        A = fb.param("A", "bfloat16", [4])
        D = fb.param("D", "float64", [4])
        D[0] = cast(A[0], "float64")
    with pytest.raises(IRError, match="bfloat16 converts only to and from"):
        generate([fb.function])


def test_unsupported_vector_operations_are_rejected():
    with FunctionBuilder("vec_exp") as fb:
        A = fb.param("A", "float32", [8])
        A[0] = call("exp", A.vload(0, 8))
    with pytest.raises(IRError, match="exp is not supported for vector dtype float32x8"):
        generate([fb.function])
    with FunctionBuilder("too_wide") as fb:
        A = fb.param("A", "float32", [32])
        v = A.vload(0, 32)
        A[0] = call("fma", v, v, v)
    with pytest.raises(IRError, match="fma is not supported for vector dtype float32x32"):
        generate([fb.function])


def _fma16():
    with FunctionBuilder("fma16") as fb:
        A = fb.param("A", "float32", [16])
        B = fb.param("B", "float32", [16])
        v = A.vload(0, 16)
        B[0] = call("fma", v, B.vload(0, 16), v)
    return fb.function


def test_fma_on_512_bit_vectors_only_where_the_cpu_has_them(monkeypatch):
    avx2 = replace(host(), features=("avx2", "fma"))
    monkeypatch.setattr(cpu_backend, "host", lambda: avx2)
    with pytest.raises(IRError, match="float32x16 on this CPU .it has float32x4, float32x8, "
                                      "float64x2, float64x4"):
        generate([_fma16()])
    monkeypatch.undo()
    if host().widest_simd_bytes < 64:
        return
    assert "_mm512_fmadd_ps" in generate([_fma16()])
    a, b = np.arange(16, dtype=np.float32), np.linspace(-1, 1, 16, dtype=np.float32)
    expected = a * b + a
    _compile(_fma16()).fma16(a, b)
    np.testing.assert_allclose(b, expected, rtol=1e-6)


# ---- names ------------------------------------------------------------------------------

HOSTILE = 'a b;system("x")'


def test_hostile_names_become_safe_unique_identifiers():
    with FunctionBuilder(HOSTILE) as fb:
        n = fb.symbol("int")
        srcs = [fb.param(name, "float32", [n]) for name in ("*/ x", "linux", "NAN", "a-b")]
        out = fb.param("a b", "float32", [n])
        for i in fb.range(n, name="return"):
            out[i] = srcs[0][i] + srcs[1][i] + srcs[2][i] + srcs[3][i]
    func = fb.function
    symbol = c_name(func)
    assert re.fullmatch(r"kernel_[A-Za-z0-9_]+", symbol) and "__" not in symbol
    text = generate([func])
    assert "system" not in text.replace(symbol, "") and '"x"' not in text
    assert re.search(r"\bint64_t int_\b", text) and re.search(r"\blinux_\b", text)
    assert re.search(r"\bNAN_\b", text) and re.search(r"\breturn_\b", text)
    assert re.search(r"\ba_b\b", text) and re.search(r"\ba_b_1\b", text)  # deduplicated
    arrays = [np.full(5, k, np.float32) for k in (1, 2, 3, 4)]
    out_array = np.zeros(5, np.float32)
    _compile(func)[HOSTILE](*arrays, out_array)
    np.testing.assert_array_equal(out_array, np.full(5, 10, np.float32))


def test_kernel_names_stay_distinct_and_collisions_are_reported():
    names = ["f-1", "f 1", "f_1", "exp", "x__messages"]
    symbols = set()
    for name in names:
        with FunctionBuilder(name) as fb:
            fb.param("A", "float32", [1])
        symbols.add(c_name(fb.function))
    assert len(symbols) == len(names)
    with pytest.raises(IRError, match="distinct names"):
        generate([fb.function, fb.function])


def test_hostile_assert_message_is_escaped_and_reported():
    message = 'bad"); system("rm -rf /"); ("\\ ??= é'
    with FunctionBuilder("checked") as fb:
        n = fb.symbol("n")
        A = fb.param("A", "float32", [n])
        fb.assert_(n > 2, message)
        A[0] = 1.0
    text = generate([fb.function])
    assert 'system("' not in text
    with pytest.raises(KernelError, match=re.escape(message)):
        _compile(fb.function).checked(np.zeros(2, np.float32))



@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_failed_assert_reports_its_value_in_c_and_the_interpreter(kind):
    """The value an Assert carries (the offending element) replaces {value} in its message,
    also from inside a parallel loop, whose failure cannot return directly."""
    with FunctionBuilder(f"first_negative_{kind}") as fb:
        n = fb.symbol("n")
        A = fb.param("A", "int64", [n])
        for i in fb.range(n, kind=kind):
            fb.assert_(A[i] >= 0, "element {value} is negative", A[i] * 10)
    good, bad = np.arange(5, dtype=np.int64), np.array([3, 1, -7, 2], np.int64)
    kernel = getattr(_compile(fb.function), fb.function.name)
    kernel(good)
    interpret(fb.function, good)
    with pytest.raises(KernelError, match="element -70 is negative"):
        kernel(bad)
    with pytest.raises(KernelError, match="element -70 is negative"):
        interpret(fb.function, bad)

# ---- expressions vs the IR's meaning ------------------------------------------------------

def _random_int_expr(rng: random.Random, leaves, depth: int):
    if depth == 0 or rng.random() < 0.15:
        return rng.choice(leaves) if rng.random() < 0.7 else const(rng.randint(-9, 9))
    a, b = _random_int_expr(rng, leaves, depth - 1), _random_int_expr(rng, leaves, depth - 1)
    op = rng.choice(["+", "-", "*", "//", "%", "min", "max", "&", "|", "^", "<<", ">>",
                     "neg", "~", "select", "cmp"])
    if op in ("//", "%"):
        return Binary(op, a, b | 1)  # odd, so never zero
    if op == "<<":
        return (a & 255) << rng.randint(0, 3)  # C shifts of negative values are undefined
    if op == ">>":
        return a >> rng.randint(0, 3)
    if op in ("neg", "~"):
        return Unary(op, a)
    if op == "select":
        return select(a < b, a, b + 1)
    if op == "cmp":
        return cast(logical_and(a <= b, ne(a, 3)) | eq(b, 0), "int64")
    return minimum(a, b) if op == "min" else maximum(a, b) if op == "max" else Binary(op, a, b)


def test_integer_precedence_matches_evaluate():
    rng = random.Random(1234)
    with FunctionBuilder("int_exprs") as fb:
        a, b, c = fb.symbol("a"), fb.symbol("b"), fb.symbol("c")
        handwritten = [a - (b - c), a - b - c, (a + b) * c, a * (b + c), -(a - b), a // 3 * c,
                       a // (b * c | 1), a % 5 % 3, (a & b) | c, a ^ (b & c), ~a + 1,
                       Binary("*", const(100000), const(100000)) * (a | 1),
                       Binary("<<", const(1), const(40)) + a, a - -3]
        exprs = handwritten + [_random_int_expr(rng, [a, b, c], 3) for _ in range(80)]
        out = fb.param("out", "int64", [len(exprs)])
        for k, e in enumerate(exprs):
            out[k] = e
    kernel = _compile(fb.function).int_exprs
    for values in [(7, -3, 5), (-50, 17, -9), (0, 1, -1), (41, 41, 2), (-13, -6, 11)]:
        result = np.zeros(len(exprs), np.int64)
        kernel(result, a=values[0], b=values[1], c=values[2])
        env = dict(zip((a, b, c), values))
        expected = [evaluate(e, env) for e in exprs]
        for k, e in enumerate(exprs):
            assert result[k] == expected[k], f"{e} with {values}"


def _random_float_expr(rng: random.Random, leaves, depth: int):
    # Small integers and exact operations, so every result is exact and FMA contraction
    # cannot change it.
    if depth == 0 or rng.random() < 0.15:
        return rng.choice(leaves) if rng.random() < 0.7 else const(rng.randint(-9, 9), "float64")
    a, b = _random_float_expr(rng, leaves, depth - 1), _random_float_expr(rng, leaves, depth - 1)
    op = rng.choice(["+", "-", "*", "/", "min", "max", "neg", "select"])
    if op == "/":
        return a / const(rng.choice([2.0, 4.0, 0.5, -2.0]), "float64")
    if op == "neg":
        return -a
    if op == "select":
        return select(logical_and(a < b, ne(b, 2.0)), a, b)
    return minimum(a, b) if op == "min" else maximum(a, b) if op == "max" else Binary(op, a, b)


def test_float_precedence_matches_evaluate():
    rng = random.Random(99)
    with FunctionBuilder("float_exprs") as fb:
        x, y = fb.symbol("x", dtypes.float64), fb.symbol("y", dtypes.float64)
        exprs = [x - (y - x), x / (y * 2.0), -(x * y)] + \
            [_random_float_expr(rng, [x, y], 3) for _ in range(60)]
        out = fb.param("out", "float64", [len(exprs)])
        for k, e in enumerate(exprs):
            out[k] = e
    kernel = _compile(fb.function).float_exprs
    for values in [(3.0, -5.0), (-7.0, 2.0), (0.5, 0.25)]:
        result = np.zeros(len(exprs), np.float64)
        kernel(result, x=values[0], y=values[1])
        expected = [evaluate(e, dict(zip((x, y), values))) for e in exprs]
        np.testing.assert_array_equal(result, np.array(expected))


@pytest.mark.parametrize("dtype", ["int32", "int64", "int8"])
def test_integer_division_follows_c(dtype):
    with FunctionBuilder(f"divmod_{dtype}") as fb:
        n = fb.symbol("n")
        A, B = fb.param("A", dtype, [n]), fb.param("B", dtype, [n])
        Q, R = fb.param("Q", dtype, [n]), fb.param("R", dtype, [n])
        Q3, R3 = fb.param("Q3", dtype, [n]), fb.param("R3", dtype, [n])
        for i in fb.range(n):
            Q[i] = A[i] // B[i]
            R[i] = A[i] % B[i]
            Q3[i] = A[i] // -3
            R3[i] = A[i] % 3
    pairs = [(x, y) for x in range(-9, 10) for y in range(-4, 5) if y != 0]
    a = np.array([p[0] for p in pairs], dtype)
    b = np.array([p[1] for p in pairs], dtype)
    outs = [np.zeros_like(a) for _ in range(4)]
    _compile(fb.function)[f"divmod_{dtype}"](a, b, *outs)
    for k, (x, y) in enumerate(pairs):
        cx, cy = const(x, dtype), const(y, dtype)
        assert outs[0][k] == evaluate(Binary("//", cx, cy)), (x, y)
        assert outs[1][k] == evaluate(Binary("%", cx, cy)), (x, y)
        assert outs[2][k] == evaluate(Binary("//", cx, const(-3, dtype))), x
        assert outs[3][k] == evaluate(Binary("%", cx, const(3, dtype))), x


def test_integer_division_by_zero_and_overflow_do_not_trap():
    with FunctionBuilder("div_edge") as fb:
        A, B, Q = (fb.param(name, "int32", [3]) for name in "ABQ")
        for i in fb.range(3):
            Q[i] = A[i] // B[i] + A[i] % B[i]
    a = np.array([5, np.iinfo(np.int32).min, 7], np.int32)
    b = np.array([0, -1, 2], np.int32)
    q = np.zeros(3, np.int32)
    _compile(fb.function).div_edge(a, b, q)
    np.testing.assert_array_equal(q, [0, np.iinfo(np.int32).min, 4])


def test_narrow_and_mixed_sign_integers_follow_the_ir_types():
    with FunctionBuilder("narrow") as fb:
        A = fb.param("A", "int8", [2])
        S = fb.param("S", "int8", [1])
        U = fb.param("U", "uint32", [1])
        I = fb.param("I", "int32", [1])
        C = fb.param("C", "bool", [1])
        S[0] = A[0] + A[1]
        C[0] = I[0] < cast(U[0], "int32")
    s, c = np.zeros(1, np.int8), np.zeros(1, np.bool_)
    _compile(fb.function).narrow(np.array([100, 100], np.int8), s,
                                 np.array([5], np.uint32), np.array([-1], np.int32), c)
    assert s[0] == np.int8(-56) and c[0]


# ---- math, vectors ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_math_functions_match_numpy(dtype):
    funcs = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "sin": np.sin,
             "abs": np.abs, "floor": np.floor, "ceil": np.ceil, "round": np.rint}
    with FunctionBuilder(f"math_{dtype}") as fb:
        n = fb.symbol("n")
        X = fb.param("X", dtype, [n])
        outs = {name: fb.param(name, dtype, [n]) for name in funcs}
        P = fb.param("P", dtype, [n])
        F = fb.param("F", dtype, [n])
        for i in fb.range(n):
            for name, out in outs.items():
                out[i] = call(name, X[i])
            P[i] = call("pow", X[i], 1.5)
            F[i] = call("fma", X[i], X[i], X[i])
    x = np.linspace(0.1, 3.7, 23).astype(dtype)
    results = {name: np.zeros_like(x) for name in [*funcs, "P", "F"]}
    _compile(fb.function)[f"math_{dtype}"](x, *results.values())
    rtol = {"float16": 2e-3, "float32": 1e-6, "float64": 1e-14}[dtype]
    for name, reference in funcs.items():
        np.testing.assert_allclose(results[name], reference(x), rtol=rtol, err_msg=name)
    np.testing.assert_allclose(results["P"], np.power(x, np.array(1.5, dtype)), rtol=rtol)
    np.testing.assert_allclose(results["F"], x * x + x, rtol=rtol)
    text = generate([fb.function])
    assert ("expf(" in text) == (dtype != "float64")


def test_vector_kernel_matches_numpy():
    lanes = 8
    with FunctionBuilder("vector_ops") as fb:
        n = fb.symbol("n")
        A, B, C = (fb.param(name, "float32", [n]) for name in "ABC")
        sums = fb.param("sums", "float32", [n // lanes, 3])
        for v in fb.range(n // lanes, kind="parallel", name="v"):
            a = A.vload(v * lanes, lanes)
            b = B.vload(v * lanes, lanes)
            acc = fb.let("acc", call("fma", a, b, C.vload(v * lanes, lanes)))
            C[v * lanes] = maximum(acc * broadcast(A[0], lanes) - 0.5, b)
            sums[v, 0] = call("reduce_add", a)
            sums[v, 1] = call("reduce_max", a)
            sums[v, 2] = call("reduce_min", minimum(a, b))
    a, b, c = (np.random.default_rng(s).standard_normal(64).astype(np.float32) for s in range(3))
    got_c, got_sums = c.copy(), np.zeros((8, 3), np.float32)
    kernel = _compile(fb.function).vector_ops
    kernel(a, b, got_c, got_sums)
    expected_c = np.maximum((a * b + c) * a[0] - np.float32(0.5), b)
    np.testing.assert_allclose(got_c, expected_c, rtol=1e-5, atol=1e-6)
    rows = a.reshape(8, 8)
    np.testing.assert_allclose(got_sums[:, 0], rows.sum(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got_sums[:, 1], rows.max(axis=1))
    np.testing.assert_array_equal(got_sums[:, 2], np.minimum(a, b).reshape(8, 8).min(axis=1))
    text = generate([fb.function])
    assert "_mm256_fmadd_ps(" in text and "*(const float32x8_u *)&A[v * 8]" in text
    assert "*(float32x8_u *)&C[v * 8] = " in text


def test_vector_register_buffer_and_vector_cast():
    with FunctionBuilder("registers") as fb:
        A = fb.param("A", "float32", [16])
        I = fb.param("I", "int32", [16])
        regs = fb.buffer("regs", dtypes.float32x8, [2])
        for r in fb.range(2, kind="unroll", name="r"):
            regs[r] = A.vload(r * 8, 8) + 1.0
        for r in fb.range(2, kind="unroll", name="r"):
            I[r * 8] = cast(regs[r], dtypes.int32x8)
    a = np.arange(16, dtype=np.float32) * 1.5
    out = np.zeros(16, np.int32)
    _compile(fb.function).registers(a, out)
    np.testing.assert_array_equal(out, (a + 1).astype(np.int32))
    assert "__builtin_convertvector(" in generate([fb.function])


# ---- asserts ----------------------------------------------------------------------------

def test_asserts_return_their_index_and_raise_kernel_error():
    with FunctionBuilder("guarded") as fb:
        n = fb.symbol("n")
        A = fb.param("A", "float32", [n])
        B = fb.param("B", "float32", [n])
        fb.assert_(n > 2, "n must exceed 2")
        for i in fb.range(n, kind="parallel"):
            fb.assert_(A[i] >= 0.0, "A must be non-negative")
            for j in fb.range(4, kind="vectorize", name="j"):
                fb.assert_(A[i] < 100.0, "A must stay below 100")
                B[i] = A[i] + 1.0
    kernel = _compile(fb.function).guarded
    a, b = np.ones(8, np.float32), np.zeros(8, np.float32)
    kernel(a, b)
    np.testing.assert_array_equal(b, np.full(8, 2, np.float32))
    with pytest.raises(KernelError, match="guarded: n must exceed 2"):
        kernel(np.ones(2, np.float32), np.zeros(2, np.float32))
    a[5] = -1
    with pytest.raises(KernelError, match="A must be non-negative"):
        kernel(a, b)
    a[5] = 1000
    with pytest.raises(KernelError, match="A must stay below 100"):
        kernel(a, b)


# ---- dtypes -----------------------------------------------------------------------------

def _bf16_bits(f32: np.ndarray) -> np.ndarray:
    bits = f32.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f32)
    rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def _sample(dtype: dtypes.DataType, n: int) -> np.ndarray:
    gen = np.random.default_rng(7)
    if dtype.is_bool:
        return gen.integers(0, 2, n).astype(bool)
    if dtype.kind == "uint":
        return gen.integers(0, 100, n).astype(dtype.numpy)
    if dtype.kind == "int":
        return gen.integers(-100, 100, n).astype(dtype.numpy)
    if dtype == dtypes.bfloat16:
        return _bf16_bits(gen.standard_normal(n).astype(np.float32))
    return (gen.standard_normal(n) * 10).astype(dtype.numpy)


def test_every_dtype_copies_and_casts_through_float32():
    functions = []
    for dtype in SCALAR_DTYPES:
        with FunctionBuilder(f"round_trip_{dtype}") as fb:
            n = fb.symbol("n")
            A, B = fb.param("A", dtype, [n]), fb.param("B", dtype, [n])
            F, G = fb.param("F", "float32", [n]), fb.param("G", dtype, [n])
            for i in fb.range(n):
                B[i] = A[i]
                F[i] = cast(A[i], "float32")
                G[i] = cast(F[i], dtype)
        functions.append(fb.function)
    module = _compile(*functions)
    for dtype, func in zip(SCALAR_DTYPES, functions):
        a = _sample(dtype, 37)
        b, g = np.zeros_like(a), np.zeros_like(a)
        f = np.zeros(37, np.float32)
        module[func.name](a, b, f, g)
        np.testing.assert_array_equal(b, a, err_msg=str(dtype))
        expected_f = ((a.astype(np.uint32) << 16).view(np.float32) if dtype == dtypes.bfloat16
                      else a.astype(np.float32))
        np.testing.assert_array_equal(f, expected_f, err_msg=str(dtype))
        expected_g = _bf16_bits(f) if dtype == dtypes.bfloat16 else f.astype(dtype.numpy)
        np.testing.assert_array_equal(g, expected_g, err_msg=str(dtype))


def test_bfloat16_rounds_to_nearest_even_and_keeps_specials():
    with FunctionBuilder("to_bf16") as fb:
        n = fb.symbol("n")
        F, H = fb.param("F", "float32", [n]), fb.param("H", "bfloat16", [n])
        for i in fb.range(n):
            H[i] = cast(F[i], "bfloat16")
    values = np.array([1.0, 1.00390625, 1.01171875, -3.3, np.inf, -np.inf, np.nan, 3.4e38,
                       1e-40, 0.0, -0.0], np.float32)
    h = np.zeros(len(values), np.uint16)
    _compile(fb.function).to_bf16(values, h)
    np.testing.assert_array_equal(h, _bf16_bits(values))


def _row_reduce(op: str, init: float):
    """y[i] = op over x[i, :], accumulated in a vectorize loop."""
    with FunctionBuilder(f"row_{op}") as fb:
        M, K = fb.symbol("M"), fb.symbol("K")
        x = fb.param("x", "float32", [M, K])
        y = fb.param("y", "float32", [M])
        for i in fb.range(M, kind="parallel"):
            acc = fb.scalar("acc", "float32", init)
            for k in fb.range(K, kind="vectorize", name="k"):
                fb.accumulate(acc, op, x[i, k])
            y[i] = acc[()]
    return fb.function


@pytest.mark.parametrize("op, init, reference", [
    ("sum", 0.0, lambda x: x.sum(axis=1)),
    ("max", -float("inf"), lambda x: x.max(axis=1)),
    ("min", float("inf"), lambda x: x.min(axis=1)),
])
def test_accumulate_in_vectorize_loop_is_an_omp_reduction(op, init, reference):
    func = _row_reduce(op, init)
    symbol = {"sum": "+", "max": "max", "min": "min"}[op]
    assert f"#pragma omp simd reduction({symbol}:acc)" in generate([func])
    kernel = getattr(_compile(func), func.name)
    for cols in (1, 7, 61, 2039):  # shorter than, between and past whole vectors
        x = np.random.default_rng(cols).standard_normal((5, cols)).astype(np.float32)
        y = np.empty(5, np.float32)
        kernel(x, y)
        # Max and min are exact in any order; a reassociated float32 sum of K terms is
        # within a few ulp of the float64 sum times sqrt(K).
        expected = reference(x.astype(np.float64))
        tol = 1e-6 * np.sqrt(cols) * np.abs(x).sum(axis=1) if op == "sum" else 0
        assert np.all(np.abs(y - expected) <= tol), (cols, y, expected)


def test_prefetch_fetches_a_load_address_and_is_a_no_op():
    """A prefetch prints as the builtin (a read, into L2) on the load's address (even past
    the buffer's end, which a prefetch may name), a prefetch of a computed value is
    dropped, and neither changes results, compiled or interpreted."""
    from treadle.runtime.interpret import interpret
    with FunctionBuilder("ahead") as fb:
        A = fb.param("A", "float32", [8])
        B = fb.param("B", "float32", [8])
        for i in fb.range(8):
            fb.evaluate(call("prefetch", A[i + 64]))
            fb.evaluate(call("prefetch", A[i] * 2.0))
            B[i] = A[i] + 1.0
    text = generate([fb.function])
    assert "__builtin_prefetch(&A[i + 64], 0, 2);" in text
    a = np.arange(8, dtype=np.float32)
    b = np.zeros(8, np.float32)
    _compile(fb.function)["ahead"](a, b)
    np.testing.assert_array_equal(b, a + 1)
    b2 = np.zeros(8, np.float32)
    interpret(fb.function, a, b2)
    np.testing.assert_array_equal(b2, a + 1)


@pytest.mark.parametrize("flags", [("avx2", "fma"), ("avx2", "fma", "avx512f", "avx512vl")])
def test_float_min_max_propagate_nan_on_avx2_and_avx512(monkeypatch, flags):
    """A NaN on either side of min and max wins, as in numpy: scalar and vector helpers,
    the reduce_max primitive, and max/min reductions vectorised with a NaN flag beside the
    accumulator (its lanes, its scalar tail, and an accumulator already NaN before the
    loop), for code built for AVX2 and for AVX-512."""
    if not set(flags) <= set(host().features):
        pytest.skip(f"the CPU lacks {set(flags) - set(host().features)}")
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: set(flags))
    cpu.host.cache_clear()
    try:
        lanes = 16 if "avx512f" in flags else 8
        with FunctionBuilder(f"nan_minmax_{lanes}") as fb:
            A, B = fb.param("A", "float32", [lanes]), fb.param("B", "float32", [lanes])
            S, V = fb.param("S", "float32", [4, lanes]), fb.param("V", "float32", [2, lanes])
            R = fb.param("R", "float32", [1])
            for i in fb.range(lanes, name="i"):
                S[0, i], S[1, i] = maximum(A[i], B[i]), maximum(B[i], A[i])
                S[2, i], S[3, i] = minimum(A[i], B[i]), minimum(B[i], A[i])
            a, b = A.vload(0, lanes), B.vload(0, lanes)
            V[0, 0], V[1, 0] = maximum(a, b), minimum(b, a)
            R[0] = call("reduce_max", a)
        a = np.resize(np.array([np.nan, 1, np.nan, -np.inf, np.inf, 2], np.float32), lanes)
        b = np.resize(np.array([1, np.nan, np.nan, np.nan, 3, -np.inf], np.float32), lanes)
        s, v = np.zeros((4, lanes), np.float32), np.zeros((2, lanes), np.float32)
        r = np.zeros(1, np.float32)
        _compile(fb.function)[fb.function.name](a, b, s, v, r)
        np.testing.assert_array_equal(s, [np.maximum(a, b), np.maximum(b, a),
                                          np.minimum(a, b), np.minimum(b, a)])
        np.testing.assert_array_equal(v, [np.maximum(a, b), np.minimum(b, a)])
        np.testing.assert_array_equal(r, [np.nan])
        for op, init, reference in (("max", -np.inf, np.max), ("min", np.inf, np.min)):
            func = _row_reduce(op, init)
            assert f"#pragma omp simd reduction({op}:acc) reduction(|:acc_nan)" in generate([func])
            kernel = getattr(_compile(func), func.name)
            for cols in (1, 7, 61, 2039):
                x = np.random.default_rng(cols).standard_normal((5, cols)).astype(np.float32)
                x[0, 0], x[1, cols // 2], x[2, -1], x[3] = np.nan, np.nan, np.nan, np.nan
                x[4, 0], x[4, -1] = np.inf, -np.inf
                y = np.empty(5, np.float32)
                kernel(x, y)
                np.testing.assert_array_equal(y, reference(x, axis=1), err_msg=f"{op} {cols}")
        nan_init = _row_reduce("max", np.nan)
        y = np.empty(2, np.float32)
        getattr(_compile(nan_init), nan_init.name)(np.ones((2, 61), np.float32), y)
        np.testing.assert_array_equal(y, [np.nan, np.nan])
    finally:
        monkeypatch.undo()
        cpu.host.cache_clear()


# ---- integer word products ------------------------------------------------------------

def _lane_product(acc: int, a: int, b: int, bits: int) -> int:
    """One lane of a word product from Python integers: a's parts unsigned bytes (8) or
    signed halves (16), b's signed, the sum wrapped to int32."""
    count = 32 // bits
    unpack = {8: ("<4B", "<4b"), 16: ("<2h", "<2h")}[bits]
    mine = struct.unpack(unpack[0], struct.pack("<i", a))
    theirs = struct.unpack(unpack[1], struct.pack("<i", b))
    total = acc + sum(x * y for x, y in zip(mine[:count], theirs[:count]))
    return (total + 2 ** 31) % 2 ** 32 - 2 ** 31


@pytest.mark.parametrize("name, bits", [("dot_u8s8", 8), ("dot_s16", 16)])
@pytest.mark.parametrize("lanes", [8, 16])
def test_word_products_match_python_integers(name, bits, lanes):
    """The intrinsics (vpdpbusd, vpmaddwd + add) and the interpreter's numpy meaning, at
    the types' limits, against the products of Python integers."""
    target = host()
    if name == "dot_u8s8" and not target.int8_dot(lanes) or \
            lanes * 4 > target.widest_simd_bytes or \
            (name == "dot_s16" and lanes == 16 and "avx512bw" not in target.features):
        pytest.skip(f"this CPU has no {name} on {lanes} lanes")
    with FunctionBuilder(f"{name}{lanes}") as fb:
        a, b, acc = (fb.param(n, "int32", [lanes]) for n in ("a", "b", "acc"))
        acc[0] = call(name, acc.vload(0, lanes), a.vload(0, lanes), b.vload(0, lanes))
    gen = np.random.default_rng(lanes)
    words = [gen.integers(-2 ** 31, 2 ** 31, lanes).astype(np.int32) for _ in range(2)]
    words[0][:3] = [-1, -2 ** 31, 0x7F80017F]
    words[1][:3] = [-1, 0x7F7F7F7F, -2 ** 31]
    total = gen.integers(-2 ** 31, 2 ** 31, lanes).astype(np.int32)
    expected = [_lane_product(int(c), int(x), int(y), bits) for c, x, y in zip(total, *words)]
    np.testing.assert_array_equal(PRIMITIVES[name].numpy(total, *words), expected)
    getattr(_compile(fb.function), f"{name}{lanes}")(*words, total)
    np.testing.assert_array_equal(total, expected)
