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
* with two linear primitives, only as attention (``attention_core``): Q Kᵀ, the
  element-wise logits, the softmax as fission leaves it and the product by V become one
  ``FusedAttention`` operator, scheduled by ``schedule.templates.attention_cpu`` with
  the scores kept in cache, and prologues and epilogues fused around it as around any
  anchor;
* a view alone costs nothing; ``CheckIndices`` runs alone.

Such a kernel writes ``writes`` tensors: every member's result read outside it or
returned by the graph, or, to let another kernel recompute a value rather than read it,
only the results no member reads.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

from treadle.errors import TreadleError
from treadle.graph.graph import Graph
from treadle.graph.kernel_plan import KernelPlan
from treadle.graph.operator import Operator
from treadle.graph.ops.orchestrated import AttentionParts
from treadle.graph.partition import (CHECKING, MATERIALISED, is_injective, is_view,
                                     padding_of, reads_one_to_one)
from treadle.graph.tensor import Tensor
from treadle.ir.compute import Compute, reachable, retarget
from treadle.ir.expr import Buffer, Const
from treadle.orchestrate.states import bits
from treadle.schedule.select import select_template, takes_as_its_own
from treadle.target import Target

# Data movement without arithmetic, for the dumps (a view is layout too).
LAYOUT = frozenset({"Transpose", "Concat", "Split", "Slice", "Pad", "Expand", "Tile",
                    "Gather", "DepthToSpace", "SpaceToDepth"})


@dataclass
class PrimitiveGraph:
    """The primitives of ``graph`` in its topological order, each with the set (a bitmask)
    of primitives it reads from and its category, and the readers of each tensor."""
    graph: Graph
    ops: list[Operator]
    producers: list[int]
    categories: list[str]
    readers: dict[int, list[int]]  # by tensor id
    index: dict[int, int]  # each primitive's position, by operator id
    graph_outputs: frozenset[int]  # by tensor id
    target: Target  # what its kernels are built for

    @staticmethod
    def of(graph: Graph, target: Target) -> "PrimitiveGraph":
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
                              readers, index, frozenset(id(t) for t in graph.outputs), target)

    def consumers(self, tensor: Tensor) -> list[int]:
        return self.readers.get(id(tensor), [])

    @functools.cached_property
    def attention_cores(self) -> list[int]:
        """Every attention that can be one kernel (``attention_core``), where the target has
        an attention template."""
        if not takes_as_its_own("FusedAttention", self.target):
            return []
        return [c for p in range(len(self.ops)) if (c := attention_core(self, p)) is not None]


def category(op: Operator, target: Target) -> str:
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
    if len(anchors) == 2:
        return _attention(pg, members, anchors[1], writes)
    if len(anchors) > 2:
        raise NotAKernel("more than two linear primitives")
    if anchors:
        op = pg.ops[anchors[0]]
        if len(op.outputs) != 1:
            raise NotAKernel(f"the anchor {op.name!r} has several results")
        return _anchored(pg, members, 1 << anchors[0], op, writes)
    return kernel_plan_of_composite(ops, writes)


def _anchored(pg: PrimitiveGraph, members: int, core: int, op: Operator,
              writes: Sequence[Tensor]) -> KernelPlan:
    """The plan of ``members`` around the anchor ``op``, which computes the primitives
    ``core``: those the core reads are prologues, those after it epilogues."""
    above = _reaching(pg, members, core)
    prologues = [pg.ops[p] for p in bits(above)]
    for p in prologues:
        # A view is index arithmetic at the loads, as any injective operator.
        inlined = len(p.definition) == 1 if is_view(p) else is_injective(p)
        if not inlined or p.op_type in MATERIALISED:
            raise NotAKernel(f"{p.name!r} cannot be inlined at the anchor's loads")
    produced = {id(op.outputs[0])}
    epilogues = []
    for p in bits(members & ~above & ~core):
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


def _reaching(pg: PrimitiveGraph, members: int, core: int) -> int:
    """The members outside ``core`` that it depends on."""
    found, frontier = 0, 0
    for p in bits(core):
        frontier |= pg.producers[p]
    frontier &= members & ~core
    while frontier:
        found |= frontier
        grown = 0
        for p in bits(frontier):
            grown |= pg.producers[p] & members
        frontier = grown & ~found & ~core
    return found


def kernel_plan_of_composite(ops: Sequence[Operator], writes: Sequence[Tensor]) -> KernelPlan:
    """One operator computing ``writes`` from the definitions of ``ops`` (in topological
    order) joined: each load of a tensor a member computes reads that member's compute."""
    external, buffers, computes = _joined(ops)
    name = f"{ops[-1].name}+{len(ops) - 1}"  # the last member, and how many come before
    composite = Operator("Composite", name, external, {}, tuple(writes),
                         tuple(computes[id(t)] for t in writes), buffers,
                         tuple(check for op in ops for check in op.checks))
    return KernelPlan(composite, outputs=tuple(writes))


def _joined(ops: Sequence[Operator]
            ) -> tuple[tuple[Tensor, ...], tuple[Buffer, ...], dict[int, Compute]]:
    """The tensors ``ops`` read from outside, a buffer for each, and each member result's
    compute with the members' definitions joined (by tensor id)."""
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
    return tuple(external.values()), tuple(buffers.values()), computes


