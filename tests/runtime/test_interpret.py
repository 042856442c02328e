"""The numpy interpreter of the tensor-program IR, checked against numpy references."""
import numpy as np
import pytest

from treadle.errors import ArgumentError, DTypeError, IRError, KernelError, ShapeError
from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import float32, float32x8, int32, int64
from treadle.ir.expr import broadcast, call, ceil_div, eq, logical_and, select
from treadle.ir.mapping import repeat, spatial
from treadle.runtime.arguments import bind_arguments
from treadle.runtime.interpret import interpret

RNG = np.random.default_rng(0)


def _rand(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def copy_kernel():
    with FunctionBuilder("copy") as fb:
        n = fb.symbol("n")
        a = fb.param("a", float32, [n])
        b = fb.param("b", float32, [n])
        for i in fb.range(n, kind="parallel"):
            b[i] = a[i]
    return fb.function


def matmul_kernel():
    """C = A @ B in 6x6 tiles; 4 workers each own 3x3 elements of a tile."""
    with FunctionBuilder("matmul") as fb:
        m, n, k = fb.symbol("M"), fb.symbol("N"), fb.symbol("K")
        a = fb.param("A", float32, [m, k])
        b = fb.param("B", float32, [k, n])
        c = fb.param("C", float32, [m, n])
        for ti in fb.range(ceil_div(m, 6), name="ti"):
            for tj in fb.range(ceil_div(n, 6), name="tj"):
                for w in fb.range(4, kind="parallel", name="w"):
                    for i, j in (spatial(2, 2) * repeat(3, 3)).on(w):
                        row, col = fb.let("row", ti * 6 + i), fb.let("col", tj * 6 + j)
                        with fb.if_(logical_and(row < m, col < n)):
                            acc = fb.scalar("acc", float32, 0.0)
                            for kk in fb.range(k, name="k"):
                                acc[()] = acc[()] + a[row, kk] * b[kk, col]
                            c[row, col] = acc[()]
    return fb.function


def test_copy_binds_symbol_from_shape():
    a, b = _rand(9), np.zeros(9, np.float32)
    interpret(copy_kernel(), a, b)
    np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (7, 7, 7), (13, 13, 13), (7, 13, 1), (13, 1, 7)])
