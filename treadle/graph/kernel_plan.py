"""The kernel plan: which kernels a graph runs as, the seam between choosing kernels and
building them.

A ``KernelPlan`` names its operators: an anchor, scheduled alone by a template or the
rules, and the prologues and epilogues fused into it after scheduling (see
``schedule.fusion``); the tensors it reads from outside and the one or more it writes. Plans
may share operators: an operator in two plans is computed by both (recomputing a cheap
value can beat writing it out and reading it back), and only the plans that list its
tensor among their outputs write it. A plan whose anchor is a view builds no kernel, nor
does one whose anchor runs on the host (a Loop, ``partition.ON_HOST``), alone in its plan.

A strategy turns a graph into plans in an order that runs producers first, over a graph
of its choice (orchestration splits operators into primitives first), and has them built
by the ``Builder`` the compiler driver gives it; it may build more than one plan and keep
the faster. ``"greedy"`` is the fusion partition of ``graph.partition`` (one anchor per
kernel, neighbours attached where legal); the driver registers ``"orchestrate"``, Korch's
optimal choice among candidate kernels (``treadle.orchestrate``), which sits above this
layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from treadle.graph.graph import Graph
from treadle.graph.operator import Operator
from treadle.graph.partition import ON_HOST, Group, is_view, partition
from treadle.graph.tensor import Tensor


@dataclass(frozen=True, eq=False)
class KernelPlan:
    anchor: Operator
    prologues: tuple[Operator, ...] = ()
    epilogues: tuple[Operator, ...] = ()
    outputs: tuple[Tensor, ...] = ()  # the tensors the kernel writes

    @property
    def name(self) -> str:
        return self.anchor.name

    @property
    def ops(self) -> tuple[Operator, ...]:
        return (*self.prologues, self.anchor, *self.epilogues)

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        """The tensors the plan reads that none of its operators computes, in first use."""
        produced = {id(t) for op in self.ops for t in op.outputs}
        found: dict[int, Tensor] = {}
        for op in self.ops:
            for t in op.inputs:
                if t is not None and id(t) not in produced:
                    found.setdefault(id(t), t)
        return tuple(found.values())

    @property
    def is_view(self) -> bool:
        return is_view(self.anchor)

    @property
    def on_host(self) -> bool:
        return self.anchor.op_type in ON_HOST


def single(op: Operator) -> KernelPlan:
    """The plan of one operator alone, writing all its outputs."""
    return KernelPlan(op, outputs=tuple(op.outputs))


def _from_group(group: Group) -> KernelPlan:
    return KernelPlan(group.anchor, tuple(group.prologues), tuple(group.epilogues),
                      tuple(group.outputs))


def greedy(graph: Graph) -> list[KernelPlan]:
    return [_from_group(g) for g in partition(graph)]


class Builder(Protocol):
    """What a strategy is given by the driver: the compile's kernel maker (its target and
    tuning level; ``tune.kernel.KernelMaker``) and how plans over a graph become an
    executable."""
    maker: Any

    def executable(self, graph: Graph, plans: Sequence[KernelPlan]) -> Any: ...


# A strategy: the graph and the builder of the compile -> the executable.
Strategy = Callable[[Graph, Builder], Any]
STRATEGIES: dict[str, Strategy] = {
    "greedy": lambda graph, builder: builder.executable(graph, greedy(graph))}


def build_plans(graph: Graph, strategy: str, builder: Builder) -> Any:
    """The executable of ``graph`` whose kernels ``strategy`` plans (see STRATEGIES)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"kernel plan strategy {strategy!r}: expected one of "
                         f"{', '.join(sorted(STRATEGIES))}")
    return STRATEGIES[strategy](graph, builder)
