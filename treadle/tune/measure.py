"""Measuring candidate kernels, by the timer of their target (``TIMERS``).

On the CPU, candidates are built together through the one build path
(``runtime.build.shared_objects``: a few shared objects, compiled in parallel) and handed,
as trials, to the runner ``config.runner`` names (``tune.runners``): a measuring child on
this machine by default (``python -m treadle.tune.measure JOB``, the child below), which
reports each candidate on its stdout as it goes, so a candidate that crashes the process
or runs past ``timeout`` seconds is marked failed (None) and the child is restarted on the
rest: a broken candidate never takes the tuner down. With ``runner="ray"`` the same child
runs on the nodes of a Ray cluster (``tune.cluster``). Each candidate runs once to warm
up, then ``repeats`` times on random data of the workload's concrete shape, in rounds
interleaved with the other candidates of its child; the median counts.
Symbolic dimensions take ``symbol_size``, or the values given per candidate.

In a model a layer's weights come from memory, not cache: each call takes the next of
several copies of the arguments, together twice the last-level cache, so candidates are
timed reading cold data, as they will run.

On CUDA, candidates are built into cubins and each launch is timed with CUDA events
through the driver, on device-resident random arguments. Where the machine has no CUDA
device, measuring raises ``DeviceUnavailableError``: what measures nothing (level 0,
``"construct"``) still compiles for CUDA.
"""
from __future__ import annotations

import functools
import itertools
import logging
import pickle
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from treadle.config import config
from treadle.errors import (CompileError, DeviceUnavailableError, RunnerUnavailableError,
                            TreadleError)
from treadle.ir.expr import Buffer, Var
from treadle.ir.functor import evaluate, free_vars
from treadle.ir.stmt import Function
from treadle.runtime.build import build, shared_objects
from treadle.schedule.tiling import SYMBOL_SIZE
from treadle.target import Target
from treadle.tune.progress import Progress
from treadle.tune.runners import LocalRunner, Runner, Settings, Trial

log = logging.getLogger(__name__)

REPEATS = 15
TIMEOUT_S = 20.0      # per candidate, warm-up and repeats together
TIME_BUDGET_S = 1.0   # fewer repeats for a candidate slower than this in all
ROUNDS = 3            # timing rounds, interleaved across candidates
MAX_COPIES = 16       # argument copies cycled through to keep the data cold


def measure_functions(functions: Sequence[Function], *, target: Target,
                      symbol_size: int = SYMBOL_SIZE,
                      repeats: int = REPEATS, timeout: float = TIMEOUT_S,
                      progress: Callable[[int], object] = lambda n: None,
                      labels: Sequence[str] | None = None,
                      sizes: Sequence[Mapping[str, int]] | None = None,
                      cold: bool | Sequence[bool] = True,
                      budget: float = TIME_BUDGET_S) -> list[float | None]:
    """Median seconds per call of each function (None where it failed to build, crashed or
    timed out); ``progress(n)`` is called as n more candidates are settled; ``labels``
    name the candidates in warnings; ``sizes`` gives each function's symbols their
    values by name (``symbol_size`` where it names none); ``cold=False`` calls each with
    the same arguments, in cache as a kernel's inputs are when the one before it has just
    written them (a flag per function where given a sequence). A candidate whose calls
    together would take more than ``budget`` seconds is timed fewer times (3 at least).
    A ``tune.progress.Progress`` given as ``progress`` is also told the failures and
    times."""
    count = len(functions)
    request = Request(symbol_size, repeats, timeout, progress,
                      list(labels) if labels is not None else [""] * count,
                      list(sizes) if sizes is not None else [{}] * count,
                      [cold] * count if isinstance(cold, bool) else list(cold), budget)
    return TIMERS[target.kind](functions, target, request)


@dataclass(frozen=True)
class Request:
    """How candidates are to be timed (see ``measure_functions``), one entry per
    candidate in ``labels``, ``sizes`` and ``cold``."""
    symbol_size: int
    repeats: int
    timeout: float
    progress: Callable[[int], object]
    labels: list[str]
    sizes: list[Mapping[str, int]]
    cold: list[bool]
    budget: float


