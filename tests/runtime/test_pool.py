"""The thread pool behind parallel loops: every iteration exactly once on any thread
count, workers pinned (or not) as configured, and a forked child with a pool of its own."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from treadle.config import override
from treadle.ir.builder import FunctionBuilder
from treadle.ir.expr import cast
from treadle.ir.stmt import Module
from treadle.runtime import pool
from treadle.runtime.build import compile_module


def _bump():
    """B[i] = B[i] + 1 + i over a parallel loop: an iteration run twice or never shows."""
    with FunctionBuilder("bump") as fb:
        n = fb.symbol("n")
        B = fb.param("B", "float64", [n])
        for i in fb.range(n, kind="parallel"):
            B[i] = B[i] + 1.0 + cast(i, "float64")
    return fb.function


def _bump_kernel(threads: int):
    with override(num_threads=threads):
        return compile_module(Module(f"bump_{threads}", (_bump(),))).bump


def _check_bump(kernel, n: int) -> None:
    b = np.zeros(n)
    for _ in range(3):
        kernel(b)
    np.testing.assert_array_equal(b, 3 * (1 + np.arange(n, dtype=np.float64)))


@pytest.mark.parametrize("threads", [1, 2, 3, 4, 8])
def test_every_iteration_runs_exactly_once(threads):
    kernel = _bump_kernel(threads)
    for n in (0, 1, 2, 3, 5, 17, 97, 1000, 100003):
        _check_bump(kernel, n)


def test_kernels_of_different_thread_counts_interleave():
    one, two, three = (_bump_kernel(t) for t in (1, 2, 3))
    for n in (7, 61, 4099):
        for kernel in (three, one, two, three):
            _check_bump(kernel, n)


def _started_worker(kernel) -> int:
    """The Linux thread id of worker 1, once it has started (a loop starts it)."""
    for _ in range(200):
        _check_bump(kernel, 1000)
        (worker,) = pool.worker_ids(1)
        if worker:
            return worker
        time.sleep(0.01)
    raise AssertionError("worker 1 never started")


TWO_CORES = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")


@TWO_CORES
def test_workers_pinned_to_cores_of_their_own_and_the_caller_left_alone():
    cores = sorted(os.sched_getaffinity(0))
    with override(pin_workers=True):
        worker = _started_worker(_bump_kernel(2))
    assert os.sched_getaffinity(worker) == {cores[1]}
    assert sorted(os.sched_getaffinity(0)) == cores
    with override(pin_workers=False):
        _bump_kernel(2)  # loading applies the setting to running workers
    assert sorted(os.sched_getaffinity(worker)) == cores


def test_forked_child_runs_parallel_loops_on_workers_of_its_own():
    kernel = _bump_kernel(2)
    parents_worker = _started_worker(kernel)
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through its exit status
        signal.alarm(30)  # a hang fails the test instead of blocking it
        try:
            _check_bump(kernel, 100003)
            os._exit(0 if _started_worker(kernel) != parents_worker else 2)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
