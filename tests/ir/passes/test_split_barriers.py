"""split_barriers: worker loops split at barriers, loops hoisted, locals expanded."""
import pytest

from tests.ir.ir_compare import assert_ir_equal
from treadle.errors import IRError
from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import float32
from treadle.ir.expr import Buffer, Var
from treadle.ir.passes.split_barriers import split_barriers
from treadle.ir.stmt import DeclBuffer, For, Seq, Store


def test_worker_loop_splits_at_barrier():
    with FunctionBuilder("f") as fb:
        a = fb.param("a", float32, [4])
        s = fb.buffer("s", float32, [4], scope="shared")
        for w in fb.range(4, kind="parallel", name="w"):
            s[w] = a[w]
            fb.barrier()
            a[w] = s[3 - w]
    w = Var("w")
    a, s = fb.function.params[0], Buffer("s", float32, (4,), "shared")
    expected = Seq((DeclBuffer(s), Seq((For(w, 4, Store(s, (w,), a[w]), "parallel"),
                                        For(w, 4, Store(a, (w,), s[3 - w]), "parallel")))))
    assert_ir_equal(split_barriers(fb.function).body, expected)


def test_serial_loop_with_barrier_is_hoisted_and_locals_expanded():
    with FunctionBuilder("f") as fb:
        a = fb.param("a", float32, [4])
        s = fb.buffer("s", float32, [4], scope="shared")
        for w in fb.range(4, kind="parallel", name="w"):
            acc = fb.scalar("acc", float32, 0.0)
            half = fb.let("half", w // 2)
            for k in fb.range(3, name="k"):
                s[w] = a[w] + 1.0
                fb.barrier()
                acc[()] = acc[()] + s[half]
                fb.barrier()
            a[w] = acc[()]
    out = split_barriers(fb.function)
    text = str(out)
    # One worker loop before the k loop, two inside it (one per phase), one after.
    assert text.count("range(4) parallel") == 4
    assert "for k in range(3):" in text
    assert "shared acc: float32[4]" in text and "acc[w]" in text
    # The pure let is recomputed in the phase that reads it.
    assert text.count("let half") >= 2


def test_local_declared_inside_phase_cannot_cross_barrier():
    with FunctionBuilder("f") as fb:
        a = fb.param("a", float32, [4])
        for w in fb.range(4, kind="parallel", name="w"):
            for k in fb.range(2, name="k"):
                tmp = fb.let("tmp", a[w])
                fb.barrier()
                a[w] = tmp
    with pytest.raises(IRError, match="tmp"):
        split_barriers(fb.function)


def test_worker_dependent_loop_around_barrier_rejected():
    with FunctionBuilder("f") as fb:
        a = fb.param("a", float32, [4])
        for w in fb.range(4, kind="parallel", name="w"):
            for k in fb.range(w, name="k"):
                fb.barrier()
                a[w] = 0.0
    with pytest.raises(IRError, match="depends on worker w"):
        split_barriers(fb.function)


def test_program_without_barriers_is_unchanged():
    with FunctionBuilder("f") as fb:
        a = fb.param("a", float32, [4])
        for w in fb.range(4, kind="parallel", name="w"):
            a[w] = 0.0
    assert split_barriers(fb.function) == fb.function
