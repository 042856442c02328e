"""The primitive graph and the kernels treadle can build from a set of its primitives.

After fission (``graph.passes.fission``) every operator is a primitive of one of Korch's
categories: ``linear`` (scheduled by a template of its own: the GEMM, window, Winograd
kernels), ``reduce``, ``layout`` (views and data movement) or ``elementwise``. A set of
primitives runs as one kernel when treadle can build it:

* with one linear primitive, as that anchor with the injective primitives it reads from
  inlined at its loads (prologues) and those reading its result element for element
  applied at its stores (epilogues), the post-scheduling fusion of ``schedule.fusion``;
  a prologue's tensor is never written by the kernel;
* without one, as one operator whose definition is the members' computes joined
  together (``Composite``), which the rule-based schedule turns into loops over rows
  with every reduction, workspace and output it needs: a whole softmax or layer norm, or
  a reduction with the element-wise work on both sides of it;
* a view alone costs nothing; ``CheckIndices`` runs alone.

Such a kernel writes ``writes`` tensors: every member's result read outside it or
returned by the graph, or, to let another kernel recompute a value rather than read it,
only the results no member reads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from treadle.errors import TreadleError
from treadle.graph.graph import Graph
from treadle.graph.kernel_plan import KernelPlan
from treadle.graph.operator import Operator, register
from treadle.graph.partition import (CHECKING, MATERIALISED, is_injective, is_view,
                                     padding_of, reads_one_to_one)
from treadle.graph.tensor import Tensor
from treadle.ir.compute import Compute, reachable, retarget
from treadle.ir.expr import Buffer, Const
from treadle.orchestrate.states import bits
from treadle.schedule.operator import select_template
from treadle.target.cpu import CpuTarget

# Data movement without arithmetic, for the dumps (a view is layout too).
LAYOUT = frozenset({"Transpose", "Concat", "Split", "Slice", "Pad", "Expand", "Tile",
                    "Gather", "DepthToSpace", "SpaceToDepth"})


@register("Composite", internal=True)
def _composite(ctx):
    raise ctx.unsupported("a composite kernel is made by the orchestrator, not applied")


@dataclass
class PrimitiveGraph:
    """The primitives of ``graph`` in its topological order, each with the set (a bitmask)
    of primitives it reads from and its category, and the readers of each tensor."""
    graph: Graph
    ops: list[Operator]
    producers: list[int]
    categories: list[str]
    readers: dict[int, list[int]]  # by tensor id

    @staticmethod
    def of(graph: Graph, target: CpuTarget) -> "PrimitiveGraph":
        ops = list(graph.nodes)
        index = {id(op): k for k, op in enumerate(ops)}
        producers = [sum({1 << index[id(t.producer)] for t in op.inputs
                          if t is not None and t.producer is not None
                          and id(t.producer) in index}) for op in ops]
        readers: dict[int, list[int]] = {}
        for k, op in enumerate(ops):
            for t in {id(t) for t in op.inputs if t is not None}:
                readers.setdefault(t, []).append(k)
        return PrimitiveGraph(graph, ops, producers, [category(op, target) for op in ops],
                              readers)

    def consumers(self, tensor: Tensor) -> list[int]:
        return self.readers.get(id(tensor), [])


def category(op: Operator, target: CpuTarget) -> str:
    if is_view(op) or op.op_type in LAYOUT:
        return "layout"
    template, _ = select_template(op, target)
    if template.name != "rules":
        return "linear"
    if any(c.is_reduction for c in reachable(op.definition).values()):
        return "reduce"
    return "elementwise"


def writes_of(pg: PrimitiveGraph, members: int, required: set[int], sinks_only: bool
              ) -> tuple[Tensor, ...]:
    """The results of ``members`` that the kernel writes: those read by primitives
    outside it or in ``required`` (tensor ids), or only those no member reads. A
    primitive alone writes all its results."""
    if members.bit_count() == 1:
        return tuple(pg.ops[members.bit_length() - 1].outputs)
    found = []
    for p in bits(members):
        for t in pg.ops[p].outputs:
            readers = pg.consumers(t)
            inside = any(members >> r & 1 for r in readers)
            outside = id(t) in required or any(not members >> r & 1 for r in readers)
            if outside and not (sinks_only and inside):
                found.append(t)
    return tuple(found)


class NotAKernel(TreadleError):
    """A set of primitives treadle cannot build as one kernel."""


def kernel_plan(pg: PrimitiveGraph, members: int, writes: Sequence[Tensor]) -> KernelPlan:
    """The plan building ``members`` as one kernel writing ``writes``; NotAKernel when
    none does (see the module's docstring)."""
    ops = [pg.ops[p] for p in bits(members)]
    anchors = [p for p in bits(members) if pg.categories[p] == "linear"]
    if len(ops) == 1:
        return KernelPlan(ops[0], outputs=tuple(ops[0].outputs))
    if any(op.op_type in CHECKING for op in ops):
        raise NotAKernel("a checking operator runs alone")
    if len(anchors) > 1:
        raise NotAKernel("two linear primitives")
    if anchors:
        return _anchored(pg, members, anchors[0], writes)
    return kernel_plan_of_composite(ops, writes)


def _anchored(pg: PrimitiveGraph, members: int, anchor: int, writes: Sequence[Tensor]
              ) -> KernelPlan:
    op = pg.ops[anchor]
    if len(op.outputs) != 1:
        raise NotAKernel(f"the anchor {op.name!r} has several results")
    above = _reaching(pg, members, anchor)
    prologues = [pg.ops[p] for p in bits(above)]
    for p in prologues:
        if is_view(p) or not is_injective(p) or p.op_type in MATERIALISED:
            raise NotAKernel(f"{p.name!r} cannot be inlined at the anchor's loads")
    produced = {id(op.outputs[0])}
    epilogues = []
    for p in bits(members & ~above & ~(1 << anchor)):
        e = pg.ops[p]
        if is_view(e) or padding_of(e) is not None:
            legal = id(e.inputs[0]) in produced
        else:
            legal = is_injective(e) and reads_one_to_one(e, produced)
        if not legal:
            raise NotAKernel(f"{e.name!r} cannot be applied at the anchor's stores")
        epilogues.append(e)
        if padding_of(e) is None:
            produced.add(id(e.outputs[0]))
    if any(id(t) not in produced for t in writes):
        raise NotAKernel("the kernel would write a tensor its stores do not give")
    return KernelPlan(op, tuple(prologues), tuple(epilogues), tuple(writes))


def _reaching(pg: PrimitiveGraph, members: int, target: int) -> int:
    """The members that ``target`` depends on."""
    found, frontier = 0, pg.producers[target] & members
    while frontier:
        found |= frontier
        grown = 0
        for p in bits(frontier):
            grown |= pg.producers[p] & members
        frontier = grown & ~found
    return found


def kernel_plan_of_composite(ops: Sequence[Operator], writes: Sequence[Tensor]) -> KernelPlan:
    """One operator computing ``writes`` from the definitions of ``ops`` (in topological
    order) joined: each load of a tensor a member computes reads that member's compute."""
    inside = {id(t) for op in ops for t in op.outputs}
    external: dict[int, Tensor] = {}
    for op in ops:
        for t in op.inputs:
            if t is not None and id(t) not in inside:
                external.setdefault(id(t), t)
    # A constant of one element (fission's epsilons) is its value: a literal the C
    # compiler folds, where a load through a pointer is computed at every element.
    scalars = {key: Const(t.data.reshape(-1)[0].item(), t.dtype) for key, t in external.items()
               if t.is_constant and t.data.size == 1}
    external = {key: t for key, t in external.items() if key not in scalars}
    buffers = {key: Buffer(f"in{k}", t.dtype, t.shape) for k, (key, t) in
               enumerate(external.items())}
    computes: dict[int, Compute] = {}  # a member's result -> its joined compute
    for op in ops:
        targets = {b: computes[id(t)].buffer if id(t) in computes
                   else scalars[id(t)] if id(t) in scalars else buffers[id(t)]
                   for b, t in zip(op.input_buffers, op.inputs)
                   if b is not None and t is not None}
        for t, c in zip(op.outputs, retarget(op.definition, targets)):
            computes[id(t)] = c
    name = f"{ops[-1].name}+{len(ops) - 1}"  # the last member, and how many come before
    composite = Operator("Composite", name, tuple(external.values()), {}, tuple(writes),
                         tuple(computes[id(t)] for t in writes), tuple(buffers.values()),
                         tuple(check for op in ops for check in op.checks))
    return KernelPlan(composite, outputs=tuple(writes))
