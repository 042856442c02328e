"""From a graph to an executable: plan the kernels, choose configs and schedule, fuse, build
the kernels, plan steps.

Operators that only reinterpret their input's memory (reshape and friends) become views.
The others are planned into kernels by a strategy (``graph.kernel_plan``); each plan's
anchor gets its template (``schedule.operator``) and the config tuning chooses
(``treadle.tune``), and its prologues and epilogues are fused into the program
(``schedule.fusion``); plans whose kernels come out identical (the same schedule on the
same shapes, as in repeated layers) share one. Kernels are built in a few shared objects
in parallel, since one C file per kernel would pay the compiler's start-up cost hundreds
of times and one file for all would use a single core.
"""
from __future__ import annotations

import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np

from treadle.backend.build import build_many, object_groups
from treadle.backend.cpu import generate
from treadle.backend.cuda import build_cuda
from treadle.config import config, usable_cores
from treadle.dump import dump_folder, dump_text
from treadle.errors import KernelError
from treadle.graph.graph import Graph
from treadle.graph.kernel_plan import KernelPlan, greedy, plan_kernels
from treadle.graph.operator import Operator
from treadle.graph.optimize import optimize
from treadle.graph.partition import format_partition
from treadle.graph.tensor import Tensor
from treadle.ir.lower import lower
from treadle.ir.stmt import Function
from treadle.runtime.cuda_executor import CudaExecutable, CudaLaunches
from treadle.runtime.executor import Executable, Slot, Step
from treadle.runtime.module import CompiledFunction, exported_symbols, load
from treadle.runtime.step_runner import library_path
from treadle.schedule.dispatch import dispatching_kernel
from treadle.schedule.fusion import FusedKernel, schedule_plan
from treadle.schedule.launches import launches
from treadle.schedule.operator import select_template
from treadle.schedule.rules import Kernel
from treadle.schedule.template import Template
from treadle.target.cpu import CpuTarget, host
from treadle.target.cuda import CudaTarget
from treadle.timing import interleaved_medians
from treadle.tune import Choice, choose
from treadle.tune.dynamic import (DynamicChoice, SizeRange, Tree, choose_dynamic,
                                  choose_dynamic_many, dynamic_symbols)

log = logging.getLogger(__name__)

FUNCTIONS_PER_OBJECT = 24


@dataclass(frozen=True)
class PlannedStep:
    """A step before its kernel is built: the kernel's function (None for a view, which
    copies or aliases), the slots of its arguments (workspaces as -1, -2, ...), of the
    tensors it writes, and its workspaces."""
    name: str
    function: Function | None
    args: tuple[int, ...]
    outputs: tuple[int, ...]
    workspaces: tuple[Slot, ...] = ()


def compile_graph(graph: Graph, optimize_graph: bool = True, tune: int | str = 0,
                  strategy: str = "greedy",
                  dynamic: Mapping[str, SizeRange] | None = None,
                  target: CpuTarget | CudaTarget | None = None) -> Executable:
    """``tune``: the tuning level of template configs (``tune.exhaustive.LEVELS``);
    ``strategy``: how the kernels are chosen (``graph.kernel_plan.STRATEGIES``);
    ``dynamic``: ranges of symbols, over which the kernels that depend on them are tuned
    (``tune.dynamic``); ``target``: the host CPU by default, or a GPU (``target.cuda``:
    the level-0 configs and greedy fusion, no tuning, dynamic ranges or orchestration
    yet). Under TREADLE_DUMP, everything is dumped into a folder of this compile's own."""
    target = target or host()
    if target.kind == "cuda" and (tune != 0 or dynamic or strategy != "greedy"):
        raise ValueError(f"tune={tune!r}, dynamic={dynamic!r}, kernels by {strategy}: CUDA "
                         "kernels take their level-0 configs and the default fusion for now; "
                         "compile with tune=0, no dynamic ranges and no orchestration")
    with dump_folder(graph.name):
        return _compile_graph(graph, optimize_graph, tune, strategy, dynamic or {}, target)


