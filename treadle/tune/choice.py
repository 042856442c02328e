"""Choosing a template's config through the template protocol: measure every distinct
point of the level's space (exhaustive tuning), or construct one (``tune.construct``).

Level 0 measures nothing: it is the space's first point the template accepts. Levels 1
and 2 look up a record first; without one, every point of the space is checked and
resolved (points the template rejects with ScheduleConfigError are skipped), points that
resolve alike are one candidate (equal resolved values generate equal programs, so no IR
is generated to find them), and only the distinct ones are generated and measured. The
fastest is stored, unless it beats the level-0 point by less than MARGIN: on a shared
machine two measurements of one kernel differ by more than that, and a point that won
by noise is often slower in the model. Points that fail to build, crash or hang are
logged and left out; when every point fails, the level-0 point stands.

``"construct"`` takes the best state schedule construction ranks first, measuring
nothing; ``"construct+measure"`` measures its TOP_K best-ranked states (and the level-0
point) as above, and records the winner like a tuned one.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from treadle.schedule.template import Template, default_point, valid_points
from treadle.target import Target
from treadle.tune.construct import construct
from treadle.tune.measure import measure_functions
from treadle.tune.progress import Progress
from treadle.tune.records import Record, load_record, store_record, workload_text

log = logging.getLogger(__name__)

LEVELS = (0, 1, 2, "construct", "construct+measure")
MARGIN = 0.95  # a measured point replaces the level-0 point when at least 5% faster
TOP_K = 4  # constructed states measured by "construct+measure"


@dataclass(frozen=True)
class Choice:
    """A template's config for one operator, what it resolved to, and where it came from:
    "default" (the level-0 point), "record" (a stored tuning) or "measured"."""
    template: Template
    config: Any
    resolved: Any
    source: str


def choose(template: Template, pattern: Any, name: str, level: int | str,
           target: Target) -> Choice:
    """The config of ``template`` for ``pattern`` at tuning ``level`` (see LEVELS)."""
    if level not in LEVELS:
        raise ValueError(f"tuning level {level!r}: expected one of {LEVELS}")
    default = Choice(template, *default_point(template, pattern, target), "default")
    if level == 0 or template.config_type is None:  # nothing to choose
        return default
    if level == "construct":
        config = _constructed(template, pattern, target)
        return Choice(template, config, template.resolve(pattern, config, target), "constructed")
    # A stored record is looked up first: replaying it needs neither the space nor
    # construction (a second compile of a tuned model).
    workload = workload_text(template, pattern, level, target)
    record = load_record(workload, template, pattern, target)
    if record is not None:
        return Choice(template, record.config, template.resolve(pattern, record.config, target),
                      "record")
    if level == "construct+measure":
        ranked = construct(template, pattern, target)[:TOP_K]
        points = [(default.config, default.resolved)]
        points += [p for p in ranked if p[1] != default.resolved]
    else:
        points = distinct_points(template, pattern, level, target, first=default)
    if len(points) < 2:
        return default
    timings = _measure(template, name, points, target)
    measured = [(p, t) for p, t in zip(points, timings) if t is not None]
    if not measured:
        log.warning("tuning %s: every candidate failed; using the level-0 point", name)
        return default
    (config, resolved), fastest = min(measured, key=lambda item: item[1])
    default_time = timings[0]  # the level-0 point comes first
    if default_time is not None and fastest > MARGIN * default_time:
        config, resolved = default.config, default.resolved
    store_record(Record(workload, config, resolved.config,
                        tuple((c, t) for (c, _), t in zip(points, timings))))
    return Choice(template, config, resolved, "measured")


# Constructed configs by workload text: a model repeats its layers, and the text names
# everything construction depends on (the problem, the target, the template's source).
_CONSTRUCTED: dict[str, Any] = {}


def _constructed(template: Template, pattern: Any, target: Target) -> Any:
    key = workload_text(template, pattern, "construct", target)
    if key not in _CONSTRUCTED:
        _CONSTRUCTED[key] = construct(template, pattern, target)[0][0]
    return _CONSTRUCTED[key]


def distinct_points(template: Template, pattern: Any, level: int, target: Target,
                    first: Choice | None = None) -> list[tuple[Any, Any]]:
    """(config, resolved) of the level's space, one per distinct resolved value (the
    first config that reaches it), with ``first``'s point ahead of the others."""
    points = valid_points(template, pattern, template.space(pattern, level, target), target)
    if first is not None:
        points.insert(0, (first.config, first.resolved))
    unique: dict[Any, Any] = {}
    for config, resolved in points:
        unique.setdefault(resolved, config)
    return [(config, resolved) for resolved, config in unique.items()]


def _measure(template: Template, name: str, points: list[tuple[Any, Any]], target: Target
             ) -> list[float | None]:
    """Median seconds of each point's program (None where it failed)."""
    functions = [template.emit(resolved, name).function for _, resolved in points]
    labels = [f"of {name} ({config})" for config, _ in points]
    with measurement_progress(len(functions), name) as bar:
        return measure_functions(functions, target=target, progress=bar, labels=labels)


def measurement_progress(total: int, name: str) -> Progress:
    """Trials done, failed and the best so far: a tqdm bar on a terminal (tqdm is
    optional), log lines otherwise (``tune.progress``)."""
    return Progress(total, name)
