"""Checking a compiled ONNX model against ONNX Runtime, and finding where they part.

``check(model)`` runs treadle and ONNX Runtime on the same inputs (given, or random) and
reports each output's error. When an output disagrees it runs both again, keeping every
intermediate value: ONNX Runtime's for every node output, treadle's for every tensor a
kernel writes (right after that kernel, since later kernels reuse memory). Graph passes
record which model tensors each of treadle's tensors equals (``Tensor.aliases``), so the
two meet by name; the first node, in the model's order, whose output differs is reported
with its op, attributes, input shapes and the kernel it was fused into. Tensors that no
kernel writes in the model's layout (a value kept channels-last, one fused away) are not
compared, so the node found may lie after the fault, inside the kernel named.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from treadle.compiler import compile_graph, run_constants
from treadle.dump import dump_folder
from treadle.errors import ModelError
from treadle.graph.graph import Graph
from treadle.graph.optimize import optimize
from treadle.graph.kernel_plan import KernelPlan, greedy
from treadle.graph.partition import format_partition
from treadle.graph.tensor import Dim
from treadle.ir.functor import evaluate, free_vars
from treadle.runtime.inputs import random_input
from treadle.specialise import bind_needed

# The (rtol, atol) a tensor of each float type is held to by default: half precision
# rounds after every operation, so two correct implementations differ by a few of its
# units in the last place (float16's is 1e-3 near 1, bfloat16's 8e-3).
TOLERANCES = {"float16": (1e-2, 1e-3), "bfloat16": (5e-2, 1e-2)}
RTOL, ATOL = 1e-4, 1e-5  # every other type's


@dataclass(frozen=True)
class Difference:
    """How far treadle's value of one tensor is from the reference."""
    name: str
    shape: tuple[int, ...]
    max_abs: float  # the largest absolute difference
    max_rel: float  # max_abs over the reference's largest magnitude
    mismatched_nans: int  # elements that are NaN in one and not the other
    agrees: bool

    def __str__(self) -> str:
        verdict = "agrees" if self.agrees else "DIFFERS"
        nans = f", {self.mismatched_nans} NaN mismatches" if self.mismatched_nans else ""
        return (f"{self.name} {list(self.shape)}: {verdict} (max abs error {self.max_abs:.3g}, "
                f"relative {self.max_rel:.3g}{nans})")


@dataclass(frozen=True)
class Divergence:
    """The first node of the model whose output treadle computes differently."""
    node: str
    op_type: str
    attributes: dict
    input_shapes: dict[str, tuple[int, ...] | None]
    difference: Difference
    kernel: str  # the fusion group, as TREADLE_DUMP's partition.txt prints it

    def __str__(self) -> str:
        inputs = ", ".join(f"{name} {list(shape) if shape is not None else '?'}"
                           for name, shape in self.input_shapes.items())
        return "\n".join([
            f"first differing node: {self.node!r} ({self.op_type})",
            f"  attributes: {self.attributes}",
            f"  inputs: {inputs}",
            f"  output {self.difference}",
            "  fused into kernel:",
            *(f"    {line}" for line in self.kernel.splitlines())])


@dataclass
class CheckReport:
    outputs: list[Difference]
    divergence: Divergence | None = None
    compared: int = 0  # intermediate tensors compared while looking for the divergence
    inputs: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def agrees(self) -> bool:
        return all(d.agrees for d in self.outputs)

    def __str__(self) -> str:
        lines = [str(d) for d in self.outputs]
        if self.agrees:
            lines.append("all outputs agree with ONNX Runtime")
        elif self.divergence is not None:
            lines += [f"compared {self.compared} intermediate tensors", str(self.divergence)]
        else:
            lines.append(f"compared {self.compared} intermediate tensors: every one that "
                         "treadle writes in the model's layout agrees")
        return "\n".join(lines)


