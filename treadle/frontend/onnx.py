"""Importing ONNX models into the graph IR.

Everything that can reject a model runs before anything is built, so a user learns all
that is wrong at once: the opset version, then every node whose op treadle lacks (one
error listing each op type with its node names), then the model's structure (every tensor
defined once, before use) and ``onnx.checker``. Building is then a walk over the nodes in
file order, which ONNX requires to be topological: initializers and Constant nodes become
constant tensors, graph inputs become tensors whose unknown dimensions are named symbols,
and every other node is applied through the operator registry, which infers its outputs
(graph outputs may omit their shapes: the inferred ones stand). Names from the model are
kept as they are; the backend sanitizes them before they reach C.

Op definitions follow the newest version of each operator. Where an older version that
the model's opset selects means something else for the same node, ``OLDER_FORMS``
rewrites the node into the newer form. Versions that only moved an attribute to an input
(Split, Squeeze, Unsqueeze, the Reduce ops' ``axes``) need no entry: the definitions read
either form, and a node has only the one its version allows. Versions that only added
dtypes need none either: an unsupported dtype is refused where it is read.
"""
from __future__ import annotations

import functools
import math
import os
from collections import ChainMap, defaultdict
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import onnx
from google.protobuf.message import DecodeError, Message
from onnx import AttributeProto, helper, numpy_helper

from treadle.errors import ModelError, NeedsValueError, UnsupportedOpError
from treadle.frontend import control_flow, functions
from treadle.graph.graph import Graph
from treadle.graph.operator import REGISTRY, apply
from treadle.graph.ops import quantized, selection, unique
from treadle.graph.ops.common import ONNX_DTYPES
from treadle.graph.ops.shape import constant_value
from treadle.graph.tensor import Tensor, constant
from treadle.ir import dtypes
from treadle.ir.dtypes import DataType

OPSETS = range(11, 29)  # versions of the default domain whose op semantics treadle follows
DEFAULT_DOMAINS = ("", "ai.onnx")
# Op types the importer handles itself rather than through the registry.
# ONNX operators imported as a few of treadle's: (inputs, attributes, node name, output
# name) -> outputs.
EXPANDED: dict[str, Callable] = {
    "NonZero": lambda inputs, attrs, name, out: [selection.nonzero(inputs[0], name, out)],
    "Compress": lambda inputs, attrs, name, out: [
        selection.compress(inputs[0], inputs[1], attrs.get("axis"), name, out)],
    "Unique": lambda inputs, attrs, name, out: unique.unique(
        inputs[0], attrs.get("axis"), bool(attrs.get("sorted", 1)), name, out),
    "QLinearMatMul": quantized.qlinear_matmul,
    "QLinearConv": quantized.qlinear_conv,
}
IMPORTED_DIRECTLY = {"Constant", *EXPANDED}
# Nodes whose subgraphs are imported in place (``control_flow``).
CONTROL_FLOW = frozenset({"If", "Scan", "Loop"})
NAMES_SHOWN = 5  # node names listed per unsupported op type
CHECKED_ELEMENTS = 1024  # larger initializers reach ONNX's checker without their data

# How each attribute type decodes to a Python value; other types are unsupported.
ATTRIBUTE_DECODERS = {
    AttributeProto.FLOAT: lambda a: float(a.f),
    AttributeProto.INT: lambda a: int(a.i),
    AttributeProto.STRING: lambda a: a.s.decode("utf-8", "replace"),
    AttributeProto.TENSOR: lambda a: numpy_helper.to_array(a.t),
    AttributeProto.FLOATS: lambda a: [float(v) for v in a.floats],
    AttributeProto.INTS: lambda a: [int(v) for v in a.ints],
    AttributeProto.STRINGS: lambda a: [s.decode("utf-8", "replace") for s in a.strings],
    AttributeProto.TENSORS: lambda a: [numpy_helper.to_array(t) for t in a.tensors],
}


