"""The CPU matrix-multiplication template, for every operator whose compute is a sum of
products of two operands (MatMul, Gemm, batched matmul, convolution), in the steps of the
template protocol (``schedule.template``):

    pattern.py       match: the roles of the axes (batch, M, N, K) and the epilogue
    space.py         space: the hardware-centric configs of a tuning level
    construction.py  construction: the tiling problem, a state's config, the latency model
    config.py        check: the rules every config keeps
    resolve.py       resolve: the config fitted to the problem, once
    program.py       emit: the program, from packing.py and micro_kernel.py, or tiles.py
                     (integer products on AMX's tiles)
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

from treadle.graph.operator import Operator
from treadle.graph.tensor import normalize_dim
from treadle.ir.expr import Buffer, Expr, Load, Var, as_expr
from treadle.ir.functor import free_vars, walk
from treadle.ir.printer import format_buffer_type, format_expr
from treadle.schedule.kernel import Kernel
from treadle.schedule.template import canonical_names
from treadle.schedule.templates.gemm.config import GemmConfig, check_config
from treadle.schedule.templates.gemm.construction import gemm_config, gemm_problem, gemm_seconds
from treadle.schedule.templates.gemm.cost import Work, features, work
from treadle.schedule.templates.gemm.pattern import (ROLES, GemmPattern, left_value,
                                                     match_gemm, match_gemm_output,
                                                     plain_left, role_extents,
                                                     with_constants)
from treadle.schedule.templates.gemm.program import emit
from treadle.schedule.templates.gemm.resolve import ResolvedGemm, resolve, sized_config
from treadle.schedule.templates.gemm.space import gemm_space
from treadle.schedule.templates.gemm.tiles import tile_space
from treadle.schedule.templates.gemm.words import tiled
from treadle.schedule.templates.thresholds import MIN_GEMM_COLUMNS
from treadle.schedule.templates.window_cpu import sliding_window
from treadle.schedule.tiling import State, TilingProblem
from treadle.target.cpu import CpuTarget, host
from treadle.target.memory import MemoryHierarchy

__all__ = ["GEMM", "GemmConfig", "GemmPattern", "GemmTemplate", "ResolvedGemm", "gemm_workload",
           "match_gemm", "match_gemm_output", "schedule_gemm", "with_constants"]



class GemmTemplate:
    name = "gemm"
    config_type = GemmConfig

    def match(self, op: Operator) -> GemmPattern | None:
        if len(op.definition) != 1:
            return None
        pattern = match_gemm_output(op.definition[0], integer=True)
        if pattern is not None and pattern.n_axes and not _wide_enough(pattern):
            if sliding_window(op.definition[0]):
                return None
            if not _rows_of_k(pattern):
                pattern = _swapped(pattern)
        if pattern is None or not _wide_enough(pattern):
            return None
        return replace(with_constants(pattern, op.constant_inputs),
                       inputs=tuple(op.input_buffers), checks=tuple(op.checks))

    def space(self, pattern: GemmPattern, level: int, target: CpuTarget) -> list[GemmConfig]:
        return tile_space(level) if tiled(pattern, target) else gemm_space(level, target)

    def check(self, pattern: GemmPattern, config: GemmConfig, target: CpuTarget) -> None:
        check_config(config, target, tiled(pattern, target))

    def resolve(self, pattern: GemmPattern, config: GemmConfig, target: CpuTarget
                ) -> ResolvedGemm:
        return resolve(pattern, config, target)

    def emit(self, resolved: ResolvedGemm, name: str) -> Kernel:
        return emit(resolved, name)

    # What dynamic-shape tuning (tune.dynamic) asks of a template besides the protocol.
    def sizes(self, pattern: GemmPattern) -> list:
        """The extents of the problem's axes, as expressions."""
        return [as_expr(e) for r in ROLES for e in role_extents(pattern)[r]]

    def sized_config(self, pattern: GemmPattern, config: GemmConfig, target: CpuTarget,
                     env) -> GemmConfig:
        return sized_config(pattern, config, target, env)

    def work(self, resolved: ResolvedGemm, env) -> Work:
        return work(resolved, env)

    def features(self, resolved: ResolvedGemm, target: CpuTarget) -> dict[str, float]:
        return features(resolved, target)

    def layout_key(self, resolved: ResolvedGemm):
        """What the layout of constant operands depends on: variants of one kernel share it."""
        if resolved.panels is None:
            return None
        return "tiles" if resolved.tiled else resolved.cfg.micro_n

    def workload(self, pattern: GemmPattern) -> str:
        return gemm_workload(pattern)

    # What schedule construction asks of a template (schedule.template.Constructible).
    def tiling_problem(self, pattern: GemmPattern, target: CpuTarget) -> TilingProblem:
        return gemm_problem(pattern, target)

    def constructed_config(self, state: State) -> GemmConfig:
        return gemm_config(state)

    def predicted_seconds(self, resolved: ResolvedGemm, memory: MemoryHierarchy,
                          env: Mapping[Var, int] | None = None) -> float:
        return gemm_seconds(resolved, memory, env)


