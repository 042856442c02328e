"""If, Scan and Loop: nodes whose attributes hold subgraphs, imported by importing the
subgraphs in place.

treadle's graphs have no control flow, so a subgraph's nodes become nodes of the graph
around it, named ``<node>/<branch or iteration>/<body node>``:
* If with a condition known when compiling imports the branch it takes. Otherwise both
  branches are computed and each output is chosen by the condition (``Where``), which
  needs the branches' outputs to agree in shape.
* Scan and Loop are unrolled: each iteration imports the body once, over the states the
  iteration before left and its slice of the scanned inputs; scanned outputs are stacked.
  The number of iterations must be known when compiling (a static scanned axis, a trip
  count known from constants or, through specialisation, from small graph inputs). A
  Loop's condition computed at run time stops the loop by freezing its states, so only a
  Loop without scanned outputs may have one.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import onnx

from treadle.errors import ModelError, NeedsValueError, UnsupportedOpError
from treadle.graph.known import derive_value
from treadle.graph.operator import apply
from treadle.graph.tensor import Tensor, constant

# Imports the body graph with its inputs bound to the given tensors, its nodes named under
# the prefix, and returns its outputs.
ImportBody = Callable[[onnx.GraphProto, Sequence[Tensor], str], list[Tensor]]


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
                body: ImportBody) -> list[Tensor]:
    graph = _graphs(node, name, ("body",))[0]
    trips, cond, states = (inputs + [None, None])[0], (inputs + [None, None])[1], inputs[2:]
    if trips is None:
        raise UnsupportedOpError(f"node {name!r} (Loop): a loop without a trip count runs "
                                 "until its condition fails, a number of times only run time "
                                 "knows")
    count = _known(trips)
    if count is None:
        raise NeedsValueError(f"node {name!r} (Loop): the trip count must be known when "
                              "compiling, but it is computed at run time", trips.name)
    running = None if cond is None or _known(cond) is True else _scalar(cond, f"{name}/cond")
    if cond is not None and _known(cond) is False:
        count = 0
    scanned: list[list[Tensor]] = []
    for t in range(max(int(count), 0)):
        flag = running if running is not None else constant(np.array(True), f"{name}/{t}/true")
        outputs = body(graph, [constant(np.array(t, np.int64), f"{name}/{t}/iteration"), flag,
                               *states], f"{name}/{t}")
        carried, scan_parts = outputs[1:1 + len(states)], outputs[1 + len(states):]
        if running is not None:
            carried = [apply("Where", [running, new, old], name=f"{name}/{t}/keep{k}")[0]
                       for k, (new, old) in enumerate(zip(carried, states))]
        states, running = carried, _next_condition(outputs[0], running, name, t)
        if running is not None and scan_parts:
            raise UnsupportedOpError(f"node {name!r} (Loop): its condition is computed at run "
                                     "time, so how many slices its scanned outputs stack is "
                                     "known only then")
        scanned.append(scan_parts)
    if scanned and scanned[0]:
        return [*states, *(_stack([s[k] for s in scanned], 0, f"{name}/out{k}")
                           for k in range(len(scanned[0])))]
    if len(graph.output) > 1 + len(states):
        raise UnsupportedOpError(f"node {name!r} (Loop): scanned outputs of zero iterations "
                                 "have no shape to take")
    return states


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
