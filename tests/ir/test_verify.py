"""The verifier rejects malformed programs with an IRError that quotes the statement."""
import pytest

from treadle.errors import IRError
from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import float32, float32x8
from treadle.ir.expr import Buffer, Var
from treadle.ir.mapping import repeat, spatial
from treadle.ir.stmt import Barrier, For, Function, Let, Seq, Store
from treadle.ir.verify import verify


def simple(body_fn):
    with FunctionBuilder("f") as fb:
        a = fb.param("a", float32, [8])
        body_fn(fb, a)
    return fb.function


def test_well_formed_program_passes():
    def body(fb, a):
        for i in fb.range(8, kind="parallel"):
            a[i] = a[i] * 2.0
    verify(simple(body))


def test_undefined_variable_is_named():
    ghost = Var("ghost")
    a = Buffer("a", float32, (8,))
    func = Function("f", (a,), Store(a, (ghost,), 1.0))
    with pytest.raises(IRError, match="ghost"):
        verify(func)


def test_undeclared_buffer_is_named():
    a = Buffer("a", float32, (8,))
    hidden = Buffer("hidden", float32, (8,), "local")
    func = Function("f", (a,), Store(a, (0,), hidden[0]))
    with pytest.raises(IRError, match="hidden"):
        verify(func)


def test_rank_mismatch():
    def body(fb, a):
        a[0, 1] = 1.0
    with pytest.raises(IRError, match="rank 1"):
        verify(simple(body))


def test_float_index_rejected():
    def body(fb, a):
        x = fb.let("x", a[0])
        fb.emit(Store(a, (x,), 1.0))
    with pytest.raises(IRError, match="index"):
        verify(simple(body))


def test_redefinition_in_scope_rejected():
    a = Buffer("a", float32, (8,))
    i = Var("i")
    func = Function("f", (a,), For(i, 8, Seq((Let(i, i + 0),))))
    with pytest.raises(IRError, match="defined twice"):
        verify(func)


def test_mapping_worker_count_must_match_loop():
    def body(fb, a):
        for w in fb.range(4):
            for (i,) in spatial(8).on(w):
                a[i] = 0.0
    with pytest.raises(IRError, match="8 workers"):
        verify(simple(body))


def test_vector_store_into_vector_buffer_type_checked():
    def body(fb, a):
        regs = fb.buffer("regs", float32x8, [2])
        regs[0] = a.vload((0,), 8)
    verify(simple(body))


def test_barrier_outside_parallel_loop_rejected():
    a = Buffer("a", float32, (8,))
    func = Function("f", (a,), For(Var("i"), 8, Barrier()))
    with pytest.raises(IRError, match="barrier outside"):
        verify(func)


def test_lowered_program_has_no_task_loops():
    def body(fb, a):
        for (i,) in repeat(8).on(0):
            a[i] = 0.0
    func = simple(body)
    verify(func)
    with pytest.raises(IRError, match="task mapping loop left"):
        verify(func, lowered=True)
