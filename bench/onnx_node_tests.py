"""Runs every node test case shipped with the onnx package against treadle.

    python -m bench.onnx_node_tests [--jobs 2] [--timeout 120] [-k REGEX] [--json FILE]

Cases run in worker processes, so a crash or a hang costs one case, not the run; a case
still running after the timeout is killed and counted as failed. Each case ends as
  passed       every output has the expected shape, dtype and values (the case's rtol
               and atol, by default 1e-3 and 1e-7 as in ONNX's own runner, which allows
               bfloat16 outputs an rtol of 2**-6); expected are ONNX Runtime's outputs
               for the few cases in AS_ONNXRUNTIME, and a few cases take the atol in
               ATOL, each listed with the report;
  failed       wrong numbers, a crash, a timeout, or any error other than the one below:
               the cases are valid models, so a ShapeError or DTypeError while compiling
               one means treadle's shape or dtype rules disagree with ONNX's;
  unsupported  treadle refused the model while compiling it with an UnsupportedOpError
               naming what it lacks (an operator, an opset, an attribute value, a dtype,
               an input that must be known when compiling); a model that is compiled
               for the contents of some inputs compiles at its first run.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import sys
import threading
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from bench.suites import FAILED, PASSED, UNSUPPORTED, finish, first_line

DEFAULT_RTOL, DEFAULT_ATOL = 1e-3, 1e-7
BFLOAT16_RTOL = 2 ** -6

# Cases where ONNX Runtime and PyTorch compute otherwise than ONNX's reference and treadle
# follows them, as the models users bring come from PyTorch and run on ONNX Runtime today:
# their outputs are compared with ONNX Runtime's on the same inputs instead.
AS_ONNXRUNTIME = {
    "test_resize_downsample_scales_linear_align_corners":
        "align_corners with scales divides by the rounded output length",
    "test_resize_downsample_scales_cubic_align_corners":
        "align_corners with scales divides by the rounded output length",
}

# Cases whose expected values that are exactly 0 carry the reference's float32 rounding
# beyond the case's atol of 1e-7: compared with this atol instead.
ATOL = {f"test_dft_inverse{suffix}": (1e-6, "the reference's inverse FFT leaves 1.9e-7 "
                                            "where the exact value is 0 (treadle: 3e-15)")
        for suffix in ("", "_opset19")}


@dataclass(frozen=True)
class Case:
    name: str
    model: bytes  # a serialised ModelProto
    data_sets: list  # [(inputs, expected outputs)], arrays or TensorProtos
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL


@dataclass(frozen=True)
class Outcome:
    name: str
    status: str
    detail: str = ""


def node_cases(pattern: str | None = None) -> list[Case]:
    """The node test cases of the installed onnx package, optionally filtered by name."""
    from onnx.backend.test.loader import load_model_tests
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators' own numpy overflow warnings
        tests = load_model_tests(kind="node")
    selected = [t for t in tests if pattern is None or re.search(pattern, t.name)]
    return [_case(t) for t in sorted(selected, key=lambda t: t.name)]


def _case(test) -> Case:
    if test.model is not None:  # generated in memory (onnx >= 1.17)
        return Case(test.name, test.model.SerializeToString(), test.data_sets, test.rtol,
                    test.atol)
    from pathlib import Path
    folder = Path(test.model_dir)
    data_sets = [([p.read_bytes() for p in sorted(d.glob("input_*.pb"))],
                  [p.read_bytes() for p in sorted(d.glob("output_*.pb"))])
                 for d in sorted(folder.glob("test_data_set_*"))]
    return Case(test.name, (folder / "model.onnx").read_bytes(), data_sets, test.rtol, test.atol)


# ---- one case --------------------------------------------------------------------------------

def run_case(case: Case) -> Outcome:
    import onnx

    from treadle.errors import UnsupportedOpError
    from treadle.integrations.onnx_backend import TreadleBackend
    try:
        rep = TreadleBackend.prepare(onnx.load_from_string(case.model))
    except UnsupportedOpError as err:
        return Outcome(case.name, UNSUPPORTED, first_line(err))
    except Exception as err:  # noqa: BLE001  (any other exception is a treadle bug)
        return Outcome(case.name, FAILED, f"{type(err).__name__}: {first_line(err)}")
    for k, (inputs, expected) in enumerate(case.data_sets):
        try:
            if case.name in AS_ONNXRUNTIME:
                expected = _onnxruntime(case.model, [_array(v) for v in inputs])
            outputs = rep.run([_array(v) for v in inputs])
            atol = ATOL.get(case.name, (case.atol,))[0]
            problem = compare(list(outputs), [_array(v) for v in expected], case.rtol, atol)
        except UnsupportedOpError as err:
            return Outcome(case.name, UNSUPPORTED, first_line(err))
        except Exception as err:  # noqa: BLE001
            problem = f"{type(err).__name__}: {first_line(err)}"
        if problem:
            return Outcome(case.name, FAILED, f"data set {k}: {problem}")
    return Outcome(case.name, PASSED, AS_ONNXRUNTIME.get(case.name, ATOL.get(case.name,
                                                                           (0, ""))[1]))


def _onnxruntime(model: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
    import onnxruntime
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, inputs)))


def _array(value) -> np.ndarray:
    from onnx import TensorProto, numpy_helper
    if isinstance(value, bytes):
        value = TensorProto.FromString(value)
    if isinstance(value, TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, (list, type(None))):
        raise TypeError(f"a {type(value).__name__} value (sequence or optional) is not a tensor")
    return np.asarray(value)


def compare(outputs: Sequence[np.ndarray], expected: Sequence[np.ndarray], rtol: float,
            atol: float) -> str:
    """What differs between outputs and expected ones ('' if nothing), as ONNX's runner
    compares them: count, then per output dtype, shape and values within tolerance."""
    if len(outputs) != len(expected):
        return f"{len(outputs)} outputs, expected {len(expected)}"
    for k, (actual, wanted) in enumerate(zip(outputs, expected)):
        actual = np.asarray(actual)
        if actual.dtype != wanted.dtype:
            return f"output {k}: dtype {actual.dtype}, expected {wanted.dtype}"
        if actual.shape != wanted.shape:
            return f"output {k}: shape {actual.shape}, expected {wanted.shape}"
        numeric = wanted.dtype.kind in "biufc" or wanted.dtype.name == "bfloat16"
        a, b = (actual.astype(np.float64), wanted.astype(np.float64)) if numeric \
            else (actual, wanted)
        # As ONNX's runner: bfloat16 outputs may differ by two units in the last place.
        output_rtol = max(rtol, BFLOAT16_RTOL) if wanted.dtype.name == "bfloat16" else rtol
        try:
            if numeric:
                np.testing.assert_allclose(a, b, rtol=output_rtol, atol=atol)
            else:
                np.testing.assert_array_equal(a, b)
        except AssertionError as err:
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            return f"output {k}: " + "; ".join(lines[1:4])
    return ""



# ---- worker processes ----------------------------------------------------------------------

def _serve(conn) -> None:
    while True:
        case = conn.recv()
        if case is None:
            return
        conn.send(run_case(case))


class _Worker:
    """A process running cases one at a time; replaced when one crashes or hangs."""

    def __init__(self):
        context = multiprocessing.get_context("spawn")  # OpenMP runtimes are not fork-safe
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child,), daemon=True)
        self.process.start()
        child.close()

    def run(self, case: Case, timeout: float) -> tuple[Outcome, bool]:
        """The outcome, and whether this worker is still usable."""
        try:
            self.conn.send(case)
            if self.conn.poll(timeout):
                return self.conn.recv(), True
            detail = f"timed out after {timeout:g} s"
        except (EOFError, OSError):
            self.process.join(5)
            detail = f"the worker process died (exit code {self.process.exitcode})"
        self.stop()
        return Outcome(case.name, FAILED, detail), False

    def stop(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.process.join(2)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def run_all(cases: Sequence[Case], jobs: int = 2, timeout: float = 120.0,
            progress: bool = False) -> list[Outcome]:
    pending = list(reversed(cases))
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def drive() -> None:
        worker = _Worker()
        while True:
            with lock:
                if not pending:
                    break
                case = pending.pop()
            outcome, usable = worker.run(case, timeout)
            if not usable:
                worker = _Worker()
            with lock:
                outcomes.append(outcome)
                if progress:
                    print(f"\r{len(outcomes)}/{len(cases)}", end="", file=sys.stderr, flush=True)
        worker.stop()

    threads = [threading.Thread(target=drive) for _ in range(max(1, min(jobs, len(cases))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if progress:
        print(file=sys.stderr)
    return sorted(outcomes, key=lambda o: o.name)


# ---- report ----------------------------------------------------------------------------------

def reason(detail: str) -> str:
    """A message with its node and tensor names blanked, to group cases by cause."""
    return re.sub(r"'[^']*'", "'…'", re.sub(r"\(nodes? [^)]*\)", "", detail))[:160]


def report(outcomes: Sequence[Outcome], seconds: float, verbose: bool) -> str:
    import onnx
    counts = Counter(o.status for o in outcomes)
    lines = [f"ONNX node tests (onnx {onnx.__version__}): {len(outcomes)} cases in "
             f"{seconds:.0f} s",
             *(f"  {status:<12} {counts[status]}" for status in (PASSED, FAILED, UNSUPPORTED))]
    followed = [o for o in outcomes if o.status == PASSED and o.detail]
    if followed:
        lines.append("passed as ONNX Runtime computes them, not as ONNX's reference:")
        lines += [f"  {o.name}: {o.detail}" for o in followed]
    failed = [o for o in outcomes if o.status == FAILED]
    if failed:
        lines.append("failed:")
        lines += [f"  {o.name}: {o.detail}" for o in failed]
    reasons = Counter(reason(o.detail) for o in outcomes if o.status == UNSUPPORTED)
    if reasons:
        lines.append("unsupported, by reason:")
        lines += [f"  {n:5d}  {text}" for text, n in reasons.most_common()]
    if verbose:
        lines.append("unsupported cases:")
        lines += [f"  {o.name}: {o.detail}" for o in outcomes if o.status == UNSUPPORTED]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per case")
    parser.add_argument("-k", "--filter", help="run only cases whose name matches this regex")
    parser.add_argument("--json", help="also write every outcome to this file")
    parser.add_argument("--verbose", action="store_true", help="list every unsupported case")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    outcomes = run_all(node_cases(args.filter), args.jobs, args.timeout,
                       progress=sys.stderr.isatty())
    print(report(outcomes, time.perf_counter() - start, args.verbose))
    return finish(outcomes, args.json)


if __name__ == "__main__":
    sys.exit(main())