def _compile_graph(graph: Graph, optimize_graph: bool, tune: int | str, strategy: str,
                   dynamic: Mapping[str, SizeRange], target: CpuTarget | CudaTarget
                   ) -> Executable:
    if optimize_graph:
        graph = optimize(graph, target.kind)
    planned, plans = plan_kernels(graph, strategy, tune)
    executable = _executable(planned, plans, tune, dynamic, target)
    static_shapes = all(isinstance(d, int) for t in graph.inputs for d in t.shape)
    if planned is not graph and static_shapes:  # kernels chosen over the model's own fusion
        with dump_folder("greedy fusion"):
            own = _executable(graph, greedy(graph), tune, dynamic, target)
        executable = _faster_in_context(executable, own, graph)
    return executable


def _executable(graph: Graph, plans: Sequence[KernelPlan], tune: int | str,
                dynamic: Mapping[str, SizeRange], target: CpuTarget | CudaTarget
                ) -> Executable:
    slots = _Slots(graph)
    dump_text(("graph", "partition.txt"), format_partition(plans))
    if dynamic:
        _tune_dynamic(plans, tune, dynamic, target)
    unique: dict[Function, Function] = {}
    steps: list[PlannedStep] = []
    for index, plan in enumerate(plans):
        if plan.is_view:
            steps.append(PlannedStep(plan.name, None, (slots[plan.anchor.inputs[0]],),
                                     (slots[plan.anchor.outputs[0]],)))
            continue
        kernels = schedule_plan(plan, _kernel_name(index, plan),
                                lambda op, name: tuned_kernel(op, name, tune, target, dynamic))
        steps += [_kernel_step(plan.name, kernel, slots, unique) for kernel in kernels]

    # Constants only read through a layout of their own (weights packed into panels) are
    # dropped, so a model keeps one copy of its weights.
    read = {a for step in steps for a in step.args} | {slots[t] for t in graph.outputs}
    constants = {slot: data for slot, data in slots.constants.items() if slot in read}
    build = build_cuda_functions if target.kind == "cuda" else build_functions
    kernels = build(list(unique.values()), graph.name, target)
    built = [Step(s.name, None if s.function is None else kernels[s.function.name], s.args,
                  s.outputs, s.workspaces) for s in steps]
    io = (slots.slots, [slots[t] for t in graph.inputs], [slots[t] for t in graph.outputs],
          constants, built)
    executable = (CudaExecutable(*io, target.arch) if target.kind == "cuda"
                  else Executable(*io, library_path()))
    unordered = executable.reads_before_writes()
    if unordered:  # a fault of the kernel plan; running would read stale memory
        raise AssertionError(f"steps read tensors before they are written: {unordered}")
    return executable


# Calls of each model timed, interleaved, before choosing orchestrated kernels over greedy
# fusion: their costs measured alone overstate what fusing saves between the model's
# other kernels (Segformer-B0 ran 5% slower on a predicted 15% gain).
CONTEXT_CALLS = 10


def _faster_in_context(chosen: Executable, own: Executable, graph: Graph) -> Executable:
    """``chosen`` where it runs faster than ``own`` on random inputs of ``graph``'s
    constant shapes, else ``own``; ``chosen`` where the inputs fail a check of the
    model's."""
    from treadle.checker import random_input  # the checker compiles through this module
    rng = np.random.default_rng(0)
    inputs = [random_input(rng, t.dtype.numpy, t.shape) for t in graph.inputs]
    try:
        seconds = interleaved_medians({"chosen": lambda: chosen(*inputs),
                                       "own": lambda: own(*inputs)}, CONTEXT_CALLS, idle=0.0)
    except KernelError as err:  # a check the made-up inputs fail (an index out of range)
        log.info("orchestrated kernels kept untimed: %s", err)
        return chosen
    keep = seconds["chosen"] < seconds["own"]
    report = (f"orchestrated {seconds['chosen'] * 1e3:.3f} ms, greedy fusion "
              f"{seconds['own'] * 1e3:.3f} ms a call in the model: keeping "
              f"{'orchestrated kernels' if keep else 'greedy fusion'}")
    log.info(report)
    dump_text(("orchestrate", "in_context.txt"), report)
    return chosen if keep else own


