"""ONNX operators that ONNX itself defines as a function of other operators (AffineGrid,
CenterCropPad, MeanVarianceNormalization, SwiGLU, LinearAttention, ...): where treadle has
no definition of its own, a node of one is imported as the function's body.

The body is the one ONNX gives for the model's opset; some operators' bodies depend on
the node (its attributes, its inputs' types and ranks), and ONNX builds those for the node
at hand. References to the node's attributes inside the body are resolved here, falling
back to the schema's defaults.
"""
from __future__ import annotations

from typing import Optional, Sequence

import onnx
from onnx import helper

from treadle.graph.ops.common import ONNX_DTYPES
from treadle.graph.tensor import Tensor

ONNX_CODES = {dtype: code for code, dtype in ONNX_DTYPES.items()}


def _schema(op_type: str, domain: str, opset: int):
    try:
        return onnx.defs.get_schema(op_type, opset, domain=domain)
    except onnx.defs.SchemaError:
        return None


def has_function(op_type: str, domain: str, opset: Optional[int]) -> bool:
    """Whether ONNX defines the operator, at ``opset`` (None: the newest), by a function."""
    schema = _schema(op_type, domain, opset or onnx.defs.onnx_opset_version())
    return schema is not None and bool(schema.has_function
                                       or schema.has_context_dependent_function)


def function_body(node: onnx.NodeProto, inputs: Sequence[Optional[Tensor]],
                  opset: int) -> Optional[onnx.GraphProto]:
    """The body of the function defining ``node``'s operator as a graph over the
    function's inputs and outputs; None where ONNX defines the operator otherwise."""
    schema = _schema(node.op_type, node.domain, opset)
    if schema is None:
        return None
    function = _function(schema, node, inputs, opset)
    if function is None:
        return None
    attrs = {a.name: a for a in node.attribute}
    for name, attr in schema.attributes.items():
        if name not in attrs and attr.default_value.name:
            attrs[name] = attr.default_value
    nodes = [_resolved(n, attrs) for n in function.node]
    return helper.make_graph(nodes, node.op_type,
                             [helper.make_empty_tensor_value_info(i) for i in function.input],
                             [helper.make_empty_tensor_value_info(o) for o in function.output])


def _function(schema, node: onnx.NodeProto, inputs: Sequence[Optional[Tensor]],
              opset: int) -> Optional[onnx.FunctionProto]:
    """The function of the newest version at most ``opset``, built for this node's input
    types where it depends on them."""
    plain = [v for v in schema.function_opset_versions if v <= opset]
    dependent = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if not plain and not dependent:
        return None
    function = onnx.FunctionProto()
    if plain and (not dependent or max(plain) >= max(dependent)):
        function.ParseFromString(schema.get_function_with_opset_version(max(plain)))
    else:
        types = [_type(t).SerializeToString() for t in inputs]
        function.ParseFromString(schema.get_context_dependent_function_with_opset_version(
            max(dependent), node.SerializeToString(), types))
    return function


def _type(tensor: Optional[Tensor]) -> onnx.TypeProto:
    if tensor is None:
        return onnx.TypeProto()
    dims = [d if isinstance(d, int) else str(d) for d in tensor.shape]
    return helper.make_tensor_type_proto(ONNX_CODES.get(tensor.dtype, 0), dims)


def _resolved(node: onnx.NodeProto, attrs: dict) -> onnx.NodeProto:
    """``node`` with its references to the calling node's attributes replaced by their
    values (dropped where the caller has none, so the inner default holds)."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    del copy.attribute[:]
    for attr in node.attribute:
        if not attr.ref_attr_name:
            copy.attribute.append(attr)
        elif attr.ref_attr_name in attrs:
            value = onnx.AttributeProto()
            value.CopyFrom(attrs[attr.ref_attr_name])
            value.name = attr.name
            copy.attribute.append(value)
    return copy
