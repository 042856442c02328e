"""The lowering pipelines: a CPU and a CUDA program each come out verified, free of task
mappings, and computing what numpy computes when interpreted. CUDA code is only lowered
and interpreted here, never compiled or run; no C compiler is needed."""
import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle.config import override
from treadle.errors import IRError
from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import float32
from treadle.ir.expr import Buffer, Var, logical_and
from treadle.ir.functor import walk
from treadle.ir.lower import PIPELINES, lower, lower_kernels
from treadle.ir.mapping import repeat, spatial
from treadle.ir.stmt import Barrier, For, ForTask, Function, Store
from treadle.ir.verify import verify
from treadle.runtime.interpret import interpret
from treadle.target.cpu import host
from treadle.target.cuda import cuda_target

TARGETS = {"cpu": host, "cuda": cuda_target}


def _nodes(func: Function, kind: type) -> list:
    return [n for n in walk(func.body) if isinstance(n, kind)]


def neighbours_cpu() -> Function:
    """y[r, c] = 2·x[r, c] + 2·x[r, (c + 1) % 5]: each of 5 workers writes one column of a
    shared row, and after a barrier reads its neighbour's."""
    with FunctionBuilder("neighbours") as fb:
        n = fb.symbol("n")
        x = fb.param("x", float32, [n, 5])
        y = fb.param("y", float32, [n, 5])
        for r in fb.range(n, name="r"):
            row = fb.buffer("row", float32, [5], scope="shared")
            for w in fb.range(5, kind="parallel", name="w"):
                for (c,) in spatial(5).on(w):
                    row[c] = x[r, c] * 2.0
                fb.barrier()
                for (c,) in spatial(5).on(w):
                    y[r, c] = row[c] + row[(c + 1) % 5]
    return fb.function


def tiles_cuda() -> Function:
    """y = x·3 + 1 over [n, 7] in tiles of 4 rows: a block per tile, 4 threads each doing
    one row, a row's columns repeated in a task mapping; rows past n are guarded."""
    with FunctionBuilder("tiles") as fb:
        n = fb.symbol("n")
        x = fb.param("x", float32, [n, 7])
        y = fb.param("y", float32, [n, 7])
        for b in fb.range((n + 3) // 4, kind="blocks", name="b"):
            for t in fb.range(4, kind="threads", name="t"):
                for i, j in (spatial(4, 1) * repeat(1, 7)).on(t):
                    row = fb.let("row", b * 4 + i)
                    with fb.if_(row < n):
                        y[row, j] = x[row, j] * 3.0 + 1.0
    return fb.function


@pytest.mark.parametrize("rows", [0, 1, 7, 13])
def test_cpu_pipeline_splits_barriers_and_computes_the_same(rows):
    func = lower(neighbours_cpu(), host())
    verify(func, lowered=True)
    assert not _nodes(func, ForTask) and not _nodes(func, Barrier)
    x = random_array((rows, 5), seed=rows)
    y = np.full((rows, 5), np.nan, np.float32)
    interpret(func, x, y)
    assert_close(y, 2 * x + 2 * np.roll(x, -1, axis=1))


@pytest.mark.parametrize("rows", [1, 4, 7, 13])
def test_cuda_pipeline_keeps_workers_and_computes_the_same(rows):
    func = lower(tiles_cuda(), cuda_target())
    verify(func, lowered=True)
    assert not _nodes(func, ForTask)
    assert [loop.kind for loop in _nodes(func, For) if loop.kind in ("blocks", "threads")] \
        == ["blocks", "threads"]
    x = random_array((rows, 7), seed=rows)
    y = np.full((rows, 7), np.nan, np.float32)
    interpret(func, x, y)  # blocks and threads run one after another
    assert_close(y, x * 3 + 1)


def test_a_cuda_barrier_stays_in_its_threads_loop():
    """A target with hardware barriers keeps them; the CPU splits the loop around them."""
    with FunctionBuilder("reverse") as fb:
        x = fb.param("x", float32, [32])
        for _ in fb.range(1, kind="blocks", name="b"):
            tile = fb.buffer("tile", float32, [32], scope="shared")
            for t in fb.range(32, kind="threads", name="t"):
                tile[t] = x[t]
                fb.barrier()
                x[t] = tile[31 - t]
    func = lower(fb.function, cuda_target())
    verify(func, lowered=True)
    (barrier,) = _nodes(func, Barrier)
    (threads,) = [s for s in _nodes(func, For) if s.kind == "threads"]
    assert any(n is barrier for n in walk(threads.body))


def test_cpu_lower_kernels_is_one_kernel_and_cuda_one_launch_per_parallel_step():
    """z = (x + 1)·2 in two parallel steps: CUDA launches each as a grid of its own, since
    a grid has no barrier across blocks."""
    with FunctionBuilder("two_steps") as fb:
        n = fb.symbol("n")
        x = fb.param("x", float32, [n])
        z = fb.param("z", float32, [n])
        for i in fb.range(n, kind="parallel"):
            z[i] = x[i] + 1.0
        for i in fb.range(n, kind="parallel"):
            z[i] = z[i] * 2.0
    (cpu,) = lower_kernels(fb.function, host())
    assert cpu == lower(fb.function, host())
    launches = lower_kernels(fb.function, cuda_target())
    assert len(launches) == 2
    x = random_array((61,), seed=3)
    for kernels in ([cpu], launches):
        z = np.full(61, np.nan, np.float32)
        for kernel in kernels:
            verify(kernel, lowered=True)
            interpret(kernel, x, z)
        assert_close(z, (x + 1) * 2)


def test_a_malformed_program_is_refused_before_any_pass():
    a = Buffer("a", float32, (8,))
    ghost = Var("ghost")
    func = Function("bad", (a,), Store(a, (ghost,), 1.0))
    for target in TARGETS.values():
        with pytest.raises(IRError, match="variable 'ghost' is used before it is defined"):
            lower(func, target())


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_each_step_is_dumped_in_pipeline_order(kind, tmp_path):
    func = tiles_cuda() if kind == "cuda" else neighbours_cpu()
    with override(dump_dir=tmp_path):
        lower(func, TARGETS[kind]())
    names = sorted(p.name for p in (tmp_path / func.name / "ir").iterdir())
    assert names == ["00_input.txt"] + [f"{k:02d}_{p.__name__}.txt"
                                         for k, p in enumerate(PIPELINES[kind], start=1)]
    assert ".on(" in (tmp_path / func.name / "ir" / "00_input.txt").read_text()
    assert ".on(" not in (tmp_path / func.name / "ir" / names[-1]).read_text()


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
@pytest.mark.parametrize("rows, cols", [(1, 1), (11, 2), (15, 2), (13, 1)])
def test_task_mapped_workers_guarded_by_symbolic_sizes(kind, rows, cols):
    """3 workers over a [15, 2] task domain, each repeating 5 rows, writing only inside
    the [n, m] tensor: the kernels of either target verify and compute x + 1."""
    with FunctionBuilder("guarded") as fb:
        n, m = fb.symbol("n"), fb.symbol("m")
        x = fb.param("x", float32, [n, m])
        for w in fb.range(3, kind="parallel", name="w"):
            for i, j in (spatial(3, 1) * repeat(5, 2)).on(w):
                with fb.if_(logical_and(i < n, j < m)):
                    x[i, j] = x[i, j] + 1.0
    data = random_array((rows, cols), seed=rows)
    out = data.copy()
    for kernel in lower_kernels(fb.function, TARGETS[kind]()):
        verify(kernel, lowered=True)
        assert not _nodes(kernel, ForTask)
        interpret(kernel, out)
    assert_close(out, data + 1)