def _rows_normalised(op_type: str, inputs: list[Optional[Tensor]], attrs: dict, name: str,
                     output_names: list[str]) -> list[Tensor]:
    """Softmax, LogSoftmax and Hardmax before opset 13 view the input as a matrix, the
    dimensions from ``axis`` (by default 1) on making one row, and normalise whole rows."""
    x = inputs[0]
    rows = apply("Flatten", [x], {"axis": attrs.get("axis", 1)}, name=f"{name}/rows")[0]
    y = apply(op_type, [rows], {"axis": 1}, name=f"{name}/{op_type}")[0]
    shape = apply("Shape", [x], name=f"{name}/shape")[0]
    return apply("Reshape", [y, shape], name=name, output_names=output_names)


@dataclass(frozen=True)
class OlderForm:
    """A node of the op in a model whose opset is below ``until`` means what ``rewrite``
    (op type, inputs, attributes, node name, output names) builds in the newer form."""
    until: int
    rewrite: Callable[[str, list, dict, str, list[str]], list[Tensor]]


def _axis_attribute(op_type: str, inputs: list[Optional[Tensor]], attrs: dict, name: str,
                    output_names: list[str]) -> list[Tensor]:
    """DFT before opset 20 takes its axis as an attribute, by default 1."""
    axis = constant(np.array(attrs.pop("axis", 1), np.int64), f"{name}/axis")
    inputs = [*inputs, None][:2] + [axis]
    return apply(op_type, inputs, attrs, name=name, output_names=output_names)


OLDER_FORMS = {**{op: OlderForm(13, _rows_normalised)
                  for op in ("Softmax", "LogSoftmax", "Hardmax")},
               "DFT": OlderForm(20, _axis_attribute)}


def from_onnx(model: str | os.PathLike | bytes | onnx.ModelProto,
              name: str | None = None) -> Graph:
    """The graph of an ONNX model given as a file path, its serialized bytes (as
    ``onnxruntime.InferenceSession`` takes them) or a ``ModelProto``."""
    proto = load_model(model)
    check_opset(proto)
    check_supported(proto.graph, opset_version(proto))
    check_structure(proto.graph)
    _check_with_onnx(proto)
    return _build(proto.graph, opset_version(proto), name or proto.graph.name or "model")


def load_model(model: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return _with_graph(model, "the ModelProto given")
    if isinstance(model, (bytes, bytearray)):
        where = f"the {len(model)} bytes given"
        try:
            return _with_graph(onnx.load_model_from_string(bytes(model)), where)
        except DecodeError as err:
            raise ModelError(f"{where} are not a serialized ONNX model ({err})") from None
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"expected an ONNX file path, its bytes or an onnx.ModelProto, got "
                        f"{type(model).__name__}")
    if os.path.isdir(model):
        raise ModelError(f"{os.fspath(model)}: a directory, not an ONNX file")
    try:
        return _with_graph(onnx.load(os.fspath(model)), os.fspath(model))
    except (DecodeError, onnx.checker.ValidationError, UnicodeDecodeError) as err:
        raise ModelError(f"{os.fspath(model)}: not a readable ONNX model ({err})") from None


def _with_graph(proto: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """``proto``, which must hold a graph: protobuf parses an empty file (an interrupted
    download) as a model with no fields at all."""
    if not proto.HasField("graph"):
        raise ModelError(f"{where}: no ONNX model (it holds no graph; an empty file?)")
    return proto


# ---- checks before building ------------------------------------------------------------

def opset_version(proto: onnx.ModelProto) -> int | None:
    """The model's version of the default ONNX domain, None if it imports none."""
    versions = [o.version for o in proto.opset_import if o.domain in DEFAULT_DOMAINS]
    return max(versions) if versions else None


def check_opset(proto: onnx.ModelProto) -> None:
    version = opset_version(proto)
    if version not in OPSETS:
        found = "no default-domain opset" if version is None else f"opset {version}"
        raise UnsupportedOpError(f"the model uses {found}; treadle supports ONNX opsets "
                                 f"{OPSETS.start} to {OPSETS.stop - 1}")


def node_name(node: onnx.NodeProto, index: int) -> str:
    """The node's name in the model, or its op type and position when it has none."""
    return node.name or f"{node.op_type}_{index}"


def unsupported_nodes(graph: onnx.GraphProto, opset: int | None = None
                      ) -> dict[str, list[str]]:
    """Op type (prefixed by its domain outside the default one) -> names of the nodes that
    treadle cannot import, in subgraphs too (an operator ONNX defines as a function of
    others is imported as that function, at ``opset``: by default the newest). Other nodes
    holding subgraphs are unsupported."""
    import treadle.graph.ops  # noqa: F401  (registers every op family)
    found: dict[str, list[str]] = defaultdict(list)
    for index, node in enumerate(graph.node):
        if node.domain not in DEFAULT_DOMAINS:
            found[f"{node.domain}.{node.op_type}"].append(node_name(node, index))
        elif node.op_type in CONTROL_FLOW:
            for attr in node.attribute:
                for op, names in unsupported_nodes(attr.g, opset).items():
                    found[op].extend(names)
        elif node.op_type not in REGISTRY and functions.has_function(node.op_type,
                                                                     node.domain, opset):
            continue
        elif (node.op_type not in REGISTRY and node.op_type not in IMPORTED_DIRECTLY
              or node.op_type in REGISTRY and REGISTRY[node.op_type].internal
              or any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS)
                     for a in node.attribute)):
            found[node.op_type].append(node_name(node, index))
    return dict(found)


