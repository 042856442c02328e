"""Timing helpers shared by the demo and the benchmark scripts.

Medians over repeated runs interleaved across the systems compared, an idle gap after
each system's turn (ONNX Runtime's and BLAS's worker threads keep spinning for tens of
milliseconds after a run and would slow whatever runs next), and a note when the machine
is busy, since another process on one of two cores slows 2-thread code several times over.
"""
from __future__ import annotations

import math
import os
import statistics
import time
from typing import Callable

IDLE_S = 0.1


ROUND = 5  # timed calls per system and round
WARMUP = 2  # untimed calls per system before the first round


def interleaved_medians(runs: dict[str, Callable[[], object]], repeat: int,
                        idle: float = IDLE_S) -> dict[str, float]:
    """The median seconds of each callable over at least ``repeat`` timed calls, taken in
    rounds that visit every callable in turn, so that a busy spell on the machine slows
    every system alike rather than whichever was being timed; ``idle`` seconds pass
    after each system's turn."""
    per_round = min(ROUND, repeat)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for fn in runs.values():
        for _ in range(WARMUP):
            fn()
        time.sleep(idle)
    for _ in range(math.ceil(repeat / per_round)):
        for name, fn in runs.items():
            fn()  # the first call after the gap wakes the worker threads
            for _ in range(per_round):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
            time.sleep(idle)
    return {name: statistics.median(t) for name, t in times.items()}


def onnxruntime_session(model, threads: int, **options: object):
    """An ONNX Runtime CPU session over a path or serialized model with ``threads``;
    ``options`` sets further ``SessionOptions`` attributes (``enable_profiling=True``)."""
    import onnxruntime as ort
    session_options = ort.SessionOptions()
    session_options.intra_op_num_threads = threads
    for name, value in options.items():
        setattr(session_options, name, value)
    source = str(model) if isinstance(model, os.PathLike) else model
    return ort.InferenceSession(source, session_options, providers=["CPUExecutionProvider"])


def load_note(cores: int) -> str:
    load = os.getloadavg()[0]
    busy = load > 0.5 * cores
    return f"load average {load:.1f} on {cores} cores" + (
        " (busy: other processes inflate the latencies)" if busy else "")
