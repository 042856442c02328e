"""check_bounds: each access to a buffer parameter is checked before the statement making
it, a load only some evaluations reach only where it is reached, local buffers not at all;
checked programs fail with a KernelError naming the buffer, the index and the size, in the
interpreter and in C, and compute what numpy does when every access is inside."""
import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle.config import override
from treadle.errors import KernelError
from treadle.ir.builder import FunctionBuilder, seq
from treadle.ir.dtypes import float32
from treadle.ir.expr import Load, select
from treadle.ir.functor import rewrite, walk
from treadle.ir.passes.check_bounds import check_bounds
from treadle.ir.stmt import Assert, Seq, Store
from treadle.runtime.interpret import interpret
from treadle.runtime.build import compile_function


def shifted(offset: int, guarded: bool = False):
    """y[i, j] = x[i, j + offset] over x and y of n x 3, through a local copy; where
    ``guarded``, columns past x read 0 instead."""
    with FunctionBuilder("shifted") as fb:
        n = fb.symbol("n")
        x, y = fb.param("x", float32, [n, 3]), fb.param("y", float32, [n, 3])
        for i in fb.range(n):
            row = fb.buffer("row", float32, [3])
            for j in fb.range(3, name="j"):
                column = j + offset if offset else j
                row[j] = select(column < 3, x[i, column], 0.0) if guarded else x[i, column]
            for j in fb.range(3, name="j"):
                y[i, j] = row[j]
    return fb.function


def asserts(func) -> list[Assert]:
    return [s for s in walk(func.body) if isinstance(s, Assert)]


def test_each_axis_of_each_parameter_access_is_checked_right_before_it():
    checked = check_bounds(shifted(0))
    assert [s.message for s in asserts(checked)] == [
        f"{access}: index {{value}} on axis {axis} is outside its size {size}"
        for access in ("load from x[i, j]", "store to y[i, j_1]")
        for axis, size in ((0, "n"), (1, 3))]  # the local row is not checked
    for seq in (s for s in walk(checked.body) if isinstance(s, Seq)):
        for k, stmt in enumerate(seq.stmts):
            touches = any(isinstance(e, Load) and e.buffer.scope == "global"
                          for e in walk(stmt.value)) if isinstance(stmt, Store) else False
            if isinstance(stmt, Store) and (touches or stmt.buffer.scope == "global"):
                assert [type(s) for s in seq.stmts[k - 2:k]] == [Assert, Assert]


def test_without_its_asserts_a_checked_program_is_the_program():
    plain = shifted(1, guarded=True)
    assert not asserts(plain)
    assert rewrite(check_bounds(plain).body, _drop_asserts) == plain.body


def _drop_asserts(node):
    if isinstance(node, Seq):
        return seq([s for s in node.stmts if not isinstance(s, Assert)])
    return None


@pytest.mark.parametrize("run", ["interpret", "compiled"])
def test_a_read_past_the_buffer_fails_naming_it(run):
    func = check_bounds(shifted(1))
    x, y = random_array((5, 3)), np.zeros((5, 3), np.float32)
    with pytest.raises(KernelError, match=r"load from x\[i, j \+ 1\]: index 3 on axis 1 is "
                                          r"outside its size 3"):
        interpret(func, x, y) if run == "interpret" else compile_function(func)(x, y)


@pytest.mark.parametrize("run", ["interpret", "compiled"])
@pytest.mark.parametrize("n", [0, 1, 7, 13])
def test_a_guarded_read_is_checked_only_where_it_is_reached(run, n):
    func = check_bounds(shifted(1, guarded=True))
    x, y = random_array((n, 3), seed=n), np.full((n, 3), np.nan, np.float32)
    interpret(func, x, y) if run == "interpret" else compile_function(func)(x, y)
    expected = np.concatenate([x[:, 1:], np.zeros((n, 1), np.float32)], axis=1)
    assert_close(y, expected)


def test_a_builder_kernel_is_checked_where_the_knob_says():
    def overrun():
        with FunctionBuilder("overrun") as fb:
            n = fb.symbol("n")
            out = fb.param("out", float32, [n])
            for i in fb.range(n + 1000):
                out[i] = 1.0
        return fb.function
    memory = np.zeros(1004, np.float32)
    with override(check_bounds=True):
        kernel = compile_function(overrun())
    with pytest.raises(KernelError, match=r"store to out\[i\]: index 4 on axis 0 is outside "
                                          "its size n"):
        kernel(memory[:4])
    np.testing.assert_array_equal(memory, np.r_[np.ones(4), np.zeros(1000)])
    assert not asserts(compile_function(overrun()).function)
