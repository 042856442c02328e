"""Quantised products as products of raw bytes: what lets the GEMM template run them on
VNNI.

A product of quantised operands, a MatMul or Conv of two DequantizeLinear (QDQ models)
or a MatMulInteger / ConvInteger with zero points (dynamically quantised ones), becomes
the integer product of the raw 8-bit operands, unsigned on the left and signed on the
right (the operands vpdpbusd takes), and corrections that are element-wise in its result,
so that post-scheduling fusion runs them, the scales and whatever follows (a bias, the
next QuantizeLinear) in its epilogue:

    sum((a - za) (b - zb)) = sum(a b) - za colsum(b) - zb rowsum(a) + K za zb

The right operand must be constant (weights): its column sums (a convolution's: per
output channel) and its shift into int8 (b - 128, for uint8 weights) are computed here. A
signed left operand is shifted into uint8 (a + 128) with its zero point. ``rowsum(a)``
(a convolution's: the sums of its windows) costs a kernel of its own, so it is computed
only where some zb is not zero (the weights quantised asymmetrically). A convolution's
padding, split off by canonicalize as zeros around the dequantised input, becomes the
input's zero point around the bytes. Products this pass does not take keep their
definition, which runs as dequantised float32 (a grouped or depthwise convolution, where
int8 does not pay) or in the rule-based loops (a per-row left zero point, a weight
computed at run time).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, NamedTuple, Optional, Sequence

import numpy as np

from treadle.graph.graph import Graph
from treadle.graph.operator import Operator
from treadle.graph.passes.fission import Primitives
from treadle.graph.rewrite import rewrite_graph
from treadle.graph.tensor import Tensor, constant
from treadle.ir import dtypes
from treadle.schedule.templates.thresholds import WORD_BYTES

SIGN = 128  # what moves an int8 into uint8 and back
RAW = {"MatMul": "MatMulInteger", "Conv": "ConvInteger"}


class Dequantized(NamedTuple):
    """A DequantizeLinear's operands: (x - zero) * scale, per ``axis`` if scale is a vector."""
    x: Tensor
    scale: Tensor
    zero: Optional[Tensor]
    axis: int