def check(model, inputs: Mapping[str, np.ndarray] | None = None, *,
          dims: Mapping[str, int] | None = None, rtol: float | None = None,
          atol: float | None = None, tune: int = 0, seed: int = 0) -> CheckReport:
    """Compiles ``model`` (an ONNX file path, bytes or ``onnx.ModelProto``) and compares it
    with ONNX Runtime on ``inputs``; inputs not given are random (floats from a standard
    normal, integers from [0, 4)), with symbolic dimensions sized by ``dims`` (default 1).
    A tensor agrees when its largest absolute difference is at most ``atol`` or at most
    ``rtol`` times the reference's largest magnitude, with NaNs in the same places; either
    one not given is its type's (``TOLERANCES``)."""
    from treadle.frontend.onnx import from_onnx, load_model
    given = dict(inputs or {})
    (proto, graph), bound = bind_needed(load_model(model), [], given,
                                        lambda p: (p, from_onnx(p)))
    with dump_folder(f"{graph.name}-check"):  # the passes here, the kernels in a folder inside
        graph = optimize(graph, run=run_constants)
        executable = compile_graph(graph, optimize_graph=False, tune=tune)
    feeds = _inputs(graph, {k: v for k, v in given.items() if k not in bound},
                    dict(dims or {}), seed)
    names = [t.name for t in graph.outputs]
    expected = dict(zip(names, _onnxruntime(proto, feeds, names)))
    actual = executable(**feeds)
    report = CheckReport([_difference(name, got, expected[name], rtol, atol)
                          for name, got in zip(executable.output_names, actual)],
                         inputs=feeds)
    if not report.agrees:
        _bisect(report, proto, graph, executable, feeds, rtol, atol)
    return report


def _inputs(graph: Graph, given: dict, dims: dict[str, int], seed: int) -> dict:
    rng = np.random.default_rng(seed)
    for tensor in graph.inputs:
        if tensor.name not in given:
            shape = [_size(d, dims) for d in tensor.shape]
            given[tensor.name] = random_input(rng, tensor.dtype.numpy, shape)
    return given


def _size(dim: Dim, dims: dict[str, int]) -> int:
    if isinstance(dim, int):
        return dim
    return int(evaluate(dim, {v: dims.get(v.name, 1) for v in free_vars(dim)}))


def _onnxruntime(proto, feeds: dict, names: Sequence[str]) -> list[np.ndarray]:
    import onnx
    import onnxruntime as ort
    if not names:
        return []
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    declared = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in declared)
    try:
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        known = {i.name for i in session.get_inputs()}
        return session.run(list(names), {k: v for k, v in feeds.items() if k in known})
    except Exception as err:  # onnxruntime's own kinds (InvalidGraph, NotImplemented, ...)
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelError(f"ONNX Runtime, the reference, cannot run the model: {reason}") \
            from None


def _difference(name: str, actual: np.ndarray, expected: np.ndarray, rtol: float | None,
                atol: float | None) -> Difference:
    actual, expected = np.asarray(actual), np.asarray(expected)
    default_rtol, default_atol = TOLERANCES.get(expected.dtype.name, (RTOL, ATOL))
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    if actual.shape != expected.shape:
        return Difference(name, expected.shape, float("inf"), float("inf"), 0, False)
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    mismatched = int(np.count_nonzero(nan_a != nan_e))
    both = ~(nan_a | nan_e)
    same = a[both] == e[both]  # equal infinities differ by nothing, not by NaN
    with np.errstate(invalid="ignore"):
        error = np.abs(a[both] - e[both])
    error[same] = 0
    max_abs = float(error.max()) if error.size else 0.0
    finite = np.abs(e[both][np.isfinite(e[both])])
    scale = float(finite.max()) if finite.size else 0.0
    max_rel = max_abs / scale if scale else (0.0 if max_abs == 0 else float("inf"))
    agrees = mismatched == 0 and (max_abs <= atol or max_rel <= rtol)
    return Difference(name, expected.shape, max_abs, max_rel, mismatched, agrees)