def check_supported(graph: onnx.GraphProto, opset: int | None = None) -> None:
    found = unsupported_nodes(graph, opset)
    if found:
        raise UnsupportedOpError("the model uses operators treadle does not support: " +
                                 "; ".join(f"{op} ({_list_names(names)})"
                                           for op, names in sorted(found.items())))


def _list_names(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:NAMES_SHOWN])
    more = len(names) - NAMES_SHOWN
    label = "node" if len(names) == 1 else "nodes"
    return f"{label} {shown}" + (f" and {more} more" if more > 0 else "")


def check_structure(graph: onnx.GraphProto) -> None:
    """Graph inputs have ranks, every tensor is defined once, before it is read; errors
    name the node and tensor. (A graph output's shape follows from its node's inputs.)"""
    constants = {t.name for t in graph.initializer}
    for info in graph.input:
        if info.name not in constants and _lacks_shape(info):
            raise ModelError(f"graph input {info.name!r} has no shape (unknown rank); "
                             "treadle needs the rank of graph inputs")
    defined = constants | {t.name for t in graph.input}
    for index, node in enumerate(graph.node):
        where = f"node {node_name(node, index)!r} ({node.op_type})"
        for name in node.input:
            if name and name not in defined:
                raise ModelError(f"{where} reads tensor {name!r}, which is not a graph input, "
                                 "an initializer or the output of an earlier node")
        for name in node.output:
            if name in defined:
                raise ModelError(f"{where} defines tensor {name!r}, which is already defined")
            if name:
                defined.add(name)
    for output in graph.output:
        if output.name not in defined:
            raise ModelError(f"graph output {output.name!r} is not defined by any node, input "
                             "or initializer")


def _lacks_shape(info: onnx.ValueInfoProto) -> bool:
    return (info.type.WhichOneof("value") == "tensor_type"
            and not info.type.tensor_type.HasField("shape"))


def _check_with_onnx(proto: onnx.ModelProto) -> None:
    light = _without_weights(proto)
    # The checker wants every graph output's shape, ONNX Runtime does not: it checks the
    # copy without those outputs (check_structure found each of them defined).
    for k in reversed(range(len(light.graph.output))):
        if _lacks_shape(light.graph.output[k]):
            del light.graph.output[k]
    try:
        onnx.checker.check_model(light)
    except onnx.checker.ValidationError as err:
        message = " ".join(str(err).split())
        raise ModelError(f"the model is not valid ONNX: {message}") from None


