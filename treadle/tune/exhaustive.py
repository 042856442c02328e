"""Exhaustive tuning of the GEMM template: measure every point of the level's space.

Level 0 measures nothing: it is the space's one analytic point. Levels 1 and 2 look up a
record first; without one, every point is scheduled (points the template rejects with
ScheduleConfigError are skipped), points that schedule to the same IR are measured once,
and the fastest is stored, unless it beats the analytic default by less than MARGIN: on
a shared machine two measurements of one kernel differ by more than that, and a point
that won by noise is often slower in the model. Points that fail to build, crash or hang
are logged and left out; when every point fails, the analytic default stands.
"""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import replace
from typing import Sequence

from treadle.errors import ScheduleConfigError
from treadle.ir.expr import Buffer
from treadle.ir.stmt import Function
from treadle.schedule.templates.matmul_cpu import GemmConfig, GemmPattern, schedule_gemm
from treadle.target.cpu import CpuTarget, host
from treadle.tune.measure import measure_functions
from treadle.tune.records import Record, load_record, store_record, workload_text
from treadle.tune.space import gemm_space

log = logging.getLogger(__name__)

MARGIN = 0.95  # a measured point replaces the analytic default when at least 5% faster


def tune_gemm(name: str, inputs: Sequence[Buffer | None], pattern: GemmPattern, level: int,
              target: CpuTarget | None = None) -> GemmConfig:
    """The best GEMM configuration for this workload at ``level`` (0, 1 or 2)."""
    target = target or host()
    if level == 0:
        return default_gemm_config(name, inputs, pattern, target)
    workload = workload_text(inputs, pattern, level, target)
    # A record the template rejects (edited, or damaged into valid JSON) is tuned afresh.
    record = load_record(workload, lambda cfg: schedule_gemm(name, inputs, pattern, cfg))
    if record is not None:
        return record.config
    candidates = _schedulable(name, inputs, pattern, gemm_space(level, target))
    timings = _measure(name, candidates)
    measured = [(cfg, t) for cfg, t in timings if t is not None]
    if not measured:
        log.warning("tuning %s: every candidate failed; using the analytic default", name)
        return default_gemm_config(name, inputs, pattern, target)
    best, fastest = min(measured, key=lambda item: item[1])
    default = default_gemm_config(name, inputs, pattern, target)
    default_time = next((t for cfg, t in measured if cfg == default), None)
    if default_time is not None and fastest > MARGIN * default_time:
        best = default
    store_record(Record(workload, best, tuple(timings)))
    return best


def default_gemm_config(name: str, inputs: Sequence[Buffer | None], pattern: GemmPattern,
                        target: CpuTarget) -> GemmConfig:
    """The level-0 point, or the template's own default where the template rejects it."""
    candidates = _schedulable(name, inputs, pattern, gemm_space(0, target))
    return candidates[0][0] if candidates else GemmConfig()


def _schedulable(name, inputs, pattern, space) -> list[tuple[GemmConfig, Function]]:
    found = []
    for cfg in space:
        try:
            found.append((cfg, schedule_gemm(name, inputs, pattern, cfg).function))
        except ScheduleConfigError as err:
            log.debug("tuning %s: skipping %s (%s)", name, cfg, err)
    return found


def _measure(name: str, candidates: list[tuple[GemmConfig, Function]]
             ) -> list[tuple[GemmConfig, float | None]]:
    """Times each candidate; configurations scheduled to the same IR share one timing."""
    unique: dict[Function, int] = {}
    for _, function in candidates:
        unique.setdefault(replace(function, name=""), len(unique))
    functions = list(unique)
    labels = {}
    for cfg, function in candidates:
        labels.setdefault(unique[replace(function, name="")], f"of {name} ({cfg})")
    with _progress(len(functions), name) as bar:
        seconds = measure_functions(functions, progress=bar.update,
                                    labels=[labels[k] for k in range(len(functions))])
    return [(cfg, seconds[unique[replace(function, name="")]]) for cfg, function in candidates]


def _progress(total: int, name: str):
    """A tqdm bar on a terminal (tqdm is optional); otherwise a silent stand-in."""
    if sys.stderr.isatty() and "PYTEST_CURRENT_TEST" not in os.environ:
        try:
            from tqdm import tqdm
        except ImportError:
            pass
        else:
            return tqdm(total=total, desc=f"tuning {name}", unit="config", leave=False)
    return _Silent()


class _Silent:
    """What the tuner uses of a tqdm bar, doing nothing."""

    def __enter__(self) -> "_Silent":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def update(self, n: int = 1) -> None:
        return None