def _tune_dynamic(plans: Sequence[KernelPlan], tune: int | str,
                  dynamic: Mapping[str, SizeRange], target: CpuTarget) -> None:
    """Tunes the anchors whose sizes hold a declared symbol all at once (two rounds of
    measuring for the model, not two per kernel); ``tuned_kernel`` then finds their
    records."""
    anchors = []
    for index, plan in enumerate(plans):
        if not plan.is_view:
            template, pattern = select_template(plan.anchor, target)
            if dynamic_symbols(template, pattern, dynamic):
                anchors.append((template, pattern, _kernel_name(index, plan)))
    if anchors:
        choose_dynamic_many(anchors, dynamic, _dynamic_level(tune), target)


def _kernel_name(index: int, plan: KernelPlan) -> str:
    return f"k{index}_{plan.anchor.op_type}"


def _dynamic_level(tune: int | str) -> int:
    """Dynamic tuning measures: it runs at level 1 at least."""
    return tune if isinstance(tune, int) and tune > 1 else 1


class _Slots:
    """A slot per tensor of the graph, and per constant a schedule laid out anew."""

    def __init__(self, graph: Graph):
        # Tensors are held, so that no later tensor takes the id of one that is gone.
        self.tensors = list(graph.tensors)
        self.index = {id(t): k for k, t in enumerate(self.tensors)}
        self.slots = [Slot(t.name, t.dtype, t.shape) for t in self.tensors]
        self.constants = {self.index[id(t)]: t.data for t in self.tensors if t.is_constant}

    def __getitem__(self, tensor: Tensor) -> int:
        if id(tensor) not in self.index:
            if not tensor.is_constant:
                raise KeyError(f"tensor {tensor.name!r} is not in the graph")
            # A constant the schedule laid out anew.
            self.tensors.append(tensor)
            self.index[id(tensor)] = len(self.slots)
            self.slots.append(Slot(tensor.name, tensor.dtype, tensor.shape))
            self.constants[self.index[id(tensor)]] = tensor.data
        return self.index[id(tensor)]


def _kernel_step(name: str, kernel: FusedKernel, slots: _Slots, unique: dict[Function, Function]
                 ) -> PlannedStep:
    """The step of a fused kernel; kernels that come out identical (the same schedule on
    the same shapes, as in repeated layers) share one function."""
    function = unique.setdefault(replace(kernel.function, name=""), kernel.function)
    inputs = tuple(slots[t] for t in kernel.inputs)
    outputs = tuple(slots[t] for t in kernel.outputs)
    args = inputs + outputs + tuple(-k - 1 for k in range(len(kernel.workspaces)))
    workspaces = tuple(Slot(w.name, w.dtype, w.shape) for w in kernel.workspaces)
    return PlannedStep(name, function, args, outputs, workspaces)


def tuned_kernel(op: Operator, name: str, tune: int | str = 0,
                 target: CpuTarget | None = None,
                 dynamic: Mapping[str, SizeRange] | None = None) -> Kernel:
    """``op``'s kernel: its template, the config tuning chooses at level ``tune``, the
    program generated from it; where its sizes hold symbols of ``dynamic``, variants
    tuned over their ranges and the tree dispatching them (at least level 1). Under
    TREADLE_DUMP, ``<name>/schedule.txt`` says which."""
    target = target or host()
    template, pattern = select_template(op, target)
    if dynamic and dynamic_symbols(template, pattern, dynamic):
        variants = choose_dynamic(template, pattern, name, dynamic, _dynamic_level(tune),
                                  target)
        dump_text((name, "schedule.txt"), format_variants(op, variants))
        key = (template.workload(pattern), str(target), config.num_threads,
               getattr(pattern, "checks", ()), variants.configs,
               tuple(r.config for r in variants.resolved), variants.tree)
        return _named(_dispatched(_Variants(key, template, variants)), name)
    choice = choose(template, pattern, name, tune, target)
    dump_text((name, "schedule.txt"), format_choice(op, choice))
    return template.emit(choice.resolved, name)


