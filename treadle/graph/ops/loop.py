"""ONNX's Loop as one operator whose body is a graph of its own, for loops that only run
time can count (a trip count computed from the data, or a condition computed by the body
while it also scans outputs out) and long ones; ``frontend.control_flow`` unrolls the
others.

The operator reads the trip count (int64), the condition (bool), the loop-carried states
and the tensors of the graphs around it that the body reads (captured). Its body takes
the iteration number, the condition, the states and the captured tensors, and gives the
next condition, the next states and each iteration's slices of the scanned outputs.
Its outputs are the final states, the scanned outputs (the slices stacked along a new
first axis) and the number of iterations that ran, an int64 scalar: the scanned
outputs' first size, a size found in the data (as ``OpContext.size_from_data`` makes
them) that no expression of the inputs' sizes bounds, so the executor keeps the tensors
it sizes out of its memory plan.

The states keep their dtypes and shapes from one iteration to the next (a state that
grows is an error naming the node), and a scanned slice's sizes follow from the body's
inputs, so that zero iterations still give each scanned output its shape. The compiler
compiles the body as a model of its own and runs the operator as a host step,
``HostLoop``, which calls the body once per iteration; the definition below only gives
the outputs' shapes and dtypes, its elements opaque loads as a hand-written kernel's
are.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from treadle.graph.graph import Graph
from treadle.graph.operator import DataSize, OpContext, register
from treadle.graph.tensor import Dim, Tensor, normalize_dim, num_elements
from treadle.ir.compute import Compute, compute
from treadle.ir.dtypes import DataType, int64
from treadle.ir.expr import Buffer, Load, Var, as_expr
from treadle.ir.functor import free_vars

LEADING = 2  # the body's first inputs: the iteration number and the condition


@dataclass(frozen=True, eq=False)
class LoopBody:
    """The body graph: inputs (iteration, condition, states, captured), outputs
    (condition, states, scanned slices)."""
    graph: Graph
    states: int

    @property
    def captured(self) -> int:
        return len(self.graph.inputs) - LEADING - self.states

    @property
    def slices(self) -> tuple[Tensor, ...]:
        return self.graph.outputs[1 + self.states:]

    def __repr__(self) -> str:  # the graph printer shows attributes
        return f"<body {self.graph.name}: {len(self.graph.nodes)} operators>"


@register("Loop", internal=True)
def loop(ctx: OpContext) -> list[Compute]:
    """The final states, the scanned outputs and how many iterations ran."""
    body: LoopBody = ctx.required_attr("body")
    _check_inputs(ctx, body)
    states = [ctx.input(LEADING + k) for k in range(body.states)]
    _check_states(ctx, body)
    _check_slices(ctx, body)
    count = Var(re.sub(r"\W", "_", f"{ctx.name}_iterations"), int64)
    # No bound: memory for the tensors it sizes is allocated once it is known.
    ctx.data_sizes.append(DataSize(count, len(states) + len(body.slices), None))
    kinds = [(s.dtype, s.shape) for s in states]
    kinds += [(p.dtype, (count, *p.shape)) for p in body.slices]
    return [_opaque(f"y{k}", dtype, shape) for k, (dtype, shape) in
            enumerate([*kinds, (int64, ())])]


def _opaque(name: str, dtype: DataType, shape: Sequence[Dim]) -> Compute:
    """An output whose elements no definition states: loads of the step's own result."""
    result = Buffer(f"Loop:{name}", dtype, tuple(shape))
    return compute(name, shape, lambda *i: Load(result, i))


def _check_inputs(ctx: OpContext, body: LoopBody) -> None:
    expected = len(body.graph.inputs)
    if ctx.num_inputs != expected:
        raise ctx.error(f"takes {expected} inputs (trip count, condition, {body.states} "
                        f"states, {body.captured} captured), got {ctx.num_inputs}")
    trips, cond = ctx.input(0), ctx.input(1)
    if trips.dtype != int64 or not cond.dtype.is_bool or \
            any(normalize_dim(num_elements(b.shape)) != 1 for b in (trips, cond)):
        raise ctx.error(f"its trip count and condition must be one int64 and one bool, got "
                        f"{_kind(trips.dtype, trips.shape)} and {_kind(cond.dtype, cond.shape)}")
    for k in range(LEADING, expected):
        given, inner = ctx.input(k), body.graph.inputs[k]
        if given.dtype != inner.dtype or not _same_shape(given.shape, inner.shape):
            raise ctx.error(f"input {k} is {_kind(given.dtype, given.shape)}, but its body "
                            f"reads it as {_kind(inner.dtype, inner.shape)}")


def _check_states(ctx: OpContext, body: LoopBody) -> None:
    """Each state leaves an iteration with the dtype and shape it entered with."""
    for k in range(body.states):
        before, after = body.graph.inputs[LEADING + k], body.graph.outputs[1 + k]
        if before.dtype != after.dtype or not _same_shape(before.shape, after.shape):
            raise ctx.error(f"loop-carried state {k} ({before.name!r}) enters an iteration "
                            f"as {_kind(before.dtype, before.shape)} and leaves it as "
                            f"{_kind(after.dtype, after.shape)}; treadle runs loops whose "
                            "states keep their dtypes and shapes")


def _check_slices(ctx: OpContext, body: LoopBody) -> None:
    """A scanned slice's sizes are known from the body's inputs."""
    known = {v for t in body.graph.inputs for d in t.shape for v in free_vars(as_expr(d))}
    for k, part in enumerate(body.slices):
        unknown = {v.name for d in part.shape for v in free_vars(as_expr(d))} - \
            {v.name for v in known}
        if unknown:
            raise ctx.unsupported(f"scanned output {k} has slices of shape "
                                  f"[{', '.join(map(str, part.shape))}], sizes the body "
                                  f"finds in the data ({', '.join(sorted(unknown))}); "
                                  "slices of a loop's iterations must agree in shape")


def _same_shape(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    return len(a) == len(b) and all(normalize_dim(x) == normalize_dim(y) for x, y in zip(a, b))


def _kind(dtype: DataType, shape: Sequence[Dim]) -> str:
    return f"{dtype}[{', '.join(map(str, shape))}]"


# ---- running -----------------------------------------------------------------------------

# The compiled body: its input arrays -> its output arrays (new ones, the caller's own).
Body = Callable[[Sequence[np.ndarray]], list[np.ndarray]]


@dataclass(frozen=True)
class HostLoop:
    """The operator's step: ``body`` once per iteration while the trip count and the
    condition allow; ``empty`` gives the scanned outputs of zero iterations from the
    body's first inputs (their slices' shapes follow from the inputs' sizes)."""
    body: Body
    empty: Body
    states: int

    def __call__(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        trips, running = int(arrays[0].reshape(-1)[0]), bool(arrays[1].reshape(-1)[0])
        states = list(arrays[LEADING:LEADING + self.states])
        captured = list(arrays[LEADING + self.states:])
        slices: list[list[np.ndarray]] = []
        while len(slices) < trips and running:
            outputs = self.body([np.array(len(slices), np.int64), np.array(running),
                                 *states, *captured])
            running = bool(outputs[0].reshape(-1)[0])
            states, parts = outputs[1:1 + self.states], outputs[1 + self.states:]
            slices.append(parts)
        if not slices:  # the arrays given may be the caller's memory: the results are new
            first = [np.array(0, np.int64), np.array(running), *states, *captured]
            return [*(s.copy() for s in states), *self.empty(first), np.array(0, np.int64)]
        stacked = [np.stack(parts) for parts in zip(*slices)]
        return [*states, *stacked, np.array(len(slices), np.int64)]