GEMM = GemmTemplate()


def gemm_workload(pattern: GemmPattern) -> str:
    """The schedule-independent GEMM, the workload text of every template of the GEMM
    pattern: the operands' dtypes and shapes, the roles of the axes, the factors and the
    epilogue, every name replaced by its order of first appearance."""
    c = pattern.compute
    used = {n.buffer for e in _sources(pattern) for n in walk(e) if isinstance(n, Load)}
    operands = [b for b in pattern.inputs if b is not None and b in used]
    out = pattern.output.buffer
    text = "\n".join([
        f"inputs: {'; '.join(f'{b.name}: {format_buffer_type(b)}' for b in operands)}",
        f"output: {out.name}: {format_buffer_type(out)}",
        f"batch: {_names(pattern.batch_axes)}", f"m: {_names(pattern.m_axes)}",
        f"n: {_names(pattern.n_axes)}", f"axes: {_names(c.axes)}",
        f"k: {_names(c.reduce_axes)} in {', '.join(map(format_expr, c.reduce_extents))}",
        f"left: {format_expr(pattern.left)}", f"right: {format_expr(pattern.right)}",
        f"epilogue: {format_expr(pattern.epilogue.value) if pattern.epilogue else '-'}"])
    names = [b.name for b in operands] + [out.name, c.buffer.name]
    names += [v.name for v in c.axes + c.reduce_axes]
    if pattern.epilogue is not None:  # its own axes, numbered afresh by every compile
        names += [v.name for v in pattern.epilogue.axes]
    names += sorted(v.name for b in operands for d in b.shape for v in free_vars(d))
    return canonical_names(text, names)


def schedule_gemm(name: str, inputs: Sequence[Buffer | None], pattern: GemmPattern,
                  cfg: GemmConfig = GemmConfig(),
                  checks: Sequence[tuple[Expr, str]] = ()) -> Kernel:
    """The GEMM kernel for ``pattern`` with ``cfg`` on this machine, in one call (tests,
    examples); ``checks`` are run-time conditions the kernel asserts before any work."""
    pattern = replace(pattern, inputs=tuple(inputs), checks=tuple(checks))
    return emit(resolve(pattern, cfg, host()), name)


def _swapped(pattern: GemmPattern) -> GemmPattern:
    """The same product with the factors' roles exchanged: a 1 x 1 convolution to 3
    channels is 3 columns of pixels wide, and 3 rows by pixels the other way round. (A
    product without columns, as a depthwise convolution is, and a sliding convolution to
    a few channels stay windows; a matrix times a few columns stays dot products, see
    _rows_of_k.)"""
    return replace(pattern, left=pattern.right, right=pattern.left, m_axes=pattern.n_axes,
                   n_axes=pattern.m_axes)


def _rows_of_k(pattern: GemmPattern) -> bool:
    """Whether the left factor is a matrix whose rows run along K: the rule-based loops
    then take each of a narrow product's results as a dot product of two contiguous rows,
    where the swapped GEMM would pack (transpose) all of it as its right factor (16384 x 4
    x 1024: 8 ms against 27)."""
    return plain_left(pattern) and bool(left_value(pattern).indices) \
        and left_value(pattern).indices[-1] in pattern.compute.reduce_axes


def _wide_enough(pattern: GemmPattern) -> bool:
    c = pattern.compute
    columns = 1
    for axis in pattern.n_axes:
        dim = normalize_dim(c.shape[c.axes.index(axis)])
        if not isinstance(dim, int):
            return True
        columns *= dim
    return columns >= MIN_GEMM_COLUMNS


def _sources(pattern: GemmPattern):
    yield pattern.left
    yield pattern.right
    if pattern.epilogue is not None:
        yield pattern.epilogue.value


def _names(axes) -> str:
    return "(" + ", ".join(v.name for v in axes) + ")"