@dataclass(frozen=True)
class _Variants:
    """A dynamic choice, equal to another where they emit the same program: repeated
    layers tune to the same variants of equal workloads, whose patterns differ only in
    the names of their axes (and a failing check names its own node)."""
    key: tuple
    template: Template = field(compare=False)
    choice: DynamicChoice = field(compare=False)


@functools.lru_cache(maxsize=256)
def _dispatched(variants: _Variants) -> Kernel:
    """The variants' kernel with the tree in front, emitted once for every layer that
    tunes to them (a dispatching kernel holds several programs)."""
    choice = variants.choice
    kernels = [variants.template.emit(r, "dispatched") for r in choice.resolved]
    if len(kernels) == 1:
        return kernels[0]
    return dispatching_kernel(kernels, choice.tree.nodes, choice.tree.symbols, "dispatched")


def _named(kernel: Kernel, name: str) -> Kernel:
    apart = None if kernel.apart is None else _named(kernel.apart, name)
    return replace(kernel, function=replace(kernel.function, name=name), apart=apart)


def format_choice(op: Operator, choice: Choice) -> str:
    lines = [f"operator: {op.name} ({op.op_type})", f"template: {choice.template.name}"]
    if choice.config is not None:
        lines += [f"config: {choice.config}", f"resolved: {choice.resolved.config}"]
    lines.append(f"source: {choice.source}")
    return "\n".join(lines)


def format_variants(op: Operator, choice: DynamicChoice) -> str:
    lines = [f"operator: {op.name} ({op.op_type})", f"template: {choice.template.name}",
             f"source: {choice.source}"]
    lines += [f"variant {k}: {c} -> {r.config}"
              for k, (c, r) in enumerate(zip(choice.configs, choice.resolved))]
    lines.append("dispatch:")
    lines += _tree_lines(choice.tree, 0, "  ")
    return "\n".join(lines)


def _tree_lines(tree: Tree, k: int, indent: str) -> list[str]:
    feature, value, left, right = tree.nodes[k]
    if feature < 0:
        return [f"{indent}variant {value}"]
    symbol = tree.symbols[feature]
    return ([f"{indent}if {symbol} <= {value}:"] + _tree_lines(tree, left, indent + "  ")
            + [f"{indent}else:  # {symbol} > {value}"] + _tree_lines(tree, right, indent + "  "))


def build_functions(functions: Sequence[Function], name: str, target: CpuTarget | None = None
                    ) -> dict[str, CompiledFunction]:
    """Lowers and builds functions in several shared objects at once, each group lowered
    while the groups before it compile."""
    groups = object_groups(functions, FUNCTIONS_PER_OBJECT)
    lowered: list[list[Function]] = []

    def items():
        for k, group in enumerate(groups):
            lowered.append([lower(f, target) for f in group])
            source = generate(lowered[-1])
            dump_text((f"kernels_{k}.c",), source)
            yield source, f"{name}_{k}", exported_symbols(lowered[-1])
    paths = build_many(items())
    compiled: dict[str, CompiledFunction] = {}
    for path, group in zip(paths, lowered):
        compiled.update(load(path, group).functions)
    return compiled


def build_cuda_functions(functions: Sequence[Function], name: str, target: CudaTarget
                         ) -> dict[str, CudaLaunches]:
    """Each function as its CUDA launches (``schedule.launches``), lowered and built in a
    few cubins at once."""
    launched = {f.name: [lower(k, target) for k in launches(f)] for f in functions}
    names = list(launched)
    groups = object_groups(names, FUNCTIONS_PER_OBJECT)
    with ThreadPoolExecutor(max_workers=usable_cores()) as pool:
        binaries = list(pool.map(
            lambda item: build_cuda([k for n in item[1] for k in launched[n]], target,
                                    f"{name}_{item[0]}"), enumerate(groups)))
    by_function = {f.name: f for f in functions}
    return {n: CudaLaunches(by_function[n], tuple(launched[n]), binary.cubin, target.arch)
            for group, binary in zip(groups, binaries) for n in group}