def _time_on_cpu(functions: Sequence[Function], target: Target, request: Request
                 ) -> list[float | None]:
    """The CPU's timer: the candidates built together, timed by the chosen runner."""
    # A function timed at several sizes is built once.
    built: dict[Function, int] = {}
    index = [built.setdefault(_renamed(f, ""), len(built)) for f in functions]
    unique = [_renamed(f, f"candidate{k}") for k, f in enumerate(built)]
    named = [unique[k] for k in index]
    paths = _build(unique, target) if unique else []
    trials = [Trial(k, str(paths[index[k]]), f, _environment(f, given, request.symbol_size),
                    2 * target.l3_bytes if cold else 0, label)
              for k, (f, given, cold, label) in enumerate(zip(
                  named, request.sizes, request.cold, request.labels))
              if paths[index[k]] is not None]
    settle = _settler(request.progress)
    settle([None] * (len(named) - len(trials)))
    results: list[float | None] = [None] * len(named)
    if trials:
        settings = Settings(request.repeats, config.num_threads, request.budget,
                            request.timeout)
        for k, seconds in runner_named(config.runner)(trials, target, settings,
                                                      settle).items():
            results[k] = seconds
    return results


@functools.lru_cache(maxsize=None)  # one per name: a cluster runner keeps its connection
def runner_named(name: str) -> Runner:
    """The runner ``name`` stands for (``config.runner_name``)."""
    if name == "local":
        return LocalRunner()
    try:
        from treadle.tune.cluster import RayRunner  # Ray is an extra, imported when chosen
    except ImportError as err:
        raise RunnerUnavailableError(f"runner {name!r} needs Ray, which this Python lacks "
                                     f"({err}); pip install 'treadle[cluster]'") from None
    return RayRunner(name)


def _settler(progress: Callable[[int], object]) -> Callable[[Sequence[float | None]], object]:
    """What runners tell of settled trials, passed on to ``progress``: their times where it
    shows them, their count otherwise."""
    if isinstance(progress, Progress):
        return progress.settle
    return lambda times: progress(len(times))


def _environment(f: Function, given: Mapping[str, int], symbol_size: int) -> dict[Var, int]:
    return {v: given.get(v.name, symbol_size) for v in _symbols(f)}


def _renamed(f: Function, name: str) -> Function:
    return replace(f, name=name)


def _symbols(f: Function) -> set[Var]:
    found = {p for p in f.params if isinstance(p, Var)}
    found |= {v for p in f.params if isinstance(p, Buffer) for d in p.shape for v in free_vars(d)}
    return found


def _build(functions: Sequence[Function], target: Target) -> list[Path | None]:
    """The shared object holding each function, None where it failed to build; after a
    failure, each function of the batch is built alone to find the ones at fault."""
    try:
        return [path for path, group in shared_objects(functions, target, "tune")
                for _ in group]
    except CompileError:
        paths: list[Path | None] = []
        for function in functions:
            try:
                paths.append(shared_objects([function], target, "tune")[0][0])
            except CompileError as err:
                log.warning("tuning: a candidate failed to compile:\n%s", err)
                paths.append(None)
        return paths


def _time_on_cuda(functions: Sequence[Function], target: Target, request: Request
                  ) -> list[float | None]:
    """Median seconds of each function's launches, timed with CUDA events on the device;
    None where one failed."""
    from treadle.runtime import cuda
    if not cuda.available():
        raise DeviceUnavailableError(
            f"measuring CUDA kernels for {target.arch} needs a CUDA device, and this "
            "machine has none; compile for CUDA with tune=0 or tune='construct', which "
            "measure nothing")
    named = [_renamed(f, f"candidate{k}") for k, f in enumerate(functions)]
    built = build(named, target, "tune")
    modules: dict = {}
    results: list[float | None] = []
    for function, given in zip(named, request.sizes):
        env = _environment(function, given, request.symbol_size)
        rng = np.random.default_rng(0)
        arrays = [cuda.DeviceArray.from_numpy(_random(p, env, rng))
                  for p in function.params if isinstance(p, Buffer)]
        symbols = {v.name: value for v, value in env.items()}
        try:
            results.append(sum(float(np.median(k.time(*arrays, repeat=request.repeats,
                                                      **symbols)))
                               for k in built[function.name].kernels(modules)) / 1e3)
        except TreadleError as err:
            log.warning("tuning: candidate %s failed on the device: %s", function.name, err)
            results.append(None)
        request.progress(1)
    return results