def _without_weights(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy in which initializers of more than ``CHECKED_ELEMENTS`` elements are graph
    inputs of their dtype and shape. The checker serialises the model it checks: BERT's
    weights took 3.5 s, and past protobuf's 2 GiB it cannot at all; treadle reads their
    data itself (``_constant``)."""
    light = onnx.ModelProto()
    _copy_fields(proto, light, skip="graph")
    _copy_fields(proto.graph, light.graph, skip="initializer")
    inputs = {info.name for info in proto.graph.input}
    for init in proto.graph.initializer:
        if math.prod(init.dims) <= CHECKED_ELEMENTS:
            light.graph.initializer.append(init)
        elif init.name not in inputs:
            light.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type,
                                                                   list(init.dims)))
    return light


def _copy_fields(source, target, skip: str) -> None:
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        if hasattr(value, "extend"):  # a repeated field
            getattr(target, field.name).extend(value)
        elif isinstance(value, Message):
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


# ---- building ----------------------------------------------------------------------------

def _build(graph: onnx.GraphProto, opset: int, name: str) -> Graph:
    env: dict[str, Tensor] = {}
    if graph.sparse_initializer:
        raise UnsupportedOpError(f"sparse initializer {graph.sparse_initializer[0].values.name!r}"
                                 " is not supported")
    for init in graph.initializer:
        env[init.name] = _constant(init.name, init)
    inputs = []
    taken = _dim_params(graph)
    for info in graph.input:
        if info.name not in env:  # an input that is also an initializer is a constant
            env[info.name] = _input_tensor(info, taken)
            inputs.append(env[info.name])
    for index, node in enumerate(graph.node):
        for out_name, tensor in zip(node.output, _import_node(node, index, env, opset)):
            if out_name:
                env[out_name] = tensor
    return Graph.from_outputs(inputs, [env[o.name] for o in graph.output], name)


def _import_node(node: onnx.NodeProto, index: int, env: Mapping[str, Tensor],
                 opset: int, prefix: str = "") -> list[Tensor]:
    """The node's output tensors; ``prefix`` names a subgraph's nodes after the node and
    iteration that import them."""
    name = prefix + node_name(node, index)
    if node.op_type == "Constant":
        return [_constant_node(node, name)]
    missing = [t for t in node.input if t and t not in env]
    if missing:
        raise ModelError(f"node {name!r} ({node.op_type}) reads {missing[0]!r}, which no "
                         "node, input or initializer defines")
    inputs = [env[t] if t else None for t in node.input]
    if node.op_type in CONTROL_FLOW:
        return _import_control(node, name, inputs, env, opset)
    if node.op_type not in REGISTRY and node.domain in DEFAULT_DOMAINS:
        expanded = _import_function(node, name, inputs, env, opset)
        if expanded is not None:
            return expanded
    attrs = {a.name: _attribute(a, name, node.op_type) for a in node.attribute}
    output_names = [prefix + o if o else o for o in node.output]
    if node.op_type in EXPANDED:
        return EXPANDED[node.op_type](inputs, attrs, name, output_names[0] or None)
    older = OLDER_FORMS.get(node.op_type)
    if older is not None and opset < older.until:
        return older.rewrite(node.op_type, inputs, attrs, name, output_names)
    return apply(node.op_type, inputs, attrs, name=name, output_names=output_names)


def _import_body(graph: onnx.GraphProto, bound: Sequence[Optional[Tensor]], prefix: str,
                 env: Mapping[str, Tensor], opset: int, owner: str) -> list[Tensor]:
    """The outputs of a subgraph of node ``owner`` (a branch, a loop body, a function
    body) over ``bound`` as its inputs, in the scope ``env``, its nodes named under
    ``prefix``."""
    if len(bound) != len(graph.input):
        raise ModelError(f"node {owner!r}: its subgraph takes {len(graph.input)} inputs, "
                         f"given {len(bound)}")
    scope = ChainMap({i.name: t for i, t in zip(graph.input, bound)}, env)
    for init in graph.initializer:
        scope[init.name] = _constant(f"{prefix}/{init.name}", init)
    for index, inner in enumerate(graph.node):
        outputs = _import_node(inner, index, scope, opset, prefix + "/")
        scope.update((o, t) for o, t in zip(inner.output, outputs) if o)
    return [scope[o.name] for o in graph.output]


def _import_control(node: onnx.NodeProto, name: str, inputs: list[Optional[Tensor]],
                    env: Mapping[str, Tensor], opset: int) -> list[Tensor]:
    body = functools.partial(_import_body, env=env, opset=opset, owner=name)
    attrs = {a.name: _attribute(a, name, node.op_type) for a in node.attribute
             if a.type != AttributeProto.GRAPH}
    if node.op_type == "If":
        return control_flow.import_if(node, name, inputs, body)
    if node.op_type == "Scan":
        return control_flow.import_scan(node, name, inputs, attrs, opset, body)
    return control_flow.import_loop(node, name, inputs, body, env)


def _import_function(node: onnx.NodeProto, name: str, inputs: list[Optional[Tensor]],
                     env: Mapping[str, Tensor], opset: int) -> Optional[list[Tensor]]:
    """The node imported as the body of the ONNX function defining its operator, or
    None where ONNX defines none."""
    try:
        graph = functions.function_body(node, inputs, opset)
    except (RuntimeError, ValueError, onnx.defs.SchemaError) as err:
        raise ModelError(f"node {name!r} ({node.op_type}): ONNX cannot build the function "
                         f"defining it for this node: {err}") from None
    if graph is None:
        return None
    bound = (inputs + [None] * len(graph.input))[:len(graph.input)]
    try:
        return _import_body(graph, bound, name, env, opset, name)
    except NeedsValueError as err:  # named by the node's output, which the model's graph
        # has, so that the model is specialised for the small inputs the node reads
        raise NeedsValueError(str(err), node.output[0]) from None
    except UnsupportedOpError as err:
        raise UnsupportedOpError(f"node {name!r} ({node.op_type}), imported as the ONNX "
                                 f"function defining it: {err}") from None


def _attribute(attr: AttributeProto, node: str, op_type: str):
    decode = ATTRIBUTE_DECODERS.get(attr.type)
    if decode is None:
        kind = AttributeProto.AttributeType.Name(attr.type)
        raise UnsupportedOpError(f"node {node!r} ({op_type}): attribute {attr.name!r} of type "
                                 f"{kind} is not supported")
    return decode(attr)


def _constant_node(node: onnx.NodeProto, name: str) -> Tensor:
    attrs = {a.name: a for a in node.attribute}
    if len(attrs) != 1:
        raise ModelError(f"node {name!r} (Constant) must have exactly one value attribute, "
                         f"has {list(attrs)}")
    output = node.output[0]
    if "value" in attrs:  # a full tensor: read like an initializer (dtype checks, bfloat16)
        return _constant(output, attrs["value"].t)
    decoded = {key: _attribute(a, name, "Constant") for key, a in attrs.items()}
    value = constant_value(decoded, f"node {name!r} (Constant)")
    return Tensor(output, dtypes.dtype_of(value.dtype), value.shape, value)


def _constant(name: str, proto: onnx.TensorProto) -> Tensor:
    dtype = _dtype(proto.data_type, f"tensor {name!r}")
    try:
        array = numpy_helper.to_array(proto)
    except (ValueError, TypeError, OSError) as err:
        raise ModelError(f"tensor {name!r} cannot be read: {err}") from None
    if dtype == dtypes.bfloat16:
        array = array.view(np.uint16)  # treadle holds bfloat16 as its raw bits
    return Tensor(name, dtype, array.shape, array)


def _dtype(code: int, what: str) -> DataType:
    if code not in ONNX_DTYPES:
        known = code in onnx.TensorProto.DataType.values()
        kind = onnx.TensorProto.DataType.Name(code) if known else str(code)
        raise UnsupportedOpError(f"{what} has ONNX data type {kind}, which treadle does not "
                                 "support")
    return ONNX_DTYPES[code]


def _dim_params(graph: onnx.GraphProto) -> set[str]:
    return {d.dim_param for info in graph.input
            for d in info.type.tensor_type.shape.dim if d.dim_param}


def _input_tensor(info: onnx.ValueInfoProto, taken: set[str]) -> Tensor:
    kind = info.type.WhichOneof("value")
    if kind != "tensor_type":
        raise UnsupportedOpError(f"graph input {info.name!r} has type {kind or 'none'}; "
                                 "only tensor inputs are supported")
    tensor_type = info.type.tensor_type
    dtype = _dtype(tensor_type.elem_type, f"graph input {info.name!r}")
    shape = [_dim(d, info.name, axis, taken) for axis, d in enumerate(tensor_type.shape.dim)]
    return Tensor(info.name, dtype, shape)


def _dim(dim, input_name: str, axis: int, taken: set[str]) -> int | str:
    """A fixed size, a named symbol, or for an unknown size a fresh symbol named after the
    input and axis."""
    if dim.HasField("dim_value") and dim.dim_value >= 0:
        return dim.dim_value
    if dim.dim_param:
        return dim.dim_param
    fresh = f"{input_name}_dim{axis}"
    while fresh in taken:
        fresh += "_"
    taken.add(fresh)
    return fresh
