"""Measuring candidates in a child process: real timings for good kernels, and a kernel
that crashes or hangs is marked failed while the others are still measured."""
import gc
import logging
import sys
import warnings

import numpy as np
import pytest

from treadle.ir.builder import FunctionBuilder
from treadle.ir.compute import reduce
from treadle.ir.dtypes import float32
from treadle.ir.expr import Buffer, Var
from treadle.schedule.templates.gemm import GemmConfig, match_gemm, schedule_gemm
from treadle.target.cpu import host
from treadle.tune.measure import measure_functions


def gemm(cfg):
    m = Var("M")
    a, b = Buffer("a", float32, (m, 32)), Buffer("b", float32, (32, 24))
    c = reduce("c", [m, 24], [32], lambda i, j, r: a[i, r] * b[r, j])
    return schedule_gemm("gemm", [a, b], match_gemm(c), cfg).function


def broken(kind):
    """A kernel that writes far outside its buffer, or loops for centuries."""
    with FunctionBuilder(kind) as fb:
        out = fb.param("out", float32, [4])
        if kind == "crash":
            for i in fb.range(1 << 20, name="i"):
                out[i * (1 << 24)] = 1.0
        else:
            for i in fb.range(1 << 62, name="i"):
                out[i % 4] = out[i % 4] + 1.0
    return fb.function


def test_times_good_candidates():
    times = measure_functions([gemm(GemmConfig(12, 16, 32, 6, 16)), gemm(GemmConfig())],
                              target=host(), symbol_size=20, repeats=3)
    assert all(isinstance(t, float) and 0 < t < 1 for t in times)


def test_crashing_and_hanging_candidates_are_skipped(caplog):
    good = gemm(GemmConfig())
    settled = []
    with caplog.at_level(logging.WARNING):
        times = measure_functions([broken("crash"), good, broken("hang"), good],
                                  target=host(), repeats=3, timeout=3, progress=settled.append,
                                  labels=["(crash)", "(good)", "(hang)", "(good)"])
    assert times[0] is None and times[2] is None
    assert isinstance(times[1], float) and isinstance(times[3], float)
    assert sum(settled) == 4
    assert "candidate 0 (crash) crashed the measuring process" in caplog.text
    assert "candidate 2 (hang) ran past 3 s" in caplog.text


@pytest.mark.parametrize("kind", ["good", "crash", "hang", "no-child"])
def test_the_measuring_child_leaves_no_open_pipe(monkeypatch, kind):
    """Every way a child ends (it reports times, crashes, runs past the timeout, never
    starts) closes the pipe its report came through."""
    if kind == "no-child":
        monkeypatch.setattr(sys, "executable", "/bin/false")
    function = gemm(GemmConfig()) if kind in ("good", "no-child") else broken(kind)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        times = measure_functions([function], target=host(), repeats=3,
                                  **({"timeout": 3} if kind == "hang" else {}))
        gc.collect()
    assert (times[0] is not None) == (kind == "good")
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaks, leaks


def test_a_child_that_cannot_start_fails_every_candidate(monkeypatch, caplog):
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with caplog.at_level(logging.WARNING):
        assert measure_functions([gemm(GemmConfig())], target=host(), repeats=3) == [None]
    assert "failed to start" in caplog.text


def test_calls_cycle_through_copies_spanning_the_cold_size():
    """Arguments are copied until they span twice the last-level cache (here 1 MiB for a
    16 KiB workload: capped at MAX_COPIES), and each call takes the copy whose turn it is,
    counted over every candidate's calls, so no candidate reads copies another has just
    brought into cache."""
    from treadle.tune import measure

    class Recorder:
        def __init__(self):
            self.calls = []

        def call_unchecked(self, arguments):
            self.calls.append(tuple(arguments))

    function = gemm(GemmConfig())
    copies: list = []
    args = measure._cold_arguments(function, {Var("M"): 64}, copies, 1 << 20)
    assert len(copies) == len(args) == measure.MAX_COPIES
    assert len({tuple(a) for a in args}) == measure.MAX_COPIES
    for key, array in copies[0].items():  # the same values at other addresses
        assert all(np.array_equal(c[key], array) and c[key] is not array for c in copies[1:])
    first, second = Recorder(), Recorder()
    for turn in range(measure.MAX_COPIES + 1):
        measure._seconds(first if turn % 2 else second, args, turn)
    assert second.calls[0] == second.calls[-1] == tuple(args[0])
    assert first.calls[0] == tuple(args[1])
    assert len(set(first.calls) | set(second.calls)) == measure.MAX_COPIES
    assert len(measure._cold_arguments(function, {Var("M"): 64}, [], 100)) == 1


def test_measuring_for_cuda_without_a_device_says_what_to_do_instead():
    """Without a CUDA device, the CUDA timer refuses before building anything, naming the
    architecture and the tuning levels that measure nothing."""
    from treadle.errors import DeviceUnavailableError
    from treadle.runtime import cuda
    from treadle.target.cuda import cuda_target
    if cuda.available():
        pytest.skip("this machine has a CUDA device to measure on")
    with pytest.raises(DeviceUnavailableError, match="sm_80") as caught:
        measure_functions([gemm(GemmConfig())], target=cuda_target("sm_80"))
    message = str(caught.value)
    assert "tune=0" in message and "construct" in message
