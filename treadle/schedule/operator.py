"""Which schedule an operator gets: a template when its compute definition matches one,
otherwise the rule-based schedule. Templates recognise computes, not operator names."""
from __future__ import annotations

from treadle.graph.operator import Operator
from treadle.schedule.rules import Kernel, schedule_computes
from treadle.schedule.templates.matmul_cpu import match_gemm, schedule_gemm


def schedule_operator(op: Operator, name: str) -> Kernel:
    if len(op.definition) == 1 and not op.checks:
        pattern = match_gemm(op.definition[0])
        if pattern is not None:
            return schedule_gemm(name, op.input_buffers, pattern)
    return schedule_computes(name, op.input_buffers, op.definition, op.checks)
