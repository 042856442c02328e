"""From a graph to an executable: the driver.

    optimize the graph (folding constants with this driver as the runner)
    -> a strategy plans the kernels (``graph.kernel_plan.STRATEGIES``: greedy fusion, or
       Korch's orchestration, which this module registers) and has them built here:
       each plan's anchor gets its kernel from the kernel layer (``tune.kernel``), its
       prologues and epilogues are fused in (``schedule.fusion``), plans whose kernels
       come out identical (the same schedule on the same shapes, as in repeated layers)
       share one, and every kernel is built through the one build path
       (``runtime.build``) into the target's executable.

Operators that only reinterpret their input's memory (reshape and friends) become views.
A Loop counted at run time (``graph.ops.loop``) becomes a host step: its body is compiled
here as a model of its own, on the same target, and the step calls it per iteration.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from treadle.dump import dump_folder, dump_text
from treadle.graph.graph import Graph
from treadle.graph.kernel_plan import STRATEGIES, KernelPlan, build_plans
from treadle.graph.operator import Operator
from treadle.graph.ops.loop import HostLoop, LoopBody
from treadle.graph.optimize import optimize
from treadle.graph.partition import ON_HOST, format_partition
from treadle.graph.tensor import Tensor
from treadle.ir.stmt import Function
from treadle.orchestrate import orchestrated
from treadle.runtime.build import build, executable
from treadle.runtime.executor import Executable, HostFunction, Slot, Step
from treadle.schedule.fusion import FusedKernel, schedule_plan
from treadle.target import Target
from treadle.target.cpu import host
from treadle.tune.dynamic import SizeRange
from treadle.tune.kernel import KernelMaker


def _orchestrated(graph: Graph, builder: _Builder) -> Executable:
    """Korch's orchestration, which builds and times every kernel it considers; a graph
    with a step run on the host (a Loop), which is no kernel, keeps greedy fusion."""
    if any(op.op_type in ON_HOST for op in graph.nodes):
        return STRATEGIES["greedy"](graph, builder)
    return orchestrated(graph, builder)


STRATEGIES["orchestrate"] = _orchestrated


def compile_graph(graph: Graph, optimize_graph: bool = True, tune: int | str = 0,
                  strategy: str = "greedy",
                  dynamic: Mapping[str, SizeRange] | None = None,
                  target: Target | None = None) -> Executable:
    """``tune``: the tuning level of template configs (``tune.choice.LEVELS``);
    ``strategy``: how the kernels are planned (``graph.kernel_plan.STRATEGIES``);
    ``dynamic``: ranges of symbols, over which the kernels that depend on them get
    DietCode's variants (``tune.dynamic``); ``target``: the host CPU by default, or a GPU
    (``target.cuda``). Under TREADLE_DUMP, everything is dumped into a folder of this
    compile's own."""
    target = target or host()
    builder = _Builder(KernelMaker(target, tune, dict(dynamic or {})))
    with dump_folder(graph.name):
        if optimize_graph:
            graph = optimize(graph, target.kind, run=run_constants)
        return build_plans(graph, strategy, builder)


def run_constants(graph: Graph) -> list[np.ndarray]:
    """The outputs of a graph of constants, which folding asks for."""
    return compile_graph(graph, optimize_graph=False)()


@dataclass(frozen=True)
class PlannedStep:
    """A step before its kernel is built: the kernel's function (None for a view, which
    copies or aliases, and for a host step, which runs ``host``), the slots of its
    arguments (workspaces as -1, -2, ...), of the tensors it writes, and its workspaces."""
    name: str
    function: Function | None
    args: tuple[int, ...]
    outputs: tuple[int, ...]
    workspaces: tuple[Slot, ...] = ()
    host: HostFunction | None = None