def _random(buffer: Buffer, env: Mapping[Var, int], rng: np.random.Generator) -> np.ndarray:
    """Contents for ``buffer`` at the sizes of ``env``: floats from a standard normal,
    zeros otherwise (valid indices and counts)."""
    shape = tuple(int(evaluate(d, env)) for d in buffer.shape)
    dtype = np.dtype(buffer.dtype.name)
    return rng.standard_normal(shape).astype(dtype) if dtype.kind == "f" \
        else np.zeros(shape, dtype)


# Target kind -> its timer.
TIMERS = {"cpu": _time_on_cpu, "cuda": _time_on_cuda}


# ---- the child -----------------------------------------------------------------------------

def _child_main(job_path: str) -> None:
    """Warms every candidate up once (a crash or hang here is pinned on it), then times
    them in interleaved rounds, so a burst of load from elsewhere on the machine slows
    every candidate a little rather than one candidate a lot."""
    from treadle.config import override
    from treadle.runtime.module import load
    job = pickle.loads(Path(job_path).read_bytes())
    copies: list[dict] = []
    ready = []
    # One rotation for all candidates: each call takes the copy least recently used by
    # any of them. With a rotation per candidate, every candidate of a round read the
    # copies the first had just brought into cache, and the first of each round measured
    # 30-50% slower than the same kernel placed later.
    turn = itertools.count()
    with override(num_threads=job["threads"]):
        for index, path, function, env, cold_bytes in job["candidates"]:
            print("start", index, flush=True)
            try:
                kernel = load(path, [function])[function.name]
                args = _cold_arguments(function, env, copies, cold_bytes)
                first = _seconds(kernel, args, next(turn))
            except Exception as err:  # a candidate's own failure, reported, not fatal
                print("error", index, type(err).__name__, str(err).replace("\n", " "),
                      flush=True)
                continue
            count = max(3, min(job["repeats"], int(job["budget"] / max(first, 1e-9))))
            ready.append((index, kernel, args, -(-count // ROUNDS), []))
            print("ok", index, flush=True)
        for _ in range(ROUNDS):
            for index, kernel, args, per_round, samples in ready:
                print("start", index, flush=True)
                samples.extend(_seconds(kernel, args, next(turn)) for _ in range(per_round))
        for index, _, _, _, samples in ready:
            print("time", index, repr(float(np.median(samples))), flush=True)


def _cold_arguments(function: Function, env: Mapping[Var, int], copies: list[dict],
                    cold_bytes: int) -> list[list]:
    """One argument list per copy of the arguments: enough copies (at most MAX_COPIES)
    to span ``cold_bytes``. ``copies`` holds the arrays of each copy, shared by candidates
    of one workload."""
    if not copies:
        copies.append({})
    first, footprint = _arguments(function, env, copies[0])
    wanted = min(MAX_COPIES, max(1, -(-cold_bytes // max(footprint, 1))))
    while len(copies) < wanted:
        copies.append({})
    return [first] + [_arguments(function, env, c, copies[0])[0] for c in copies[1:wanted]]


def _arguments(function: Function, env: Mapping[Var, int], arrays: dict,
               source: Mapping | None = None) -> tuple[list, int]:
    """The call's arguments, with its buffers taken from (or added to) ``arrays``, and
    the bytes those buffers hold. A buffer missing from ``arrays`` is copied from
    ``source`` where it holds one: what makes a copy cold is its address, and copying
    is ten times faster than drawing random numbers again (for every size a dynamic
    kernel is timed at, up to MAX_COPIES times the operands)."""
    rng = np.random.default_rng(0)
    args, nbytes = [], 0
    for p in function.params:
        if isinstance(p, Var):
            args.append(env[p])
            continue
        key = (p.name, tuple(int(evaluate(d, env)) for d in p.shape), p.dtype.name)
        if key not in arrays and source is not None and key in source:
            arrays[key] = source[key].copy()
        elif key not in arrays:
            arrays[key] = _random(p, env, rng)
        args.append(arrays[key].ctypes.data)
        nbytes += arrays[key].nbytes
    return args, nbytes


def _seconds(kernel, args: Sequence[list], turn: int) -> float:
    """One call's seconds, on the copy of the arguments whose turn it is."""
    arguments = args[turn % len(args)]
    start = time.perf_counter()
    kernel.call_unchecked(arguments)
    return time.perf_counter() - start


if __name__ == "__main__":
    _child_main(sys.argv[1])
