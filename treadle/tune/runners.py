"""Where built candidates are timed: the runners of the measure step.

A *trial* is one candidate, built already (the build stays with the caller): the shared
object holding it, its signature, its symbols' sizes and how cold its data is to be. A
runner takes trials and returns their median seconds (None where one failed):

- ``LocalRunner``, the default: every trial in a measuring child on this machine
  (``python -m treadle.tune.measure JOB``), which reports each trial on its stdout as it
  goes, so a trial that crashes the child or runs past its timeout is marked failed and
  the child is restarted on the rest;
- ``tune.cluster.RayRunner`` (``runner="ray"``, an extra): the same child, on the nodes of
  a Ray cluster whose device matches the target's (``device_key``).

Both hand the trials to ``TRIAL_TIMER``, the function that times trials on the machine
that runs them; it is the one place where tests put a deterministic stand-in.
"""
from __future__ import annotations

import logging
import os
import pickle
import queue
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

from treadle.ir.expr import Var
from treadle.ir.stmt import Function
from treadle.target import Target
from treadle.target.cpu import cpu_model

log = logging.getLogger(__name__)

READER_JOIN_S = 5.0   # how long the pipe's reader may take to close it after the child


@dataclass(frozen=True)
class Trial:
    """One built candidate: ``function`` (named as in the library) in the shared object
    at ``library``, called with its symbols at ``env``, on argument copies spanning
    ``cold_bytes`` (0: the same arguments every call); ``index`` is its place in the
    measuring call and ``label`` names it in warnings."""
    index: int
    library: str
    function: Function
    env: Mapping[Var, int]
    cold_bytes: int
    label: str


@dataclass(frozen=True)
class Settings:
    """How trials are timed (``measure.measure_functions``): ``threads`` the kernels run
    on, ``cores`` the child is bound to (None: wherever the caller runs)."""
    repeats: int
    threads: int
    budget: float
    timeout: float
    cores: tuple[int, ...] | None = None


Times = dict[int, float | None]  # median seconds by trial index; None: it failed
Settle = Callable[[Sequence[float | None]], object]  # told the times of settled trials


class Runner(Protocol):
    def __call__(self, trials: Sequence[Trial], target: Target, settings: Settings,
                 settle: Settle) -> Times:
        """The seconds of every trial; ``settle`` is told of each as it finishes."""
        ...


def time_in_child(trials: Sequence[Trial], settings: Settings, settle: Settle) -> Times:
    """Every trial timed in a measuring child on this machine, restarted after a trial
    that crashes or hangs it on the trials left."""
    results: Times = {t.index: None for t in trials}
    labels = {t.index: t.label for t in trials}
    todo = list(trials)
    with tempfile.TemporaryDirectory(prefix="treadle-measure-") as tmp:
        while todo:
            job = Path(tmp) / "job.pkl"
            job.write_bytes(pickle.dumps({
                "candidates": [(t.index, t.library, t.function, t.env, t.cold_bytes)
                               for t in todo],
                "repeats": settings.repeats, "threads": settings.threads,
                "budget": settings.budget}))
            done = _run_child(job, results, settings, labels)
            if not done:  # the child died before reaching any trial
                log.warning("tuning: the measuring process failed to start; %d candidates "
                            "left unmeasured", len(todo))
                settle([None] * len(todo))
                break
            settle([results[k] for k in done])
            todo = [t for t in todo if t.index not in done]
    return results


# The function that times trials where they run; tests replace it with a deterministic
# stand-in (a function of a module, so a Ray worker imports it by name).
TRIAL_TIMER: Callable[[Sequence[Trial], Settings, Settle], Times] = time_in_child


class LocalRunner:
    """Trials timed on this machine (the default runner)."""

    def __call__(self, trials: Sequence[Trial], target: Target, settings: Settings,
                 settle: Settle) -> Times:
        return TRIAL_TIMER(trials, settings, settle)


def _run_child(job: Path, results: Times, settings: Settings, labels: Mapping[int, str]
               ) -> set[int]:
    """Runs one child on ``job``; returns the trials it finished or that failed."""
    cores = settings.cores
    child = subprocess.Popen([sys.executable, "-m", "treadle.tune.measure", str(job)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             env=_child_environment(),
                             preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores
                             else None)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_forward_lines, args=(child.stdout, lines), daemon=True)
    reader.start()
    done: set[int] = set()
    current = None
    try:
        while True:
            try:
                line = lines.get(timeout=settings.timeout)
            except queue.Empty:
                log.warning("tuning: candidate %s %s ran past %.0f s; skipped", current,
                            labels[current] if current is not None else "", settings.timeout)
                break
            if line is None:
                if current is not None:
                    log.warning("tuning: candidate %s %s crashed the measuring process "
                                "(exit status %s); skipped", current, labels[current],
                                child.wait())
                break
            word, index, *rest = line.split()
            current = int(index)
            if word == "time":
                results[current] = float(rest[0])
                done.add(current)
                current = None
            elif word == "ok":
                current = None
            elif word == "error":
                log.warning("tuning: candidate %s %s failed: %s", current, labels[current],
                            " ".join(rest))
                done.add(current)
                current = None
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        # The child's end of the pipe is closed now, so the reader meets the end of it and
        # closes ours (later, where a process the child started holds it open still).
        reader.join(timeout=READER_JOIN_S)
    if current is not None:
        done.add(current)
    return done


def _forward_lines(stream, lines: queue.Queue) -> None:
    """Puts each line of ``stream`` on ``lines``, then None at its end, and closes it."""
    with stream:
        for line in stream:
            lines.put(line)
    lines.put(None)


def _child_environment() -> dict[str, str]:
    """The parent's environment, with treadle importable however the parent found it."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


# ---- device keys -----------------------------------------------------------------------------

def device_key(target: Target) -> str:
    """What a worker must have for its timings to hold for the CPU ``target``: this
    machine's CPU model and the instruction-set extensions the kernels use."""
    return f"{cpu_model()} [{' '.join(target.features) or 'no SIMD extensions'}]"