@dataclass(frozen=True)
class Product:
    """One integer product's kind: ``op_type`` (MatMulInteger or ConvInteger) with
    ``attrs``, and where its weights keep their output columns."""
    op_type: str
    attrs: Mapping

    @property
    def conv(self) -> bool:
        return self.op_type == "ConvInteger"

    def columns(self, values: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Per-column ``values`` shaped to broadcast over the result."""
        if self.conv:
            return values.reshape(1, -1, *(1,) * (weights.ndim - 2))
        return values.reshape(1, -1)

    def column_sums(self, weights: np.ndarray) -> np.ndarray:
        wide = weights.astype(np.int64)
        if self.conv:
            return self.columns(wide.reshape(wide.shape[0], -1).sum(1), weights)
        return wide.sum(axis=-2, keepdims=True)

    def depth(self, weights: np.ndarray) -> int:
        """K, the products each result sums."""
        return int(np.prod(weights.shape[1:])) if self.conv else weights.shape[-2]

    def row_sums(self, p: Primitives, a: Tensor, weights: np.ndarray) -> Tensor:
        """The sums of the left operand's bytes each result reads."""
        if self.conv:
            ones = constant(np.ones((1, *weights.shape[1:]), np.int8), f"{p.node.name}/ones")
            return p.op("ConvInteger", [a, ones], "window_sums", **self.attrs)
        axis = constant(np.array([-1], np.int64), f"{p.node.name}/axis")
        return p.op("ReduceSum", [p.cast(a, dtypes.int32, "wide"), axis], "row_sums",
                    keepdims=1)


def integer_products(graph: Graph) -> Graph:
    return rewrite_graph(graph, _rule)


def _rule(node: Operator, inputs: list[Optional[Tensor]]) -> Optional[Sequence[Tensor]]:
    if node.op_type in RAW.values():
        return _raw_bytes(node, inputs)
    if node.op_type in RAW:
        return _dequantized_product(node, inputs)
    return None


def _product(op_type: str, attrs: Mapping, weights: Tensor) -> Optional[Product]:
    """The kind of an ``op_type`` product, if this pass takes it: constant weights; for a
    convolution, one group and no padding left."""
    if not weights.is_constant or weights.rank < 2:
        return None
    op_type = RAW.get(op_type, op_type)
    if op_type == "MatMulInteger":
        return Product(op_type, {})
    auto_pad = attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if int(attrs.get("group", 1)) != 1 or auto_pad not in ("NOTSET", "VALID") \
            or any(attrs.get("pads", ())):
        return None
    return Product(op_type, attrs)


def _dequantized_product(node: Operator, inputs: list[Optional[Tensor]]
                         ) -> Optional[Sequence[Tensor]]:
    """MatMul or Conv of DequantizeLinear(a) (maybe padded with zeros) and
    DequantizeLinear(b), b constant, per-tensor scales (b's may be per column), as
    Cast(integer product) * (scale_a * scale_b) [+ bias]."""
    left, padding = _padded(inputs[0])
    left, right = _dequantized(left), _dequantized(inputs[1])
    if left is None or right is None:
        return None
    kind = _product(node.op_type, node.attrs, right.x)
    column = 0 if node.op_type == "Conv" else right.x.rank - 1
    if kind is None or not _per_tensor(left.scale) \
            or not (_per_tensor(right.scale) or (right.scale.rank == 1
                                                 and right.axis == column)):
        return None
    p = Primitives(node)
    product = _integer_product(p, kind, left.x, right.x, left.zero, right.zero, padding)
    if product is None:
        return None
    scale = p.op("Mul", [_scalar(p, left.scale, "scale_a"),
                         _along_columns(p, kind, right.scale, right.x)], "scale")
    result = p.op("Mul", [p.cast(product, scale.dtype, "float"), scale], "scaled")
    if len(inputs) > 2 and inputs[2] is not None:  # a convolution's bias
        result = p.op("Add", [result, _along_columns(p, kind, inputs[2], right.x)], "biased")
    return [result]


def _raw_bytes(node: Operator, inputs: list[Optional[Tensor]]) -> Optional[Sequence[Tensor]]:
    """A MatMulInteger or ConvInteger with zero points (or a signed left or unsigned right
    operand) as one of uint8 by int8 raw bytes plus corrections; None where it already is
    one, or where this pass does not take it."""
    a, b, zero_a, zero_b = (inputs + [None, None])[:4]
    attrs, padding = _padding_split_off(node, a)
    kind = _product(node.op_type, attrs, b)
    if kind is None or (a.dtype == dtypes.uint8 and b.dtype == dtypes.int8
                        and zero_a is None and zero_b is None and padding is None):
        return None
    product = _integer_product(Primitives(node), kind, a, b, zero_a, zero_b, padding)
    return None if product is None else [product]


def _padding_split_off(node: Operator, x: Tensor) -> tuple[Mapping, Optional[list[int]]]:
    """A ConvInteger's attributes without its explicit pads, and the widths of the Pad
    that puts them (its zero point) around its input instead."""
    pads = [int(v) for v in node.attrs.get("pads", ())]
    if node.op_type != "ConvInteger" or not any(pads) or len(pads) != 2 * (x.rank - 2):
        return node.attrs, None
    rank = len(pads) // 2
    return {**node.attrs, "pads": [0] * len(pads)}, [0, 0, *pads[:rank], 0, 0, *pads[rank:]]


def _integer_product(p: Primitives, kind: Product, a: Tensor, b: Tensor,
                     zero_a: Optional[Tensor], zero_b: Optional[Tensor],
                     padding: Optional[list[int]]) -> Optional[Tensor]:
    """The int32 result of sum((a - zero_a) (b - zero_b)) from the raw bytes; ``padding``
    (a Pad's widths) puts a's zero point around a first."""
    if not _scalar_or_absent(zero_a) or (zero_b is not None and not zero_b.is_constant):
        return None
    a, zero_a = _unsigned(p, a, zero_a)
    weights, shifts = _signed_weights(kind, b, zero_b)
    if kind.conv:
        weights, padding = _whole_words(weights, padding, a.rank)
    if padding is not None:
        fill = p.cast(zero_a, dtypes.uint8, "fill")
        widths = constant(np.array(padding, np.int64), f"{p.node.name}/widths")
        a = p.op("Pad", [a, widths, fill], "pad", mode="constant")
    raw = p.op(kind.op_type, [a, constant(weights, f"{p.node.name}/weights")], "bytes",
               **kind.attrs)
    result = raw
    if not (zero_a.is_constant and not zero_a.data.any()):
        sums = _integers(p, kind.column_sums(weights), "column_sums")
        result = p.op("Sub", [raw, p.op("Mul", [zero_a, sums], "left_zero")], "corrected")
    if np.any(shifts):
        rows = kind.row_sums(p, a, weights)
        both = p.op("Mul", [zero_a, _integers(p, kind.depth(weights) * shifts, "depth_zero")],
                    "both_zeros")
        result = p.op("Sub", [result, p.op("Mul", [rows, _integers(p, shifts, "right_zero")],
                                           "right_zero")], "less_rows")
        result = p.op("Add", [result, both], "restored")
    return result


def _whole_words(weights: np.ndarray, padding: Optional[list[int]], rank: int
                 ) -> tuple[np.ndarray, Optional[list[int]]]:
    """Weights and the input's padding widths with channels up to a multiple of a word's
    WORD_BYTES, so that packing reads whole words: the three channels of an image take
    the fourth as padding (a ResNet stem ran 10x faster than with words filled byte by
    byte past the third). The added weights are zeros and the added input channels the
    zero point, so each added product is (zero point - zero point) x weight = 0, and the
    corrections, summed over the padded channels too, stay exact."""
    extra = -weights.shape[1] % WORD_BYTES
    if not extra:
        return weights, padding
    widths = list(padding or [0] * (2 * rank))
    widths[rank + 1] += extra  # after the channels
    pad = [(0, 0), (0, extra)] + [(0, 0)] * (weights.ndim - 2)
    return np.pad(weights, pad), widths


def _unsigned(p: Primitives, a: Tensor, zero: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """The left operand as uint8 and its zero point as an int32 scalar: an int8 operand
    moved up by 128 (its zero point with it)."""
    zero = p.cast(_scalar(p, zero, "zero_a"), dtypes.int32, "zero_a32") if zero is not None \
        else _integers(p, np.array(0), "zero_a32")
    if a.dtype == dtypes.uint8:
        return a, zero
    sign = _integers(p, np.array(SIGN), "sign", dtypes.int16)
    moved = p.op("Add", [p.cast(a, dtypes.int16, "a16"), sign], "moved")
    shifted_zero = p.op("Add", [zero, _integers(p, np.array(SIGN), "sign32")], "zero_moved")
    return p.cast(moved, dtypes.uint8, "a_u8"), shifted_zero


def _signed_weights(kind: Product, b: Tensor, zero: Optional[Tensor]
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The weights as int8 and their zero points as int32, per column shaped to broadcast
    over the result (or a scalar): a uint8 weight moved down by 128, its zero point with
    it."""
    shift = np.int32(SIGN) if b.dtype == dtypes.uint8 else np.int32(0)
    weights = (b.data.astype(np.int32) - shift).astype(np.int8)
    zeros = np.zeros((), np.int32) if zero is None else zero.data.astype(np.int32)
    if zeros.size == 1:
        zeros = zeros.reshape(())
    elif zeros.ndim == 1:
        zeros = kind.columns(zeros, weights)
    return weights, zeros - shift


def _padded(t: Optional[Tensor]) -> tuple[Optional[Tensor], Optional[list[int]]]:
    """(x, widths) of a constant Pad of zeros around x (canonicalize splits a
    convolution's padding off so), else (t, None)."""
    node = t.producer if t is not None else None
    if node is None or node.op_type != "Pad" or node.attrs.get("mode", "constant") not in (
            "constant", b"constant") or len(node.inputs) > 3 and node.inputs[3] is not None:
        return t, None
    value = node.inputs[2] if len(node.inputs) > 2 else None
    widths = node.inputs[1].value
    if value is not None and not (value.is_constant and not value.data.any()) \
            or widths is None or not all(isinstance(w, int) and w >= 0 for w in widths):
        return t, None
    return node.inputs[0], list(widths)


def _dequantized(t: Optional[Tensor]) -> Optional[Dequantized]:
    """The operands of the DequantizeLinear of 8-bit values to float32 that made ``t``."""
    node = t.producer if t is not None else None
    if node is None or node.op_type != "DequantizeLinear" or node.attrs.get("block_size"):
        return None
    x = node.inputs[0]
    if x.dtype not in (dtypes.uint8, dtypes.int8) or node.outputs[0].dtype != dtypes.float32:
        return None
    zero = node.inputs[2] if len(node.inputs) > 2 else None
    return Dequantized(x, node.inputs[1], zero, int(node.attrs.get("axis", 1)) % x.rank)


def _along_columns(p: Primitives, kind: Product, values: Tensor, weights: Tensor) -> Tensor:
    """A per-tensor or per-column vector shaped to broadcast over the result."""
    if _per_tensor(values) or not kind.conv:
        return values
    return p.per_channel(values, weights.rank, f"{values.name}_columns")


def _per_tensor(t: Tensor) -> bool:
    return t.rank == 0 or (t.rank == 1 and t.shape[0] == 1)


def _scalar_or_absent(zero: Optional[Tensor]) -> bool:
    return zero is None or _per_tensor(zero)


def _scalar(p: Primitives, t: Tensor, suffix: str) -> Tensor:
    """A one-element tensor as a scalar, so that it broadcasts to any rank."""
    return t if t.rank == 0 else p.op("Reshape", [t, p.shape([], f"{suffix}_shape")], suffix)


def _integers(p: Primitives, values: np.ndarray, suffix: str, dtype=dtypes.int32) -> Tensor:
    """A constant of integer ``values``, int32 unless ``dtype`` says otherwise."""
    return constant(np.asarray(values, dtype.numpy), f"{p.node.name}/{suffix}")