def test_matmul_with_task_mappings_and_partial_tiles(m, n, k):
    a, b, c = _rand(m, k), _rand(k, n), np.full((m, n), np.nan, np.float32)
    interpret(matmul_kernel(), a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def cooperative_load_kernel():
    """Hidet, Figure 8: 128 workers load a 64x8 tile of A into shared memory with
    repeat(4, 1) * spatial(16, 8), then each reads elements other workers loaded."""
    with FunctionBuilder("cooperative_load") as fb:
        a = fb.param("A", float32, [128, 8])
        at = fb.param("At", float32, [8, 128])
        for block in fb.range(2, name="block"):
            tile = fb.buffer("tile", float32, [64, 8], scope="shared")
            for w in fb.range(128, kind="parallel", name="w"):
                for i, k in (repeat(4, 1) * spatial(16, 8)).on(w):
                    tile[i, k] = a[block * 64 + i, k]
                fb.barrier()
                for k, i in (spatial(8, 16) * repeat(1, 4)).on(w):
                    at[k, block * 64 + i] = tile[i, k]
    return fb.function


def test_cooperative_load_through_shared_memory():
    a, at = _rand(128, 8), np.zeros((8, 128), np.float32)
    interpret(cooperative_load_kernel(), a, at)
    np.testing.assert_array_equal(at, a.T)


def test_vector_loads_stores_broadcast_and_primitives():
    with FunctionBuilder("vector") as fb:
        n = fb.symbol("n")
        x = fb.param("x", float32, [n, 16])
        y = fb.param("y", float32, [n, 16])
        out = fb.param("out", float32, [n, 16])
        sums = fb.param("sums", float32, [n])
        for i in fb.range(n):
            acc = fb.buffer("acc", float32x8, [1])
            assert acc[0].dtype == float32x8  # an element of a register array is a vector
            acc[0] = broadcast(0.0, 8)
            for half in fb.range(2, kind="unroll", name="h"):
                xv = fb.let("xv", x.vload((i, half * 8), 8))
                out[i, half * 8] = call("fma", xv, broadcast(2.0, 8), y.vload((i, half * 8), 8))
                acc[0] = acc[0] + xv
            sums[i] = call("reduce_add", acc[0])
    x, y = _rand(3, 16), _rand(3, 16)
    out, sums = np.zeros((3, 16), np.float32), np.zeros(3, np.float32)
    interpret(fb.function, x, y, out, sums)
    np.testing.assert_allclose(out, 2 * x + y, rtol=1e-6)
    np.testing.assert_allclose(sums, x.sum(axis=1), rtol=1e-5, atol=1e-6)


def test_float32_arithmetic_stays_float32():
    with FunctionBuilder("rounding") as fb:
        x = fb.param("x", float32, [1])
        y = fb.param("y", float32, [1])
        y[0] = (x[0] + 1e-8) - x[0]
    y = np.full(1, np.nan, np.float32)
    interpret(fb.function, np.ones(1, np.float32), y)
    assert y[0] == 0  # float64 arithmetic would keep 1e-8


def test_integer_division_and_remainder_follow_c():
    with FunctionBuilder("divmod") as fb:
        n = fb.symbol("n")
        a, b = fb.param("a", int32, [n]), fb.param("b", int32, [n])
        q, r = fb.param("q", int32, [n]), fb.param("r", int32, [n])
        for i in fb.range(n):
            q[i] = a[i] // b[i]
            r[i] = a[i] % b[i]
    grid = np.array([(x, y) for x in range(-7, 8) for y in (-3, -2, -1, 1, 2, 3)], np.int32)
    a, b = np.ascontiguousarray(grid[:, 0]), np.ascontiguousarray(grid[:, 1])
    q, r = np.zeros_like(a), np.zeros_like(a)
    interpret(fb.function, a, b, q, r)
    np.testing.assert_array_equal(q, np.trunc(a / b).astype(np.int32))
    np.testing.assert_array_equal(r, np.fmod(a, b))
    with pytest.raises(KernelError, match="division by zero"):
        interpret(fb.function, a[:1], np.zeros(1, np.int32), q[:1], r[:1])


def test_and_and_select_evaluate_lazily_like_c():
    with FunctionBuilder("guarded") as fb:
        n = fb.symbol("n")
        a = fb.param("a", float32, [n])
        b = fb.param("b", float32, [n + 1])
        for i in fb.range(n + 1):
            b[i] = select(i < n, a[select(i < n, i, 0)], 0.0)
            with fb.if_(logical_and(i < n, a[i] > 0.0)):
                b[i] = a[i] * 2.0
    a, b = _rand(5), np.zeros(6, np.float32)
    interpret(fb.function, a, b)
    np.testing.assert_array_equal(b, np.append(np.where(a > 0, 2 * a, a), 0))


# ---- argument checking -----------------------------------------------------------------

def _matmul_args(m=3, n=5, k=7):
    return _rand(m, k), _rand(k, n), np.zeros((m, n), np.float32)


@pytest.mark.parametrize("case, error, name", [
    ("dtype", DTypeError, "A"),
    ("rank", ShapeError, "B"),
    ("transposed", ShapeError, "B"),
    ("disagree", ShapeError, "B"),
    ("strided", ArgumentError, "A"),
    ("readonly", ArgumentError, "C"),
    ("not_array", ArgumentError, "A"),
])
def test_bad_arguments_name_the_argument(case, error, name):
    a, b, c = _matmul_args()
    if case == "dtype":
        a = a.astype(np.float64)
    elif case == "rank":
        b = b.reshape(-1)
    elif case == "transposed":
        b = np.ascontiguousarray(b.T)
    elif case == "disagree":
        b = _rand(4, 5)  # K is 7 from A
    elif case == "strided":
        a = _rand(3, 14)[:, ::2]
    elif case == "readonly":
        c.flags.writeable = False
    elif case == "not_array":
        a = a.tolist()
    with pytest.raises(error, match=f"argument '{name}' \\(param "):
        interpret(matmul_kernel(), a, b, c)


def test_shape_message_shows_expression_and_values():
    a, b, c = _matmul_args()
    with pytest.raises(ShapeError) as info:
        interpret(matmul_kernel(), a, _rand(4, 5), c)
    assert ("argument 'B' (param 2 of matmul): expected shape [K, N] = [7, 5], got (4, 5)"
            in str(info.value))
    assert "K = 7 from argument 'A' dim 1" in str(info.value)


def test_read_only_input_is_accepted():
    a, b, c = _matmul_args()
    a.flags.writeable = False
    interpret(matmul_kernel(), a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_argument_count_and_unknown_symbol():
    a, b, c = _matmul_args()
    with pytest.raises(ArgumentError, match="takes 3 arrays"):
        interpret(matmul_kernel(), a, b)
    with pytest.raises(ArgumentError, match="no symbol parameter 'Q'"):
        interpret(matmul_kernel(), a, b, c, Q=1)


def test_symbol_inside_compound_dimension_must_be_passed():
    with FunctionBuilder("halves") as fb:
        n = fb.symbol("n")
        a = fb.param("a", int64, [2 * n])
        for i in fb.range(n):
            a[2 * i + 1] = a[2 * i]
    func = fb.function
    a = np.arange(6, dtype=np.int64)
    with pytest.raises(ArgumentError, match="symbol.*n"):
        interpret(func, a)
    with pytest.raises(ShapeError, match=r"argument 'a'.*\[2 \* n\] = \[8\]"):
        interpret(func, a, n=4)
    assert bind_arguments(func, [a], {"n": 3}) == {n: 3}
    interpret(func, a, n=3)
    np.testing.assert_array_equal(a, [0, 0, 2, 2, 4, 4])


# ---- run-time errors -------------------------------------------------------------------

def test_out_of_bounds_store_names_the_buffer():
    with FunctionBuilder("shift") as fb:
        n = fb.symbol("n")
        a, b = fb.param("a", float32, [n]), fb.param("b", float32, [n])
        for i in fb.range(n):
            b[i + 1] = a[i]
    with pytest.raises(ShapeError, match=r"buffer b: index \[4\] is out of bounds"):
        interpret(fb.function, _rand(4), np.zeros(4, np.float32))


def test_negative_index_does_not_wrap_around():
    with FunctionBuilder("back") as fb:
        a, b = fb.param("a", float32, [4]), fb.param("b", float32, [4])
        for i in fb.range(4):
            b[i] = a[i - 1]
    with pytest.raises(ShapeError, match=r"buffer a: index \[-1\]"):
        interpret(fb.function, _rand(4), np.zeros(4, np.float32))


def test_vector_access_past_the_end():
    with FunctionBuilder("tail") as fb:
        a = fb.param("a", float32, [2, 12])
        a[1, 8] = broadcast(1.0, 8)
    with pytest.raises(ShapeError, match=r"buffer a: 8-lane access at index \[1, 8\]"):
        interpret(fb.function, np.zeros((2, 12), np.float32))


def test_assert_raises_kernel_error():
    with FunctionBuilder("checked") as fb:
        n = fb.symbol("n")
        fb.param("a", float32, [n])
        fb.assert_(eq(n % 8, 0), "n must be a multiple of 8")
    interpret(fb.function, np.zeros(16, np.float32))
    with pytest.raises(KernelError, match="multiple of 8"):
        interpret(fb.function, np.zeros(12, np.float32))


# ---- barriers ----------------------------------------------------------------------------

def test_barrier_makes_every_write_of_a_phase_visible_to_the_next():
    with FunctionBuilder("phases") as fb:
        data = fb.param("data", int64, [4])
        seen = fb.param("seen", int64, [3, 4])
        for w in fb.range(4, kind="parallel", name="w"):
            for phase in range(3):
                data[w] = data[w] + 1
                fb.barrier()
                seen[phase, w] = data[0] + data[1] + data[2] + data[3]
                fb.barrier()
    data, seen = np.zeros(4, np.int64), np.zeros((3, 4), np.int64)
    interpret(fb.function, data, seen)
    np.testing.assert_array_equal(seen, [[4] * 4, [8] * 4, [12] * 4])


def test_barrier_inside_serial_loop_and_registers_persist_across_it():
    """GPU meaning: a worker's registers live across barriers, and a barrier may sit in a
    serial loop every worker runs."""
    with FunctionBuilder("rotate") as fb:
        out = fb.param("out", int64, [4])
        ring = fb.buffer("ring", int64, [4], scope="shared")
        for w in fb.range(4, kind="parallel", name="w"):
            mine = fb.let("mine", w * 10)
            ring[w] = mine
            for step in fb.range(3, name="step"):
                fb.barrier()
                value = fb.let("value", ring[(w + 1) % 4])
                fb.barrier()
                ring[w] = value
            fb.barrier()
            out[w] = ring[w] + mine
    out = np.zeros(4, np.int64)
    interpret(fb.function, out)
    np.testing.assert_array_equal(out, [(w + 3) % 4 * 10 + w * 10 for w in range(4)])


def test_barrier_outside_a_parallel_loop_is_an_error():
    with FunctionBuilder("misplaced") as fb:
        out = fb.param("out", int64, [4])
        for w in fb.range(4, name="w"):
            out[w] = w
            fb.barrier()
    with pytest.raises(IRError, match="barrier"):
        interpret(fb.function, np.zeros(4, np.int64))


def test_workers_disagreeing_on_a_barrier_raise_instead_of_hanging():
    with FunctionBuilder("diverge") as fb:
        out = fb.param("out", int64, [4])
        for w in fb.range(4, kind="parallel", name="w"):
            with fb.if_(w < 2):
                fb.barrier()
            out[w] = w
    with pytest.raises(KernelError, match="same barriers"):
        interpret(fb.function, np.zeros(4, np.int64))
