"""Checks the zoo models end to end against ONNX Runtime: errors, latency, compile time.

    python bench/check_models.py             # full size: ResNet-50, Inception-V3, MobileNetV2,
                                             # BERT-base and GPT-2 small (seq 128), Candy,
                                             # Segformer-B0, an EfficientViT block and the
                                             # six classifiers of treadle/models/vision.py
    python bench/check_models.py --reduced --models bert gpt2 --repeat 5
    python bench/check_models.py --models bert gpt2 --attention sdpa --no-symbolic

(with treadle installed, as in make's .venv, or from the repository root with PYTHONPATH=.)

Each model (batch 1, float32) is exported to ONNX once and cached in bench/out/ (exports are
redone when treadle/models changes), compiled with ``treadle.compile`` into a fresh kernel
cache (so the compile time is a cold one; ``--warm-cache`` uses the user's cache), run on
random inputs and compared with ONNX Runtime on the same number of threads. An output
passes when its max abs error is at most 1e-3 of its max abs value. When BERT is checked,
a BERT whose sequence axis is symbolic is also compiled once and run at several lengths.

Latencies are medians. ONNX Runtime's worker threads (and OpenMP's) spin for ~40 ms after
each run, so the script sleeps between systems rather than alternating them call by call.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import treadle
from common import RELATIVE_TOLERANCE, enter_treadle_settings, exported, relative_error
from treadle.models import MODELS
from treadle.timing import interleaved_medians, load_note, onnxruntime_session

SEQUENCE_LENGTHS = {False: (1, 7, 64, 128), True: (1, 7, 16, 64)}  # by --reduced


@dataclass
class Row:
    label: str
    output: str
    abs_error: float
    rel_error: float
    treadle_ms: float
    ort_ms: float
    compile_s: float

    @property
    def ok(self) -> bool:
        return self.rel_error <= RELATIVE_TOLERANCE


def compare(label: str, compiled, session, inputs: dict, repeat: int,
            compile_s: float) -> list[Row]:
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))
    actual = dict(zip(compiled.output_names, compiled(**inputs)))
    seconds = interleaved_medians({"treadle": lambda: compiled(**inputs),
                                   "onnxruntime": lambda: session.run(None, inputs)}, repeat)
    ours, theirs = seconds["treadle"] * 1e3, seconds["onnxruntime"] * 1e3
    rows = []
    for name, want in expected.items():
        got = actual.get(name)
        if got is None or got.shape != want.shape:
            raise AssertionError(f"output {name!r}: treadle gives "
                                 f"{None if got is None else got.shape}, ORT {want.shape}")
        error = float(np.abs(got.astype(np.float64) - want).max())
        rows.append(Row(label, name, error, relative_error(got, want), ours, theirs, compile_s))
    return rows


def compile_timed(path: Path):
    start = time.perf_counter()
    compiled = treadle.compile(path)
    return compiled, time.perf_counter() - start


def check_model(name: str, args) -> list[Row]:
    sdpa = args.attention if MODELS[name].family == "transformer" else None
    spec = exported(name, args.reduced, attention=sdpa)
    compiled, seconds = compile_timed(spec.path)
    session = onnxruntime_session(spec.path, args.threads)
    return compare(name, compiled, session, spec.random_inputs(), args.repeat, seconds)


def check_symbolic_bert(args) -> list[Row]:
    spec = exported("bert", args.reduced, dynamic_seq=True)
    compiled, seconds = compile_timed(spec.path)
    session = onnxruntime_session(spec.path, args.threads)
    rows = []
    for seq in SEQUENCE_LENGTHS[args.reduced]:
        rows += compare(f"bert seq={seq} (symbolic)", compiled, session,
                        spec.random_inputs(seed=seq, seq=seq), args.repeat, seconds)
        seconds = 0.0  # compiled once: the time belongs to the first length only
    return rows


def print_table(rows: list[Row]) -> None:
    header = (f"{'model':<28} {'output':<18} {'max abs err':>11} {'rel err':>9} "
              f"{'treadle ms':>10} {'ORT ms':>8} {'ORT/treadle':>11} {'compile s':>9}")
    print(header)
    print("-" * len(header))
    for r in rows:
        compile_s = f"{r.compile_s:.1f}" if r.compile_s else ""
        print(f"{r.label:<28} {r.output:<18} {r.abs_error:>11.2e} {r.rel_error:>9.2e} "
              f"{r.treadle_ms:>10.2f} {r.ort_ms:>8.2f} {r.ort_ms / r.treadle_ms:>10.2f}x "
              f"{compile_s:>9}{'' if r.ok else '  FAIL: rel err > 1e-3'}")


def run_checks(args) -> tuple[list[Row], list[str]]:
    rows, failures = [], []
    checks = [(name, lambda n=name: check_model(n, args)) for name in args.models]
    if "bert" in args.models and not args.no_symbolic:
        checks.append(("bert (symbolic seq)", lambda: check_symbolic_bert(args)))
    for label, check in checks:
        print(f"checking {label} ...", file=sys.stderr, flush=True)
        try:
            result = check()
        except Exception as error:  # report every model, then fail at the end
            failures.append(f"{label}: {type(error).__name__}: {error}")
            continue
        rows += result
        failures += [f"{r.label} {r.output}: relative error {r.rel_error:.2e}"
                     for r in result if not r.ok]
    return rows, failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--reduced", action="store_true", help="the CI-sized models")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per system")
    parser.add_argument("--threads", type=int, default=2,
                        help="threads of treadle's kernels and of ONNX Runtime")
    parser.add_argument("--warm-cache", action="store_true",
                        help="compile into the user's kernel cache instead of a fresh one")
    parser.add_argument("--no-symbolic", action="store_true",
                        help="skip the BERT with a symbolic sequence axis")
    parser.add_argument("--attention", choices=("sdpa",),
                        help="BERT and GPT-2 calling scaled_dot_product_attention, exported "
                             "by torch's dynamo exporter at opset 23 (one Attention node "
                             "per layer)")
    args = parser.parse_args(argv)

    print(load_note(len(os.sched_getaffinity(0))), file=sys.stderr)
    with contextlib.ExitStack() as stack:
        enter_treadle_settings(stack, args.threads, args.warm_cache)
        rows, failures = run_checks(args)
    print_table(rows)
    for failure in failures:
        print(f"FAILED {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
