"""`make demo`: compile built-in models and time them next to ONNX Runtime.

The models come from treadle's zoo (random weights, exported to ONNX with torch). Each
system runs the same inputs; the median of REPEATS timed runs is reported, with an idle gap
between systems because ONNX Runtime's worker threads keep spinning after each run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import treadle
from treadle.config import config

REPEATS = 30
IDLE_S = 0.2
DEFAULT_MODELS = ("mobilenet_v2", "bert")


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    time.sleep(IDLE_S)
    return statistics.median(times) * 1e3


def onnxruntime_session(path: Path):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = config.num_threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def demo(name: str, folder: Path, repeats: int) -> None:
    from treadle.models import export_onnx
    spec = export_onnx(name, folder / f"{name}.onnx")
    inputs = spec.random_inputs()
    start = time.perf_counter()
    model = treadle.compile(spec.path)
    compile_s = time.perf_counter() - start
    ours = model(**inputs)[0]
    session = onnxruntime_session(spec.path)
    reference = session.run(None, inputs)[0]
    error = float(np.abs(ours - reference).max() / max(np.abs(reference).max(), 1e-30))
    treadle_ms = median_ms(lambda: model(**inputs), repeats)
    ort_ms = median_ms(lambda: session.run(None, inputs), repeats)
    print(f"{name:<14} compile {compile_s:6.1f} s   treadle {treadle_ms:8.2f} ms   "
          f"onnxruntime {ort_ms:8.2f} ms   speed vs onnxruntime {ort_ms / treadle_ms:5.2f}x   "
          f"relative error {error:.1e}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--repeat", type=int, default=REPEATS)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    print(f"{config.num_threads} threads, batch 1, float32; load average {load:.1f}"
          + ("  (the machine is busy: timings are unreliable)" if load > 1.0 else ""))
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models:
            demo(name, Path(folder), args.repeat)


if __name__ == "__main__":
    main()
