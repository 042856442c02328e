"""Timing helpers shared by the demo and the benchmark scripts.

Medians over repeated runs, an idle gap after each system (ONNX Runtime's and BLAS's
worker threads keep spinning for tens of milliseconds after a run and would slow whatever
runs next), and a note when the machine is busy, since another process on one of two
cores slows 2-thread code several times over.
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Callable

IDLE_S = 0.1


def median_seconds(fn: Callable[[], object], repeat: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    time.sleep(IDLE_S)
    return statistics.median(times)


def onnxruntime_session(model, threads: int):
    """An ONNX Runtime CPU session over a path or serialized model with ``threads``."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    source = str(model) if isinstance(model, os.PathLike) else model
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def load_note(cores: int) -> str:
    load = os.getloadavg()[0]
    busy = load > 0.5 * cores
    return f"load average {load:.1f} on {cores} cores" + (
        " (busy: other processes inflate the latencies)" if busy else "")
