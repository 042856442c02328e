"""Which schedule an operator gets: a template when its compute definition matches one
(GEMM, then sliding window), otherwise the rule-based schedule. Templates recognise
computes, not operator names, except for operators that only exist as the input format of
one algorithm (Winograd convolution), which bring their own. ``tune`` is the tuning level
of template configurations (see ``treadle.tune``): 0 takes the analytic default, 1 and 2
measure a small or the full space, or replay a record."""
from __future__ import annotations

from treadle.graph.operator import Operator
from treadle.schedule.rules import Kernel, schedule_computes
from treadle.graph.tensor import normalize_dim
from treadle.schedule.templates.index_check import schedule_index_check
from treadle.schedule.templates.matmul_cpu import (GemmPattern, match_gemm_output,
                                                   schedule_gemm, with_constants)
from treadle.schedule.templates.window_cpu import match_window, schedule_window
from treadle.schedule.templates.winograd_cpu import schedule_winograd
from treadle.tune.exhaustive import tune_gemm


# Below this many output columns a GEMM tile is mostly padding (depthwise convolution,
# matrix-vector products); the window template or the rule-based loops serve those better.
MIN_GEMM_COLUMNS = 8


# Operators that exist as the input of one algorithm, or whose kernel does what a compute
# definition cannot (fail per element), bring their template.
OWN_TEMPLATES = {"WinogradConv": schedule_winograd, "CheckIndices": schedule_index_check}


def schedule_operator(op: Operator, name: str, tune: int = 0) -> Kernel:
    if op.op_type in OWN_TEMPLATES:
        return OWN_TEMPLATES[op.op_type](op, name)
    if len(op.definition) == 1:
        pattern = match_gemm_output(op.definition[0])
        if pattern is not None and _wide_enough(pattern):
            pattern = with_constants(pattern, op.constant_inputs)
            cfg = tune_gemm(name, op.input_buffers, pattern, tune)
            return schedule_gemm(name, op.input_buffers, pattern, cfg, op.checks)
        window = match_window(op.definition[0])
        if window is not None:
            return schedule_window(name, op.input_buffers, window, op.checks)
    return schedule_computes(name, op.input_buffers, op.definition, op.checks)


def _wide_enough(pattern: GemmPattern) -> bool:
    c = pattern.compute
    columns = 1
    for axis in pattern.n_axes:
        dim = normalize_dim(c.shape[c.axes.index(axis)])
        if not isinstance(dim, int):
            return True
        columns *= dim
    return columns >= MIN_GEMM_COLUMNS
