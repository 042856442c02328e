"""From a graph to an executable: partition, schedule and fuse, build the kernels, plan steps.

Operators that only reinterpret their input's memory (reshape and friends) become views.
The others are partitioned into groups (``graph.partition``), each scheduled into one kernel
with its prologues and epilogues fused (``schedule.fusion``); groups whose kernels come out
identical (the same schedule on the same shapes, as in repeated layers) share one. Kernels
are built in a few shared objects in parallel, since one C file per kernel would pay the
compiler's start-up cost hundreds of times and one file for all would use a single core.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from treadle.backend.build import build_many
from treadle.backend.c import generate
from treadle.dump import dump_folder, dump_text
from treadle.graph.graph import Graph
from treadle.graph.partition import format_partition, partition
from treadle.graph.optimize import optimize
from treadle.ir.lower import lower
from treadle.ir.stmt import Function
from treadle.runtime.dispatch import library_path
from treadle.runtime.executor import Executable, Slot, Step
from treadle.runtime.module import CompiledFunction, exported_symbols, load
from treadle.schedule.fusion import schedule_group

FUNCTIONS_PER_OBJECT = 24


def compile_graph(graph: Graph, optimize_graph: bool = True, tune: int = 0) -> Executable:
    """``tune``: the tuning level of template schedules (0 analytic, 1 small, 2 full).
    Under TREADLE_DUMP, everything is dumped into a folder of this compile's own."""
    with dump_folder(graph.name):
        return _compile_graph(graph, optimize_graph, tune)


def _compile_graph(graph: Graph, optimize_graph: bool, tune: int) -> Executable:
    if optimize_graph:
        graph = optimize(graph)
    tensors = list(graph.tensors)
    slot_of = {id(t): k for k, t in enumerate(tensors)}
    slots = [Slot(t.name, t.dtype, t.shape) for t in tensors]
    constants = {slot_of[id(t)]: t.data for t in tensors if t.is_constant}

    unique: dict[Function, Function] = {}
    plans = []
    groups = partition(graph)
    dump_text(("graph", "partition.txt"), format_partition(groups))
    for index, group in enumerate(groups):
        if group.is_view:
            op = group.anchor
            plans.append((op.name, None, (slot_of[id(op.inputs[0])],),
                          (slot_of[id(op.outputs[0])],), ()))
            continue
        for kernel in schedule_group(group, f"k{index}_{group.anchor.op_type}", tune):
            for t in kernel.inputs:  # a constant the schedule laid out anew
                if id(t) not in slot_of:
                    tensors.append(t)  # held, so that no later tensor takes its id
                    slot_of[id(t)] = len(slots)
                    slots.append(Slot(t.name, t.dtype, t.shape))
                    constants[slot_of[id(t)]] = t.data
            key = replace(kernel.function, name="")
            function = unique.setdefault(key, kernel.function)
            outputs = tuple(slot_of[id(t)] for t in kernel.outputs)
            args = tuple(slot_of[id(t)] for t in kernel.inputs) + outputs
            args += tuple(-k - 1 for k in range(len(kernel.workspaces)))
            workspaces = tuple(Slot(w.name, w.dtype, w.shape) for w in kernel.workspaces)
            plans.append((group.name, function.name, args, outputs, workspaces))

    # Constants only read through a layout of their own (weights packed into panels) are
    # dropped, so a model keeps one copy of its weights.
    read = {a for _, _, args, _, _ in plans for a in args} | {slot_of[id(t)] for t in graph.outputs}
    constants = {slot: data for slot, data in constants.items() if slot in read}
    kernels = build_functions(list(unique.values()), graph.name)
    steps = [Step(name, None if fn is None else kernels[fn], args, outs, ws)
             for name, fn, args, outs, ws in plans]
    executable = Executable(slots, [slot_of[id(t)] for t in graph.inputs],
                            [slot_of[id(t)] for t in graph.outputs], constants, steps,
                            library_path())
    unordered = executable.reads_before_writes()
    if unordered:  # a fault of the partition; running would read stale memory
        raise AssertionError(f"steps read tensors before they are written: {unordered}")
    return executable


def build_functions(functions: Sequence[Function], name: str) -> dict[str, CompiledFunction]:
    """Lowers and builds functions in several shared objects at once."""
    lowered = [lower(f) for f in functions]
    groups = [lowered[k:k + FUNCTIONS_PER_OBJECT]
              for k in range(0, len(lowered), FUNCTIONS_PER_OBJECT)]
    sources = [generate(group) for group in groups]
    for k, source in enumerate(sources):
        dump_text((f"kernels_{k}.c",), source)
    paths = build_many([(source, f"{name}_{k}", exported_symbols(group))
                        for k, (source, group) in enumerate(zip(sources, groups))])
    compiled: dict[str, CompiledFunction] = {}
    for path, group in zip(paths, groups):
        compiled.update(load(path, group).functions)
    return compiled
