"""If, Scan and Loop: nodes whose attributes hold subgraphs.

treadle's graphs have no control flow of their own, so a subgraph is mostly imported in
place, its nodes becoming nodes of the graph around it, named
``<node>/<branch or iteration>/<body node>``:
* If with a condition known when compiling imports the branch it takes. Otherwise both
  branches are computed and each output is chosen by the condition (``Where``), which
  needs the branches' outputs to agree in shape.
* Scan is unrolled: each iteration imports the body once, over the states the iteration
  before left and its slice of the scanned inputs; scanned outputs are stacked. The
  scanned axis must have a static length.
* Loop is unrolled the same way where its trip count is known when compiling and at most
  ``UNROLLED_TRIPS``; a condition computed at run time then stops it by freezing its
  states, which only a loop without scanned outputs can do. Every other Loop (a trip
  count computed at run time, from a graph input or a symbolic dimension; none at all; a
  long one; a condition computed at run time with scanned outputs) becomes one ``Loop``
  operator (``graph.ops.loop``) whose body is a graph of its own, named
  ``<node>_body``: its inputs are the iteration number, the condition, the states and
  the tensors it reads from the graphs around it (constants, and tensors whose contents
  are known, stay constants of the body), and the compiler compiles it as a model of its
  own that the executor calls once per iteration. Its states must keep their shapes from one iteration to the next. A body
  that needs the contents of a tensor it computes when compiling (a Slice at the
  iteration number) is unrolled all the same, so its trip count must then be known
  when compiling (a graph input's specialises the model: ``treadle.specialise``).
"""
from __future__ import annotations

from typing import Callable, Iterator, Mapping, Optional, Sequence

import numpy as np
import onnx

from treadle.errors import ModelError, NeedsValueError, UnsupportedOpError
from treadle.graph.graph import Graph
from treadle.graph.known import derive_value
from treadle.graph.operator import apply
from treadle.graph.ops.loop import LoopBody
from treadle.graph.tensor import Tensor, constant

# Imports the body graph with its inputs bound to the given tensors, its nodes named under
# the prefix, and returns its outputs; the keyword ``env`` replaces the scope it reads
# the graph around it from.
ImportBody = Callable[..., list[Tensor]]
# Loops known to run at most this many times are unrolled: their kernels then fuse
# across iterations and no step calls back into Python, but each iteration is a copy of
# the body to compile.
UNROLLED_TRIPS = 32


def import_if(node: onnx.NodeProto, name: str, inputs: list[Optional[Tensor]],
              body: ImportBody) -> list[Tensor]:
    branches = _graphs(node, name, ("then_branch", "else_branch"))
    cond = _required(inputs, 0, name, "cond")
    known = _known(cond)
    if known is not None:
        return body(branches[0 if known else 1], [], f"{name}/{'then' if known else 'else'}")
    then, otherwise = (body(g, [], f"{name}/{b}") for g, b in zip(branches, ("then", "else")))
    if any(a.shape != b.shape for a, b in zip(then, otherwise)):
        raise NeedsValueError(f"node {name!r} (If): its branches give outputs of different "
                              f"shapes, {[a.shape for a in then]} and "
                              f"{[b.shape for b in otherwise]}, so its condition must be "
                              "known when compiling, but it is computed at run time", cond.name)
    flag = _scalar(cond, f"{name}/cond")
    return [apply("Where", [flag, a, b], name=f"{name}/choose{k}")[0]
            for k, (a, b) in enumerate(zip(then, otherwise))]


def import_scan(node: onnx.NodeProto, name: str, inputs: list[Optional[Tensor]],
                attrs: Mapping, opset: int, body: ImportBody) -> list[Tensor]:
    if opset < 9:
        raise UnsupportedOpError(f"node {name!r} (Scan): opset 8's form with a batch axis and "
                                 "sequence lengths is not supported")
    graph = _graphs(node, name, ("body",))[0]
    scanned = attrs.get("num_scan_inputs")
    if not isinstance(scanned, int) or not 0 < scanned <= len(inputs):
        raise ModelError(f"node {name!r} (Scan): num_scan_inputs {scanned} does not fit its "
                         f"{len(inputs)} inputs")
    states, xs = list(inputs[:len(inputs) - scanned]), inputs[len(inputs) - scanned:]
    in_axes = [a % max(x.rank, 1) for a, x in zip(attrs.get("scan_input_axes", [0] * scanned), xs)]
    in_backward = attrs.get("scan_input_directions", [0] * scanned)
    lengths = {x.shape[a] for x, a in zip(xs, in_axes)}
    length = lengths.pop() if len(lengths) == 1 else None
    if not isinstance(length, int) or length < 1:
        raise UnsupportedOpError(f"node {name!r} (Scan): the scanned axes must have one "
                                 f"length, static and at least 1, got {sorted(map(str, lengths))}")
    slices: list[list[Tensor]] = []
    for t in range(length):
        parts = [_slice(x, length - 1 - t if back else t, a, f"{name}/{t}/in{k}")
                 for k, (x, a, back) in enumerate(zip(xs, in_axes, in_backward))]
        outputs = body(graph, [*states, *parts], f"{name}/{t}")
        states, scan_parts = outputs[:len(states)], outputs[len(states):]
        slices.append(scan_parts)
    count = len(slices[0])
    out_axes = attrs.get("scan_output_axes", [0] * count)
    out_backward = attrs.get("scan_output_directions", [0] * count)
    stacked = [_stack([s[k] for s in slices][::-1 if out_backward[k] else 1], out_axes[k],
                      f"{name}/out{k}") for k in range(count)]
    return [*states, *stacked]