def attention_core(pg: PrimitiveGraph, product: int) -> int | None:
    """The primitives of ``softmax(logits(Q Kᵀ)) V`` as fission leaves them, ending in the
    second product ``product``: Q Kᵀ, element-wise logits, their row maximum, the
    shifted exponentials, their row sum, the product by V and its division by the sum;
    None where ``product`` ends no such attention or a value inside it is read outside."""
    found = _fusable_attention(pg, product)
    return None if found is None else found[0]


def _fusable_attention(pg: PrimitiveGraph, product: int
                       ) -> tuple[int, dict[str, Operator]] | None:
    """The attention ending in ``product`` (see ``attention_core``) and its primitives by
    role, where only its result is read outside it."""
    roles = _attention_roles(pg, product)
    if roles is None:
        return None
    core = sum(1 << pg.index[id(op)] for op in roles.values())
    last = roles["out"]
    inside = [t for p in bits(core) if pg.ops[p] is not last for t in pg.ops[p].outputs]
    if any(id(t) in pg.graph_outputs or any(not core >> r & 1 for r in pg.consumers(t))
           for t in inside):
        return None
    return core, roles


def _attention_roles(pg: PrimitiveGraph, product: int) -> dict[str, Operator] | None:
    op = pg.ops[product]
    if op.op_type != "MatMul" or pg.categories[product] != "linear":
        return None
    exp = _made_by(op.inputs[0], "Exp")
    shifted = _made_by(exp and exp.inputs[0], "Sub")
    top = _made_by(shifted and shifted.inputs[1], "ReduceMax")
    if top is None or not _row_reduction(top) or top.inputs[0] is not shifted.inputs[0]:
        return None
    total = next((pg.ops[r] for r in pg.consumers(exp.outputs[0])
                  if pg.ops[r].op_type == "ReduceSum" and _row_reduction(pg.ops[r])), None)
    out = next((pg.ops[r] for r in pg.consumers(op.outputs[0]) if pg.ops[r].op_type == "Div"
                and pg.ops[r].inputs[0] is op.outputs[0]
                and total is not None and pg.ops[r].inputs[1] is total.outputs[0]), None)
    if out is None:
        return None
    chain, t = [], shifted.inputs[0]
    while t.producer is not None and id(t.producer) in pg.index \
            and pg.categories[pg.index[id(t.producer)]] == "elementwise":
        chained = [u for u in t.producer.inputs if u is not None and u.shape == t.shape
                   and not u.is_constant]
        if len(chained) != 1:
            return None
        chain.append(t.producer)
        t = chained[0]
    scores = _made_by(t, "MatMul")
    if scores is None or pg.categories[pg.index[id(scores)]] != "linear" \
            or scores.outputs[0].shape[:-1] != op.outputs[0].shape[:-1]:
        return None
    # The kernel keeps a block of scores on the stack: every size must be known.
    if not all(isinstance(d, int) for t in (*scores.inputs, *op.inputs) for d in t.shape):
        return None
    roles = {"scores": scores, "top": top, "shifted": shifted, "exp": exp, "total": total,
             "product": op, "out": out}
    roles.update((f"logits{k}", c) for k, c in enumerate(chain))
    return roles


def _made_by(t: Tensor | None, op_type: str) -> Operator | None:
    if t is None or t.producer is None or t.producer.op_type != op_type:
        return None
    return t.producer


def _row_reduction(op: Operator) -> bool:
    """A reduction over the last axis that keeps it (as fission writes Softmax's)."""
    rank = len(op.inputs[0].shape)
    return op.attrs.get("axes") in ([rank - 1], [-1]) and op.attrs.get("keepdims", 1) == 1


def _attention(pg: PrimitiveGraph, members: int, product: int, writes: Sequence[Tensor]
               ) -> KernelPlan:
    """The plan of ``members`` around one fused attention kernel (``AttentionParts``):
    its primitives as the anchor, those it reads from as prologues, those after it as
    epilogues."""
    if not takes_as_its_own("FusedAttention", pg.target):
        raise NotAKernel(f"two linear primitives, and no attention kernel for {pg.target.kind}")
    found = _fusable_attention(pg, product)
    if found is None or found[0] & ~members:
        raise NotAKernel("two linear primitives that are not one attention")
    core, roles = found
    ops = [pg.ops[p] for p in bits(core)]
    external, buffers, computes = _joined(ops)
    logits = roles.get("logits0", roles["scores"])
    parts = AttentionParts(**{field: computes[id(roles[role].outputs[0])] for field, role in (
        ("scores", "scores"), ("maximum", "top"), ("weights", "exp"), ("total", "total"),
        ("product", "product"), ("out", "out"))}, logits=computes[id(logits.outputs[0])])
    out = roles["out"].outputs[0]
    fused = Operator("FusedAttention", f"{roles['out'].name}+attention", external,
                     {"parts": parts}, (out,), (parts.out,), buffers,
                     tuple(check for op in ops for check in op.checks))
    return _anchored(pg, members, core, fused, writes)
