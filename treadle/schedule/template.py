"""The template protocol: how an operator becomes a kernel, in steps that tuning stands
between.

    pattern  = template.match(op)                    # None: not this template's operator
    configs  = template.space(pattern, level, target)  # hardware-centric, best guess first
    template.check(pattern, config, target)          # ScheduleConfigError naming the rule
    resolved = template.resolve(pattern, config, target)  # pure; every clamp happens here
    kernel   = template.emit(resolved, name)         # the only step that builds IR

``resolve`` is where a config meets the problem: two configs with equal resolved values
generate the same program, so a tuner removes duplicates without generating any, and a
stored config replays to the same resolved value and the same C. A resolved value has a
``config`` attribute, the config its program is generated from (None for a template with
nothing to choose). ``workload(pattern)`` is the text a tuning record is keyed by: the
problem, free of generated names (only templates whose space has several points need it).

Templates that schedule one way only (the rule-based fallback, the window and Winograd
templates, index checks) derive from ``FixedTemplate``: a space of one point, ``None``.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence, runtime_checkable

from treadle.errors import ScheduleConfigError
from treadle.graph.operator import Operator
from treadle.schedule.kernel import Kernel
from treadle.schedule.tiling import State, TilingProblem
from treadle.target.cpu import CpuTarget

if TYPE_CHECKING:
    from treadle.ir.expr import Var
    from treadle.target import Target
    from treadle.target.memory import MemoryHierarchy

log = logging.getLogger(__name__)


class Template(Protocol):
    name: str
    config_type: type | None  # the dataclass of a config, for records; None: no configs

    def match(self, op: Operator) -> Any | None: ...

    def space(self, pattern: Any, level: int, target: CpuTarget) -> list: ...

    def check(self, pattern: Any, config: Any, target: CpuTarget) -> None: ...

    def resolve(self, pattern: Any, config: Any, target: CpuTarget) -> Any: ...

    def emit(self, resolved: Any, name: str) -> Kernel: ...

    def workload(self, pattern: Any) -> str: ...


@runtime_checkable
class Constructible(Protocol):
    """What schedule construction (``tune.construct``) asks of a template besides the
    protocol; a template without it keeps its level-0 point under construction.

    ``tiling_problem`` is the template's problem for Gensor's chain: the loop dimensions,
    the operands' accesses, the levels of ``target``'s memory its tiles live in, their
    step lists and capacities. ``constructed_config`` is the config a state of that
    problem stands for (which ``check`` may still refuse: construction skips it).
    ``predicted_seconds`` ranks resolved candidates: an analytic latency on ``memory``,
    the target's hierarchy, never a measurement, with the symbols at ``env``'s values
    (``tiling.SYMBOL_SIZE`` where it has none). Dynamic-shape tuning ranks its variants
    by it where the target has no device to measure on."""

    def tiling_problem(self, pattern: Any, target: Target) -> TilingProblem: ...

    def constructed_config(self, state: State) -> Any: ...

    def predicted_seconds(self, resolved: Any, memory: MemoryHierarchy,
                          env: Mapping[Var, int] | None = None) -> float: ...


@runtime_checkable
class Sized(Protocol):
    """What DietCode's dynamic-shape tuning (``tune.dynamic``) asks of a template besides
    the protocol; a template without it gets one config for every size.

    ``sizes`` are the extents of the problem's axes (expressions over its symbols);
    ``sized_config`` fits a config to the sizes of ``env`` (short register tiles for small
    ones); ``work`` is what a resolved config does at those sizes (the micro-kernel calls
    and padding the cost model reads) and ``features`` what describes its micro-kernel to
    that model; ``layout_key`` what the layout of constant operands depends on, which the
    variants of one kernel must share."""

    def sizes(self, pattern: Any) -> list: ...

    def sized_config(self, pattern: Any, config: Any, target: Target, env) -> Any: ...

    def work(self, resolved: Any, env) -> Any: ...

    def features(self, resolved: Any, target: Target) -> dict[str, float]: ...

    def layout_key(self, resolved: Any) -> Any: ...


@dataclass(frozen=True)
class Fixed:
    """The resolved value of a template with one schedule: its pattern and the target."""
    pattern: Any
    target: CpuTarget
    config: None = None


class FixedTemplate:
    """A template with one schedule: nothing to tune, nothing to record."""
    name = "fixed"
    config_type = None

    def space(self, pattern: Any, level: int, target: CpuTarget) -> list:
        return [None]

    def check(self, pattern: Any, config: Any, target: CpuTarget) -> None:
        if config is not None:
            raise ScheduleConfigError(f"the {self.name} template takes no config, got {config}")

    def resolve(self, pattern: Any, config: Any, target: CpuTarget) -> Fixed:
        self.check(pattern, config, target)
        return Fixed(pattern, target)


def valid_points(template: Template, pattern: Any, configs: list, target: CpuTarget
                 ) -> list[tuple[Any, Any]]:
    """(config, resolved) for each of ``configs`` the template accepts for ``pattern``."""
    found = []
    for config in configs:
        try:
            template.check(pattern, config, target)
            found.append((config, template.resolve(pattern, config, target)))
        except ScheduleConfigError as err:
            log.debug("%s: skipping %s (%s)", template.name, config, err)
    return found


def default_point(template: Template, pattern: Any, target: CpuTarget) -> tuple[Any, Any]:
    """(config, resolved) of the level-0 point: the first the template accepts, or where it
    accepts none, its own default config (which raises if that fails too)."""
    points = valid_points(template, pattern, template.space(pattern, 0, target), target)
    if points:
        return points[0]
    config = template.config_type() if template.config_type else None
    return config, template.resolve(pattern, config, target)


def canonical_names(text: str, names: Sequence[str]) -> str:
    """``text`` with each of ``names`` replaced by ``_<order of first appearance>``, so
    the counters in generated names do not change a workload's text."""
    order: dict[str, int] = {}
    for name in names:
        order.setdefault(name, len(order))
    if not order:
        return text
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(order, key=len, reverse=True)))
                         + r")\b")
    return pattern.sub(lambda m: f"_{order[m.group(1)]}", text)