def _bisect(report: CheckReport, proto, graph: Graph, executable, feeds: dict,
            rtol: float, atol: float) -> None:
    """Finds the first node of the model whose value treadle writes and gets wrong."""
    position = {out: k for k, node in enumerate(proto.graph.node) for out in node.output}
    tensors = list(graph.tensors)  # compile_graph numbers its slots in this order
    written = []  # (model tensor name, treadle's value, the kernel step's name)
    for step, values in executable.trace(**feeds):
        for slot, value in values.items():
            for alias in {tensors[slot].name, *tensors[slot].aliases} & position.keys():
                written.append((alias, value, step.name))
    if not written:
        return
    reference = dict(zip([w[0] for w in written],
                         _onnxruntime(proto, feeds, [w[0] for w in written])))
    report.compared = len(written)
    differing = [(position[name], name, value, kernel) for name, value, kernel in written
                 if not _difference(name, value, reference[name], rtol, atol).agrees]
    if not differing:
        return
    _, name, value, kernel = min(differing, key=lambda d: d[0])
    group = next((g for g in greedy(graph) if g.name == kernel), None)
    inside = _narrow(proto, feeds, _computed_by(group, position) if group else [], rtol, atol)
    if inside is not None and position[inside.name] < position[name]:
        name, difference = inside.name, inside
    else:
        difference = _difference(name, value, reference[name], rtol, atol)
    node = proto.graph.node[position[name]]
    computed = [i for i in node.input if i in position]
    shapes = {**_declared_shapes(proto), **{k: np.shape(v) for k, v in feeds.items()},
              **{k: np.shape(v) for k, v in zip(computed, _onnxruntime(proto, feeds, computed))}}
    report.divergence = Divergence(
        node.name or name, node.op_type, _attributes(node),
        {i: shapes.get(i) for i in node.input if i}, difference,
        format_partition([group]).split(": ", 1)[-1] if group else kernel)


def _computed_by(group: KernelPlan, position: dict[str, int]) -> list[str]:
    """The model's tensors that ``group``'s kernel computes, in the model's order."""
    names = {n for op in group.ops for t in op.outputs for n in (t.name, *t.aliases)}
    return sorted(names & position.keys(), key=position.get)


def _narrow(proto, feeds: dict, names: list[str], rtol: float, atol: float
            ) -> Difference | None:
    """The first of ``names`` (tensors one kernel computes without storing them) that
    differs when the model is compiled with them as outputs too: a fault inside a fused
    kernel usually survives storing a few more of its values."""
    import onnx
    from treadle.frontend.onnx import from_onnx
    declared = {o.name for o in proto.graph.output}
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(proto).graph.value_info}
    extra = [n for n in names if n not in declared and n in inferred]
    if not extra:
        return None
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    model.graph.output.extend(inferred[n] for n in extra)
    executable = compile_graph(from_onnx(model))
    actual = dict(zip([o.name for o in model.graph.output], executable(**feeds)))
    expected = dict(zip(extra, _onnxruntime(proto, feeds, extra)))
    for name in extra:
        difference = _difference(name, actual[name], expected[name], rtol, atol)
        if not difference.agrees:
            return difference
    return None


def _declared_shapes(proto) -> dict[str, tuple]:
    """Shapes of the model's tensors as ONNX's shape inference sees them (a symbolic
    dimension shows as its name)."""
    import onnx
    graph = onnx.shape_inference.infer_shapes(proto).graph
    shapes = {t.name: tuple(t.dims) for t in graph.initializer}
    for info in (*graph.value_info, *graph.input, *graph.output):
        if info.type.tensor_type.HasField("shape"):
            shapes[info.name] = tuple(d.dim_param or d.dim_value
                                      for d in info.type.tensor_type.shape.dim)
    return shapes


def _attributes(node) -> dict:
    from treadle.frontend.onnx import ATTRIBUTE_DECODERS
    return {a.name: ATTRIBUTE_DECODERS[a.type](a) if a.type in ATTRIBUTE_DECODERS else "?"
            for a in node.attribute}