def import_loop(node: onnx.NodeProto, name: str, inputs: list[Optional[Tensor]],
                body: ImportBody, env: Mapping[str, Tensor]) -> list[Tensor]:
    """The loop unrolled where it runs a few times, known when compiling; else one Loop
    operator over its body as a graph, which the executor runs."""
    graph = _graphs(node, name, ("body",))[0]
    trips, cond, states = (inputs + [None, None])[0], (inputs + [None, None])[1], inputs[2:]
    if len(graph.input) != 2 + len(states) or len(graph.output) < 1 + len(states):
        raise ModelError(f"node {name!r} (Loop): its body takes {len(graph.input)} inputs "
                         f"and gives {len(graph.output)} outputs, for {len(states)} "
                         "loop-carried states")
    count = None if trips is None else _known(trips)
    if cond is not None and _known(cond) is False:
        count = 0
    scanned = len(graph.output) > 1 + len(states)
    if count is not None and count <= UNROLLED_TRIPS and not (scanned and count <= 0):
        try:
            return _unrolled_loop(name, graph, cond, states, max(count, 0), body)
        except _StopsAtRunTime:
            pass
    try:
        return _run_time_loop(node, name, graph, (trips, cond, states), body, env)
    except _NeedsUnrolling as err:
        return _unrolled_instead(name, graph, (trips, cond, states), count, body, err.error)


def _unrolled_instead(name: str, graph: onnx.GraphProto,
                      given: tuple[Optional[Tensor], Optional[Tensor], list[Tensor]],
                      count: Optional[int], body: ImportBody,
                      error: NeedsValueError) -> list[Tensor]:
    """A body that needs a value of its iteration when compiling (a Slice at the
    iteration number) imports only unrolled: its trip count must be known then, so a
    graph input's specialises the model (compiled per trip count)."""
    trips, cond, states = given
    if count is None:
        raise NeedsValueError(f"{error}; so node {name!r} (Loop) is unrolled, and its trip "
                              "count must be known when compiling",
                              error.tensor if trips is None else trips.name)
    try:
        return _unrolled_loop(name, graph, cond, states, max(count, 0), body)
    except _StopsAtRunTime:
        raise UnsupportedOpError(f"{error}; so node {name!r} (Loop) is unrolled, but its "
                                 "condition is computed at run time, so how many slices its "
                                 "scanned outputs stack is known only then") from None


def _unrolled_loop(name: str, graph: onnx.GraphProto, cond: Optional[Tensor],
                   states: list[Tensor], count: int, body: ImportBody) -> list[Tensor]:
    """The body imported once per iteration. A condition computed at run time stops the
    loop by freezing its states: the number of slices to stack is then known only at run
    time (``_StopsAtRunTime``)."""
    running = None if cond is None or _known(cond) is True else _scalar(cond, f"{name}/cond")
    scanned: list[list[Tensor]] = []
    for t in range(count):
        flag = running if running is not None else constant(np.array(True), f"{name}/{t}/true")
        outputs = body(graph, [constant(np.array(t, np.int64), f"{name}/{t}/iteration"), flag,
                               *states], f"{name}/{t}")
        carried, scan_parts = outputs[1:1 + len(states)], outputs[1 + len(states):]
        if running is not None:
            carried = [apply("Where", [running, new, old], name=f"{name}/{t}/keep{k}")[0]
                       for k, (new, old) in enumerate(zip(carried, states))]
        states, running = carried, _next_condition(outputs[0], running, name, t)
        if running is not None and scan_parts:
            raise _StopsAtRunTime()
        scanned.append(scan_parts)
    if scanned and scanned[0]:
        return [*states, *(_stack([s[k] for s in scanned], 0, f"{name}/out{k}")
                           for k in range(len(scanned[0])))]
    return states


def _run_time_loop(node: onnx.NodeProto, name: str, graph: onnx.GraphProto,
                   given: tuple[Optional[Tensor], Optional[Tensor], list[Tensor]],
                   body: ImportBody, env: Mapping[str, Tensor]) -> list[Tensor]:
    """One Loop operator (``graph.ops.loop``): an absent trip count is the largest int64,
    an absent condition true."""
    trips, cond, states = given
    if trips is None:
        trips = constant(np.array(np.iinfo(np.int64).max), f"{name}/no_trip_count")
    if cond is None:
        cond = constant(np.array(True), f"{name}/no_condition")
    scope = _Captured(env)
    bound = [Tensor(graph.input[0].name, "int64", ()), Tensor(graph.input[1].name, "bool", ()),
             *(Tensor(i.name, t.dtype, t.shape) for i, t in zip(graph.input[2:], states))]
    try:
        outputs = body(graph, bound, f"{name}/body", env=scope)
    except NeedsValueError as err:
        if err.tensor in scope.captured:  # a tensor from outside: specialising may bind it
            raise
        raise _NeedsUnrolling(err) from None
    captured = list(scope.captured.values())
    loop_body = LoopBody(Graph.from_outputs([*bound, *(inner for _, inner in captured)],
                                            outputs, f"{name}_body"), len(states))
    shown = len(outputs) - 1  # the states and the scanned outputs
    names = [*(list(node.output) + [""] * shown)[:shown], f"{name}/iterations"]
    return apply("Loop", [trips, cond, *states, *(outer for outer, _ in captured)],
                 {"body": loop_body}, name=name, output_names=names)[:-1]


