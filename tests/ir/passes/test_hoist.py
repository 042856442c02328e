"""hoist: divisions by run-time sizes, and floors and conversions of outer indices, bound
before the loops they do not vary in, with the program's results unchanged."""
import numpy as np

from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import float32, index_type
from treadle.ir.expr import Binary, Call, Cast, Const, call, cast
from treadle.ir.functor import walk
from treadle.ir.lower import PIPELINES, lower
from treadle.ir.passes.hoist import hoist
from treadle.ir.stmt import For, Let
from treadle.runtime.build import compile_function
from treadle.target.cpu import host


def _rows_program():
    """Y[r, j] = X[r // n, r % n, j] * 2 over rows r of [b, n]: the row's quotient and
    remainder are invariant in the j loop."""
    with FunctionBuilder("rows") as fb:
        b, n = fb.symbol("b"), fb.symbol("n")
        x = fb.param("X", float32, [b, n, 8])
        y = fb.param("Y", float32, [b * n, 8])
        for r in fb.range(b * n, name="r"):
            for j in fb.range(8, name="j"):
                y[r, j] = x[r // n, r % n, j] * 2.0
    return fb.function


def _divisions_in_loop(loop: For) -> list:
    return [e for e in walk(loop.body) if isinstance(e, Binary) and e.op in ("//", "%")
            and not isinstance(e.b, Const)]


def test_invariant_divisions_leave_the_inner_loop():
    hoisted = hoist(_rows_program())
    loops = {s.var.name: s for s in walk(hoisted.body) if isinstance(s, For)}
    assert _divisions_in_loop(loops["j"]) == []
    lets = [s for s in walk(loops["r"].body) if isinstance(s, Let)]
    assert sorted(s.value.op for s in lets) == ["%", "//"]
    # Nothing is left to hoist out of the row loop: its divisions vary with r.
    assert len(_divisions_in_loop(loops["r"])) == 2


def test_hoisted_program_computes_the_same():
    function = compile_function(_rows_program())
    assert hoist in PIPELINES["cpu"]
    x = np.random.default_rng(0).standard_normal((3, 5, 8)).astype(np.float32)
    y = np.zeros((15, 8), np.float32)
    function(x, y)
    np.testing.assert_array_equal(y, (x * 2).reshape(15, 8))
    lowered = lower(_rows_program(), host())
    assert all(_divisions_in_loop(s) == [] for s in walk(lowered.body)
               if isinstance(s, For) and s.var.name.startswith("j"))


def _upsample_program():
    """Y[p, j] = X[floor(p / 2 + 0.25), j] over output pixels p: the source pixel, a floor
    and a conversion to an index of p alone, is invariant in the channel loop j."""
    with FunctionBuilder("upsample") as fb:
        x = fb.param("X", float32, [7, 5])
        y = fb.param("Y", float32, [13, 5])
        for p in fb.range(13, name="p"):
            for j in fb.range(5, name="j"):
                source = call("floor", cast(p, float32) * 0.5 + 0.25)
                y[p, j] = x[cast(source, index_type), j] + source
    return fb.function


def test_invariant_floors_and_conversions_leave_the_inner_loop():
    hoisted = hoist(_upsample_program())
    loops = {s.var.name: s for s in walk(hoisted.body) if isinstance(s, For)}
    inner = list(walk(loops["j"].body))
    assert not any(isinstance(e, Call) for e in inner)
    assert not any(isinstance(e, Cast) and e.dtype == index_type for e in inner)
    function = compile_function(_upsample_program())
    x = np.random.default_rng(1).standard_normal((7, 5)).astype(np.float32)
    y = np.zeros((13, 5), np.float32)
    function(x, y)
    source = np.floor(np.arange(13, dtype=np.float32) * 0.5 + 0.25)
    np.testing.assert_array_equal(y, x[source.astype(int)] + source[:, None])


def test_a_division_by_a_scalar_the_loop_writes_stays_in_it():
    """Y[p] = ceil(n / w) for w = 1, 2, 4 ..., a mutable scalar doubled each pass: bound
    before the loop, the quotient would keep its first value."""
    with FunctionBuilder("passes") as fb:
        n = fb.symbol("n")
        y = fb.param("Y", index_type, [5])
        width = fb.scalar("width", index_type, 1)
        for p in fb.range(5, name="p"):
            y[p] = (n + width[()] - 1) // width[()]
            fb.store(width, (), width[()] * 2)
    loops = [s for s in walk(hoist(fb.function).body) if isinstance(s, For)]
    assert len(_divisions_in_loop(loops[0])) == 1
    y = np.zeros(5, np.int64)
    compile_function(fb.function)(y, n=37)
    np.testing.assert_array_equal(y, [-(-37 // 2 ** p) for p in range(5)])
