"""unswitch: a loop storing a select on a condition that does not vary in it becomes an if
between two loops; a condition of the loop's own index, or one reading memory, stays a
select. The result computes what numpy does, in the interpreter and in C."""
import numpy as np
import pytest

from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import float32
from treadle.ir.expr import Select, select
from treadle.ir.functor import walk
from treadle.ir.passes.unswitch import unswitch
from treadle.ir.stmt import If
from treadle.runtime.build import compile_function
from treadle.runtime.interpret import interpret


def picked(on_row: bool, reads_memory: bool = False):
    """y[i, j] = a[i, j] where i < 2 (or j < 2), else b[i, j] where i < 4, else 0; with
    ``reads_memory`` the first condition is a[i, 0] > 0."""
    with FunctionBuilder("picked") as fb:
        n = fb.symbol("n")
        a, b = fb.param("a", float32, [n, 5]), fb.param("b", float32, [n, 5])
        y = fb.param("y", float32, [n, 5])
        for i in fb.range(n):
            for j in fb.range(5, name="j"):
                index = i if on_row else j
                first = a[i, 0] > 0.0 if reads_memory else index < 2
                y[i, j] = select(first, a[i, j], select(index < 4, b[i, j], 0.0))
    return fb.function


def reference(a, b):
    """``picked(on_row=True)``'s result."""
    i = np.indices(a.shape)[0]
    return np.where(i < 2, a, np.where(i < 4, b, 0)).astype(np.float32)


@pytest.mark.parametrize("n", [0, 1, 7])
def test_a_condition_outside_the_loop_becomes_an_if(n):
    func = unswitch(picked(on_row=True))
    assert sum(isinstance(s, If) for s in walk(func.body)) == 2
    assert not any(isinstance(e, Select) for e in walk(func.body))
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((2, n, 5)).astype(np.float32)
    for run in (lambda *args: interpret(func, *args, n=n),
                lambda *args: compile_function(func)(*args, n=n)):
        y = np.full((n, 5), np.nan, np.float32)
        run(a, b, y)
        np.testing.assert_array_equal(y, reference(a, b))


@pytest.mark.parametrize("on_row,reads_memory", [(False, False), (True, True)])
def test_a_condition_of_the_loop_or_of_memory_stays_a_select(on_row, reads_memory):
    func = picked(on_row, reads_memory)
    assert unswitch(func) == func
