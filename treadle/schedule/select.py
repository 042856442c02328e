"""Which template schedules an operator, per target: the first in the target's table whose
``match`` takes it. Templates recognise computes, not operator names, except for
operators that only exist as the input of one algorithm (Winograd convolution, the
orchestrator's fused attention) or whose kernel does what a compute definition cannot
(fail per element). An operator that brings its own program (``OpDef.kernel``) gets it
first; the rule-based schedule takes every operator and comes last.

Choosing a config is tuning's business (``treadle.tune``); ``schedule_operator`` takes the
level-0 point, for callers that tune nothing.
"""
from __future__ import annotations

from typing import Any

from treadle.graph.operator import Operator
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import schedule_computes
from treadle.schedule.template import FixedTemplate, Template, default_point
from treadle.schedule.templates.attention_cpu import schedule_attention
from treadle.schedule.templates.dot_cpu import DOT
from treadle.schedule.templates.gemm import GEMM
from treadle.schedule.templates.gemv_cpu import GEMV
from treadle.schedule.templates.index_check import schedule_index_check
from treadle.schedule.templates.matmul_cuda import MATMUL_CUDA
from treadle.schedule.templates.window_cpu import match_window, schedule_window
from treadle.schedule.templates.winograd_cpu import schedule_winograd
from treadle.target import Target


class OwnTemplate(FixedTemplate):
    """The kernel of the one operator type that brings it."""
    op_type = ""

    def match(self, op: Operator) -> Operator | None:
        return op if op.op_type == self.op_type else None


class HandWrittenTemplate(FixedTemplate):
    """The program an operator brings itself (``OpDef.kernel``: a ``treadle.lang`` kernel
    registered as an op); prologues and epilogues are fused into it as into any other."""
    name = "hand_written"

    def match(self, op: Operator) -> Operator | None:
        return op if op.opdef.kernel is not None else None

    def emit(self, resolved, name: str) -> Kernel:
        op = resolved.pattern
        return op.opdef.kernel(op, name)


class WinogradTemplate(OwnTemplate):
    name, op_type = "winograd", "WinogradConv"

    def emit(self, resolved, name: str) -> Kernel:
        return schedule_winograd(resolved.pattern, name, resolved.target)


class IndexCheckTemplate(OwnTemplate):
    name, op_type = "index_check", "CheckIndices"

    def emit(self, resolved, name: str) -> Kernel:
        return schedule_index_check(resolved.pattern, name)


class AttentionTemplate(OwnTemplate):
    name, op_type = "attention", "FusedAttention"

    def emit(self, resolved, name: str) -> Kernel:
        return schedule_attention(resolved.pattern, name, resolved.target)


class WindowTemplate(FixedTemplate):
    name = "window"

    def match(self, op: Operator):
        window = match_window(op.definition[0]) if len(op.definition) == 1 else None
        return None if window is None else (op, window)

    def emit(self, resolved, name: str) -> Kernel:
        op, window = resolved.pattern
        return schedule_window(name, op.input_buffers, window, op.checks)


class RulesTemplate(FixedTemplate):
    name = "rules"

    def match(self, op: Operator) -> Operator:
        return op

    def emit(self, resolved, name: str) -> Kernel:
        op = resolved.pattern
        return schedule_computes(name, op.input_buffers, op.definition, op.checks)


TEMPLATES: dict[str, tuple[Template, ...]] = {
    "cpu": (HandWrittenTemplate(), WinogradTemplate(), IndexCheckTemplate(),
            AttentionTemplate(), DOT, GEMV, GEMM, WindowTemplate(), RulesTemplate()),
    # On CUDA the rules' parallel loops become launches (ir.passes.split_launches).
    "cuda": (HandWrittenTemplate(), IndexCheckTemplate(), MATMUL_CUDA, RulesTemplate()),
}


def select_template(op: Operator, target: Target) -> tuple[Template, Any]:
    """The template that schedules ``op`` on ``target``, and what it matched."""
    for template in TEMPLATES[target.kind]:
        pattern = template.match(op)
        if pattern is not None:
            return template, pattern
    raise AssertionError("the rule-based template takes every operator")


def takes_as_its_own(op_type: str, target: Target) -> bool:
    """Whether one of ``target``'s templates schedules operators of ``op_type`` by name
    (the orchestrator fuses an attention into one operator only where one does)."""
    return any(isinstance(t, OwnTemplate) and t.op_type == op_type
               for t in TEMPLATES[target.kind])


def schedule_operator(op: Operator, name: str, target: Target) -> Kernel:
    """``op``'s kernel at the level-0 point of its template."""
    template, pattern = select_template(op, target)
    _, resolved = default_point(template, pattern, target)
    return template.emit(resolved, name)