@dataclass(frozen=True)
class _Builder:
    """What a strategy is given (``graph.kernel_plan.Builder``)."""
    maker: KernelMaker

    def executable(self, graph: Graph, plans: Sequence[KernelPlan]) -> Executable:
        dump_text(("graph", "partition.txt"), format_partition(plans))
        self.maker.tune_dynamic([(p.anchor, _kernel_name(k, p)) for k, p in enumerate(plans)
                                 if not (p.is_view or p.on_host)])
        slots = _Slots(graph)
        steps = _planned_steps(plans, slots, self.maker)
        # Constants only read through a layout of their own (weights packed into panels)
        # are dropped, so a model keeps one copy of its weights.
        read = {a for step in steps for a in step.args} | {slots[t] for t in graph.outputs}
        constants = {slot: data for slot, data in slots.constants.items() if slot in read}
        functions = list({s.function.name: s.function for s in steps if s.function}.values())
        kernels = build(functions, self.maker.target, graph.name)
        built = [Step(s.name, s.function and kernels[s.function.name], s.args, s.outputs,
                      s.workspaces, s.host) for s in steps]
        result = executable(self.maker.target, slots.slots, [slots[t] for t in graph.inputs],
                            [slots[t] for t in graph.outputs], constants, built)
        unordered = result.reads_before_writes()
        if unordered:  # a fault of the kernel plan; running would read stale memory
            raise AssertionError(f"steps read tensors before they are written: {unordered}")
        return result


def _planned_steps(plans: Sequence[KernelPlan], slots: "_Slots", maker: KernelMaker
                   ) -> list[PlannedStep]:
    """A step per view and per fused kernel; kernels that come out identical (the same
    schedule on the same shapes, as in repeated layers) share one function."""
    unique: dict[Function, Function] = {}
    steps: list[PlannedStep] = []
    for index, plan in enumerate(plans):
        if plan.is_view:
            steps.append(PlannedStep(plan.name, None, (slots[plan.anchor.inputs[0]],),
                                     (slots[plan.anchor.outputs[0]],)))
            continue
        if plan.on_host:
            op = plan.anchor
            steps.append(PlannedStep(plan.name, None, tuple(slots[t] for t in op.inputs),
                                     tuple(slots[t] for t in op.outputs),
                                     host=_host_loop(op, maker)))
            continue
        for kernel in schedule_plan(plan, _kernel_name(index, plan), maker):
            steps.append(_kernel_step(plan.name, kernel, slots, unique))
    return steps


def _host_loop(op: Operator, maker: KernelMaker) -> HostLoop:
    """A Loop's step: its body compiled as a model of its own, for the same target."""
    body: LoopBody = op.attrs["body"]
    compiled = compile_graph(body.graph, tune=maker.tune, dynamic=maker.dynamic,
                             target=maker.target)
    first = 1 + body.states  # the body's first scanned output

    def empty(arrays: list[np.ndarray]) -> list[np.ndarray]:
        shapes = compiled.output_shapes(*arrays)[first:]
        return [np.empty((0, *shape), compiled.slots[slot].dtype.numpy)
                for shape, slot in zip(shapes, compiled.outputs[first:])]
    return HostLoop(lambda arrays: compiled(*arrays), empty, body.states)


def _kernel_name(index: int, plan: KernelPlan) -> str:
    return f"k{index}_{plan.anchor.op_type}"


class _Slots:
    """A slot per tensor of the graph, and per constant a schedule laid out anew."""

    def __init__(self, graph: Graph):
        # Tensors are held, so that no later tensor takes the id of one that is gone.
        self.tensors = list(graph.tensors)
        self.index = {id(t): k for k, t in enumerate(self.tensors)}
        self.slots = [_slot(t) for t in self.tensors]
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


def _slot(tensor: Tensor) -> Slot:
    """The tensor's slot, which holds a size where its operator finds one in the data."""
    op = tensor.producer
    found = [d for d in op.data_sizes if op.outputs[d.output] is tensor] if op else []
    if found:
        return Slot(tensor.name, tensor.dtype, tensor.shape, found[0].symbol, found[0].bound)
    return Slot(tensor.name, tensor.dtype, tensor.shape)


def _kernel_step(name: str, kernel: FusedKernel, slots: _Slots, unique: dict[Function, Function]
                 ) -> PlannedStep:
    function = unique.setdefault(replace(kernel.function, name=""), kernel.function)
    inputs = tuple(slots[t] for t in kernel.inputs)
    outputs = tuple(slots[t] for t in kernel.outputs)
    args = inputs + outputs + tuple(-k - 1 for k in range(len(kernel.workspaces)))
    workspaces = tuple(Slot(w.name, w.dtype, w.shape) for w in kernel.workspaces)
    return PlannedStep(name, function, args, outputs, workspaces)
