"""``treadle bench``: a compiled model's latency, with ONNX Runtime's beside it.

Both systems run the same inputs in one process on as many threads, timed by
``timing.interleaved_medians``: rounds that visit each system in turn, so that a busy
spell on the machine slows both alike instead of whichever was being timed. Progress goes
to stderr, apart from the table: a tqdm bar on a terminal, and elsewhere (a log, a pipe) a
plain line at every quarter of the calls, since a bar's redraws would fill a log with
carriage returns.
"""
from __future__ import annotations

import importlib.util
import math
import sys
from typing import Callable, Mapping, TextIO

import numpy as np

from treadle.config import config, usable_cores
from treadle.timing import ROUND, WARMUP, interleaved_medians, load_note, onnxruntime_session

REFERENCE = "ONNX Runtime"
LINE_PERCENT = 25  # the progress between two plain progress lines


def bench(model: Callable, inputs: Mapping[str, np.ndarray],
          reference_inputs: Mapping[str, np.ndarray], path: str, repeat: int,
          progress: TextIO | None = None) -> str:
    """The table of median latencies over at least ``repeat`` calls of ``model`` on
    ``inputs`` and, where it is installed and can run the ONNX file at ``path``, of ONNX
    Runtime on ``reference_inputs``; progress is written to ``progress`` (stderr)."""
    runs = {"treadle": lambda: model(**inputs)}
    reference, note = _reference(path, reference_inputs)
    if reference is not None:
        runs[REFERENCE] = reference
    bar = _progress_bar(len(runs) * calls_per_system(repeat), progress or sys.stderr)
    try:
        medians = interleaved_medians({name: _counted(fn, repeat, bar.update)
                                       for name, fn in runs.items()}, repeat)
    finally:
        bar.close()
    return _table(medians, repeat, note)


def calls_per_system(repeat: int) -> int:
    """How many calls ``interleaved_medians`` makes of each system for ``repeat``: its
    warm-up calls, then per round one untimed call and ``ROUND`` timed ones."""
    per_round = min(ROUND, repeat)
    return WARMUP + math.ceil(repeat / per_round) * (per_round + 1)


def _reference(path: str, inputs: Mapping[str, np.ndarray]) -> tuple[Callable | None, str]:
    """A call of ONNX Runtime on the model and a note on it, or None and why not."""
    try:
        import onnxruntime  # noqa: F401  (an optional dependency: only whether it is there)
    except ImportError:
        return None, f"{REFERENCE}: not installed (pip install onnxruntime to compare)"
    try:
        session = onnxruntime_session(path, config.num_threads)
        known = {i.name for i in session.get_inputs()}
        feed = {name: value for name, value in inputs.items() if name in known}
        session.run(None, feed)  # fails here, not in the middle of the timing
    except Exception as err:  # onnxruntime's own kinds (InvalidGraph, NotImplemented, ...)
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return None, f"{REFERENCE}: cannot run the model ({reason})"
    return (lambda: session.run(None, feed)), ""


def _counted(fn: Callable[[], object], repeat: int,
             advance: Callable[[int], object]) -> Callable[[], None]:
    """``fn``, advancing the progress only at untimed calls (the warm-up ones and each
    round's first, by the round's calls), so that no timed call includes drawing a bar or
    writing a line: the calls timed may be a few microseconds each."""
    per_round = min(ROUND, repeat)
    calls = 0

    def call() -> None:
        nonlocal calls
        fn()
        calls += 1
        if calls <= WARMUP:
            advance(1)
        elif (calls - WARMUP) % (per_round + 1) == 1:
            advance(per_round + 1)
    return call


def _progress_bar(total: int, stream: TextIO):
    """A tqdm bar on a terminal where tqdm is installed, plain lines otherwise; either
    has ``update()`` and ``close()``."""
    if stream.isatty() and importlib.util.find_spec("tqdm") is not None:
        from tqdm import tqdm  # an optional dependency (the bench extra)
        return tqdm(total=total, file=stream, desc="timing", unit="call", leave=False)
    return _ProgressLines(total, stream)


class _ProgressLines:
    """Progress as a line at every ``LINE_PERCENT`` percent of the calls."""

    def __init__(self, total: int, stream: TextIO):
        self.total, self.stream, self.done = total, stream, 0

    def update(self, calls: int) -> None:
        before = self.done * 100 // self.total // LINE_PERCENT
        self.done += calls
        if self.done * 100 // self.total // LINE_PERCENT > before:
            print(f"timing: {self.done}/{self.total} calls ({self.done * 100 // self.total}%)",
                  file=self.stream, flush=True)

    def close(self) -> None:
        """Nothing to clear: the lines stay in the log."""


def _table(medians: Mapping[str, float], repeat: int, note: str) -> str:
    lines = [f"medians of at least {repeat} interleaved calls each on "
             f"{config.num_threads} threads; {load_note(usable_cores())}",
             f"{'system':<14}{'median latency':>16}"]
    lines += [f"{name:<14}{medians[name] * 1e3:>13.3f} ms" for name in medians]
    if REFERENCE in medians:
        ratio = medians[REFERENCE] / medians["treadle"]
        lines.append(f"speed-up over {REFERENCE}: {ratio:.2f}x (its median over treadle's)")
    else:
        lines.append(note)
    return "\n".join(lines)
