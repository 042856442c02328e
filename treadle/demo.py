"""`make demo`: compile built-in models and time them next to ONNX Runtime.

The models come from treadle's zoo (random weights, exported to ONNX with torch). Each
system runs the same inputs; the median of REPEATS timed runs is reported, with an idle gap
between systems (treadle.timing).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import treadle
from treadle.config import config
from treadle.timing import interleaved_medians, load_note, onnxruntime_session

REPEATS = 30
DEFAULT_MODELS = ("mobilenet_v2", "bert")


def demo(name: str, folder: Path, repeats: int) -> None:
    from treadle.models import export_onnx
    spec = export_onnx(name, folder / f"{name}.onnx")
    inputs = spec.random_inputs()
    start = time.perf_counter()
    model = treadle.compile(spec.path)
    compile_s = time.perf_counter() - start
    ours = model(**inputs)[0]
    session = onnxruntime_session(spec.path, config.num_threads)
    reference = session.run(None, inputs)[0]
    error = float(np.abs(ours - reference).max() / max(np.abs(reference).max(), 1e-30))
    seconds = interleaved_medians({"treadle": lambda: model(**inputs),
                                   "onnxruntime": lambda: session.run(None, inputs)}, repeats)
    treadle_ms, ort_ms = seconds["treadle"] * 1e3, seconds["onnxruntime"] * 1e3
    print(f"{name:<14} compile {compile_s:6.1f} s   treadle {treadle_ms:8.2f} ms   "
          f"onnxruntime {ort_ms:8.2f} ms   speed vs onnxruntime {ort_ms / treadle_ms:5.2f}x   "
          f"relative error {error:.1e}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--repeat", type=int, default=REPEATS)
    args = parser.parse_args(argv)
    print(f"{config.num_threads} threads, batch 1, float32; {load_note(config.num_threads)}")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models:
            demo(name, Path(folder), args.repeat)


if __name__ == "__main__":
    main()