class _StopsAtRunTime(Exception):
    """An unrolled loop with scanned outputs whose condition is computed at run time."""


class _NeedsUnrolling(Exception):
    """A body that needs the contents of a tensor it computes when compiling."""

    def __init__(self, error: NeedsValueError):
        super().__init__(str(error))
        self.error = error


class _Captured(Mapping):
    """The scope of a body run as a graph of its own: the constants of the graphs around
    it as they are, and tensors whose contents are known (a shape's) as constants; their
    other tensors as new inputs of the body (``captured``: outer tensor and the body's
    input, by name), which the Loop reads and passes on."""

    def __init__(self, outer: Mapping[str, Tensor]):
        self.outer = outer
        self.captured: dict[str, tuple[Tensor, Tensor]] = {}
        self._seen: dict[str, Tensor] = {}  # what the body reads for each name

    def __getitem__(self, key: str) -> Tensor:
        if key not in self._seen:
            self._seen[key] = self._inner(key, self.outer[key])
        return self._seen[key]

    def _inner(self, key: str, tensor: Tensor) -> Tensor:
        if tensor.is_constant:
            return tensor
        derive_value(tensor)
        if tensor.value is not None and all(isinstance(v, (int, np.integer, bool, np.bool_))
                                            for v in tensor.value):
            return constant(np.array(tensor.value, tensor.dtype.numpy).reshape(tensor.shape),
                            key)
        self.captured[key] = (tensor, Tensor(key, tensor.dtype, tensor.shape))
        return self.captured[key][1]

    def __contains__(self, key) -> bool:
        return key in self.outer

    def __iter__(self) -> Iterator[str]:
        return iter(self.outer)

    def __len__(self) -> int:
        return len(self.outer)


def _next_condition(cond: Tensor, running: Optional[Tensor], name: str,
                    t: int) -> Optional[Tensor]:
    """Whether the loop still runs after iteration t: None while it surely does."""
    known = _known(cond)
    if known is True:
        return running
    flag = _scalar(cond, f"{name}/{t}/cond")
    if running is None:
        return flag
    return apply("And", [running, flag], name=f"{name}/{t}/running")[0]


def _graphs(node: onnx.NodeProto, name: str, keys: Sequence[str]) -> list[onnx.GraphProto]:
    found = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    missing = [k for k in keys if k not in found]
    if missing:
        raise ModelError(f"node {name!r} ({node.op_type}) lacks its subgraph {missing[0]!r}")
    return [found[k] for k in keys]


def _required(inputs: list[Optional[Tensor]], i: int, name: str, what: str) -> Tensor:
    if i >= len(inputs) or inputs[i] is None:
        raise ModelError(f"node {name!r}: input {i} ({what}) is required")
    return inputs[i]


def _known(tensor: Tensor):
    """The one value of a single-element tensor known when compiling (a bool for a
    condition), else None."""
    value = None
    if tensor.data is not None and tensor.data.size == 1:
        value = tensor.data.reshape(()).item()
    else:
        derive_value(tensor)
        if tensor.value is not None and len(tensor.value) == 1 \
                and isinstance(tensor.value[0], (int, np.integer, bool, np.bool_)):
            value = tensor.value[0]
    if value is None:
        return None
    return bool(value) if tensor.dtype.is_bool else int(value)


def _scalar(tensor: Tensor, name: str) -> Tensor:
    """A single-element tensor as a scalar, so that it broadcasts to any rank."""
    if tensor.rank == 0:
        return tensor
    return apply("Reshape", [tensor, constant(np.zeros(0, np.int64), f"{name}/shape")],
                 name=name)[0]


def _slice(x: Tensor, t: int, axis: int, name: str) -> Tensor:
    """x's element t along ``axis``, the axis dropped."""
    return apply("Gather", [x, constant(np.array(t, np.int64), f"{name}/index")],
                 {"axis": axis}, name=name)[0]


def _stack(parts: Sequence[Tensor], axis: int, name: str) -> Tensor:
    """The parts stacked along a new ``axis``."""
    rank = parts[0].rank + 1
    axis %= rank
    axes = constant(np.array([axis], np.int64), f"{name}/axes")
    lifted = [apply("Unsqueeze", [p, axes], name=f"{name}/lift{k}")[0]
              for k, p in enumerate(parts)]
    return apply("Concat", lifted, {"axis": axis}, name=name)[0]
