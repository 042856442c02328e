"""Operator fission (Korch, ASPLOS'24, section 3): composite operators become primitives.

A composite operator such as Softmax or LayerNormalization does in one node what a few
simpler ones could do apart, and a kernel holding all of it cannot share its parts with
its neighbours. Fission rewrites such a node into primitives of four kinds: element-wise
(Sub, Exp, Mul, Sqrt, Erf, Max, Cast, ...), reduce and broadcast (ReduceMax, ReduceSum,
ReduceMean; broadcasting is implicit in the element-wise ops), layout (Reshape) and linear
(MatMul, Conv, which are primitives already; a product whose left factor is divided
row by row, as attention's softmax is, divides its result instead). Each primitive is an
ordinary graph operator with its own definition, so kernel orchestration is free to group
them differently from the operator that made them.

The rules are a table keyed by op type; an op type without a rule keeps its node. Every
rule works in the node's input dtype (or the work dtype its definition names: a
normalisation's stash type, float32 for half-precision statistics), and never needs a
concrete size: a mean over a symbolic extent is a ReduceMean.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from treadle.graph.graph import Graph
from treadle.graph.operator import Operator, apply
from treadle.graph.ops.common import ONNX_DTYPES
from treadle.graph.ops.reduce import accumulator
from treadle.graph.ops.shape import dims_tensor
from treadle.graph.rewrite import rewrite_graph
from treadle.graph.tensor import Dim, Tensor, constant
from treadle.ir import dtypes
from treadle.ir.dtypes import DataType

Rule = Callable[[Operator, list], Optional[Sequence[Tensor]]]

ONNX_CODES: dict[DataType, int] = {dtype: code for code, dtype in ONNX_DTYPES.items()}


def fission(graph: Graph) -> Graph:
    def rule(node: Operator, inputs: list) -> Optional[Sequence[Tensor]]:
        split = RULES.get(node.op_type)
        return None if split is None else split(node, inputs)
    return rewrite_graph(graph, rule)


class Primitives:
    """Makes the primitives replacing one node, each named after it (``node/suffix``)."""

    def __init__(self, node: Operator):
        self.node = node

    def op(self, op_type: str, inputs: Sequence[Tensor], suffix: str, **attrs) -> Tensor:
        return apply(op_type, inputs, attrs, f"{self.node.name}/{suffix}")[0]

    def constant(self, value, dtype: DataType, suffix: str) -> Tensor:
        """``value`` as a constant of ``dtype``. treadle holds bfloat16 as raw bits, so a
        bfloat16 constant is a float32 one cast by a Cast (constant folding rounds it)."""
        if dtype == dtypes.bfloat16:
            wide = constant(np.asarray(value, np.float32), f"{self.node.name}/{suffix}_f32")
            return self.cast(wide, dtype, suffix)
        return constant(np.asarray(value, np.float64), f"{self.node.name}/{suffix}", dtype)

    def cast(self, x: Tensor, dtype: DataType, suffix: str) -> Tensor:
        if x.dtype == dtype:
            return x
        return self.op("Cast", [x], suffix, to=ONNX_CODES[dtype])

    def per_channel(self, v: Tensor, rank: int, suffix: str) -> Tensor:
        """A vector of one value per channel, shaped to broadcast over axis 1 of a
        tensor of ``rank`` (C x 1 x ... x 1)."""
        return self.op("Reshape", [v, self.shape([-1] + [1] * (rank - 2), f"{suffix}_shape")],
                       suffix)

    def shape(self, dims: Sequence[Dim], suffix: str) -> Tensor:
        """A Reshape's shape operand (or a Slice's bounds), symbolic sizes included."""
        return dims_tensor(dims, f"{self.node.name}/{suffix}")


def _axis(node: Operator, x: Tensor, default: int) -> int:
    return int(node.attrs.get("axis", default)) % x.rank


# ---- softmax ------------------------------------------------------------------------------

def _softmax_parts(node: Operator, x: Tensor
                   ) -> tuple[Primitives, Tensor, Tensor, Tensor]:
    """x - max, its exponentials and their sum (keeping the axis): the maximum is
    subtracted so that exp never overflows."""
    p, axes = Primitives(node), [_axis(node, x, -1)]
    high = p.op("ReduceMax", [x], "max", axes=axes, keepdims=1)
    shifted = p.op("Sub", [x, high], "shifted")
    exps = p.op("Exp", [shifted], "exp")
    return p, shifted, exps, p.op("ReduceSum", [exps], "sum", axes=axes, keepdims=1)


def _softmax(node: Operator, inputs: list) -> Sequence[Tensor]:
    p, _, exps, total = _softmax_parts(node, inputs[0])
    return [p.op("Div", [exps, total], "softmax")]


def _log_softmax(node: Operator, inputs: list) -> Sequence[Tensor]:
    p, shifted, _, total = _softmax_parts(node, inputs[0])
    return [p.op("Sub", [shifted, p.op("Log", [total], "log_sum")], "log_softmax")]


# ---- normalisations -----------------------------------------------------------------------

def _moments(p: Primitives, x: Tensor, axes: list[int], epsilon: float
             ) -> tuple[Tensor, Tensor, Tensor]:
    """The mean over ``axes``, x minus it, and sqrt(variance + epsilon); the variance is
    the mean of squared deviations, so a large mean costs no precision."""
    mean = p.op("ReduceMean", [x], "mean", axes=axes, keepdims=1)
    centred = p.op("Sub", [x, mean], "centred")
    squares = p.op("Mul", [centred, centred], "squares")
    variance = p.op("ReduceMean", [squares], "variance", axes=axes, keepdims=1)
    eps = p.constant(epsilon, x.dtype, "epsilon")
    return mean, centred, p.op("Sqrt", [p.op("Add", [variance, eps], "variance_eps")], "std")


def _stash_type(node: Operator) -> DataType:
    return ONNX_DTYPES[int(node.attrs.get("stash_type", 1))]


def _epsilon(node: Operator) -> float:
    return float(node.attrs.get("epsilon", 1e-5))


def _layer_norm(node: Operator, inputs: list) -> Sequence[Tensor]:
    """Statistics in the stash type, then as ONNX's function of it: the normalised value
    rounded to x's dtype, times the scale, plus the bias. Mean and InvStdDev, when the
    node asks for them, are the statistics (in the stash type, reduced axes kept)."""
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    p = Primitives(node)
    axes = list(range(_axis(node, x, -1), x.rank))
    mean, centred, std = _moments(p, p.cast(x, _stash_type(node), "stash"), axes,
                                  _epsilon(node))
    y = p.cast(p.op("Div", [centred, std], "normalized"), x.dtype, "normalized_cast")
    y = p.op("Mul", [y, scale], "scaled")
    if bias is not None:
        y = p.op("Add", [y, bias], "biased")
    outputs = [y, mean]
    if len(node.outputs) > 2:
        outputs.append(p.op("Reciprocal", [std], "inv_std_dev"))
    return outputs[:len(node.outputs)]


def _rms_norm(node: Operator, inputs: list) -> Sequence[Tensor]:
    """x / sqrt(mean(x²) + epsilon) in the stash type, rounded to x's dtype, times the
    scale (in the scale's dtype, as the definition does)."""
    x, scale = inputs[0], inputs[1]
    p = Primitives(node)
    axes = list(range(_axis(node, x, -1), x.rank))
    wide = p.cast(x, _stash_type(node), "stash")
    squares = p.op("Mul", [wide, wide], "squares")
    mean_square = p.op("ReduceMean", [squares], "mean_square", axes=axes, keepdims=1)
    eps = p.constant(_epsilon(node), wide.dtype, "epsilon")
    rms = p.op("Sqrt", [p.op("Add", [mean_square, eps], "mean_square_eps")], "rms")
    y = p.cast(p.op("Div", [wide, rms], "normalized"), x.dtype, "normalized_cast")
    return [p.op("Mul", [p.cast(y, scale.dtype, "scale_cast"), scale], "scaled")]


def _instance_norm(node: Operator, inputs: list, channels_last: bool = False
                   ) -> Sequence[Tensor]:
    """Per sample and channel over the spatial axes, in float32 for half precision as
    the definition does; scale and bias are per channel. Channels-last (N x spatial x C,
    as ``passes.channels_last`` leaves Candy's), the per-channel vectors broadcast along
    the last axis as they are."""
    x, scale, bias = inputs[:3]
    p = Primitives(node)
    work = accumulator(x.dtype)
    spatial = list(range(1, x.rank - 1) if channels_last else range(2, x.rank))
    _, centred, std = _moments(p, p.cast(x, work, "wide"), spatial, _epsilon(node))
    normalized = p.op("Div", [centred, std], "normalized")
    return [_scaled_per_channel(p, normalized, scale, bias, x.dtype, channels_last)]


def _group_norm(node: Operator, inputs: list, channels_last: bool = False
                ) -> Optional[Sequence[Tensor]]:
    """The channels viewed as groups (a Reshape: N x G x rest, or N x pixels x G x C/G
    channels-last), moments per sample and group, viewed back, then scaled and shifted
    per channel. The views need the constant sizes of all but the batch; a symbolic image
    keeps the node."""
    x, scale, bias = inputs[:3]
    sizes = x.shape[1:]
    if not all(isinstance(d, int) for d in sizes):
        return None
    groups = int(node.attrs["num_groups"])
    channels = sizes[-1] if channels_last else sizes[0]
    p = Primitives(node)
    work = accumulator(x.dtype) if int(node.attrs.get("stash_type", 1)) == 1 else x.dtype
    grouped = [0, -1, groups, channels // groups] if channels_last else [0, groups, -1]
    view = p.op("Reshape", [p.cast(x, work, "wide"), p.shape(grouped, "grouped_shape")],
                "grouped")
    _, centred, std = _moments(p, view, [1, 3] if channels_last else [2], _epsilon(node))
    normalized = p.op("Reshape", [p.op("Div", [centred, std], "normalized"),
                                  p.shape([0, *sizes], "image_shape")], "image")
    return [_scaled_per_channel(p, normalized, scale, bias, x.dtype, channels_last)]


def _scaled_per_channel(p: Primitives, normalized: Tensor, scale: Tensor, bias: Tensor,
                        dtype: DataType, channels_last: bool) -> Tensor:
    """normalized * scale + bias in the work dtype of ``normalized``, then ``dtype``;
    the vectors along axis 1, or as they are along the last axis channels-last."""
    work, rank = normalized.dtype, normalized.rank
    scale, bias = p.cast(scale, work, "scale_wide"), p.cast(bias, work, "bias_wide")
    if not channels_last:
        scale = p.per_channel(scale, rank, "scale_channels")
        bias = p.per_channel(bias, rank, "bias_channels")
    y = p.op("Mul", [normalized, scale], "scaled")
    return p.cast(p.op("Add", [y, bias], "biased"), dtype, "narrow")


def _batch_norm(node: Operator, inputs: list) -> Sequence[Tensor]:
    """Inference: x * factor + shift per channel, with factor = scale / sqrt(var + eps)
    and shift = bias - mean * factor computed here when the statistics are constants;
    otherwise (x - mean) * factor + bias, factor computed on the channel vectors."""
    if node.attrs.get("training_mode", 0):
        return None  # the statistics are the batch's own: the node stays whole
    x, scale, bias, mean, var = inputs[:5]
    p, eps = Primitives(node), _epsilon(node)
    if all(t.is_constant for t in (scale, bias, mean, var)):
        factor = scale.data.astype(np.float64) / np.sqrt(var.data.astype(np.float64) + eps)
        shift = bias.data.astype(np.float64) - mean.data.astype(np.float64) * factor
        shape = (-1,) + (1,) * (x.rank - 2)
        y = p.op("Mul", [x, p.constant(factor.reshape(shape), x.dtype, "factor")], "scaled")
        return [p.op("Add", [y, p.constant(shift.reshape(shape), x.dtype, "shift")], "shifted")]
    scale, bias, mean, var = (p.cast(t, x.dtype, f"{name}_cast") for t, name in
                              ((scale, "scale"), (bias, "bias"), (mean, "mean"), (var, "var")))
    var_eps = p.op("Add", [var, p.constant(eps, x.dtype, "epsilon")], "var_eps")
    factor = p.op("Div", [scale, p.op("Sqrt", [var_eps], "std")], "factor")
    centred = p.op("Sub", [x, p.per_channel(mean, x.rank, "mean_channels")], "centred")
    y = p.op("Mul", [centred, p.per_channel(factor, x.rank, "factor_channels")], "scaled")
    return [p.op("Add", [y, p.per_channel(bias, x.rank, "bias_channels")], "biased")]


# ---- activations --------------------------------------------------------------------------

def _gelu(node: Operator, inputs: list) -> Sequence[Tensor]:
    """0.5 x (1 + erf(x / sqrt 2)), or with approximate="tanh"
    0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x³)))."""
    x, p = inputs[0], Primitives(node)
    if node.attrs.get("approximate", "none") == "tanh":
        cube = p.op("Mul", [p.op("Mul", [x, x], "square"), x], "cube")
        cubic = p.op("Mul", [cube, p.constant(0.044715, x.dtype, "coefficient")], "cubic")
        inner = p.op("Mul", [p.op("Add", [x, cubic], "polynomial"),
                             p.constant(np.sqrt(2 / np.pi), x.dtype, "sqrt_2_over_pi")], "inner")
        curve = p.op("Tanh", [inner], "tanh")
    else:
        scaled = p.op("Mul", [x, p.constant(1 / np.sqrt(2), x.dtype, "rsqrt_2")], "scaled")
        curve = p.op("Erf", [scaled], "erf")
    one_plus = p.op("Add", [curve, p.constant(1.0, x.dtype, "one")], "one_plus")
    half_x = p.op("Mul", [x, p.constant(0.5, x.dtype, "half")], "half_x")
    return [p.op("Mul", [half_x, one_plus], "gelu")]


def _hard_sigmoid_of(p: Primitives, x: Tensor, alpha: float, beta: float) -> Tensor:
    """max(0, min(1, alpha x + beta)), operands in the definition's order (which one a
    NaN comes from depends on it)."""
    line = p.op("Add", [p.op("Mul", [x, p.constant(alpha, x.dtype, "alpha")], "scaled"),
                        p.constant(beta, x.dtype, "beta")], "line")
    upper = p.op("Min", [p.constant(1.0, x.dtype, "one"), line], "upper")
    return p.op("Max", [p.constant(0.0, x.dtype, "zero"), upper], "hard_sigmoid")


def _hard_sigmoid(node: Operator, inputs: list) -> Sequence[Tensor]:
    alpha, beta = float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))
    return [_hard_sigmoid_of(Primitives(node), inputs[0], alpha, beta)]


def _hard_swish(node: Operator, inputs: list) -> Sequence[Tensor]:
    """x * HardSigmoid(x) with alpha 1/6 and beta 1/2."""
    x, p = inputs[0], Primitives(node)
    return [p.op("Mul", [x, _hard_sigmoid_of(p, x, 1 / 6, 0.5)], "hard_swish")]


# ---- pooling ------------------------------------------------------------------------------

def _global_average_pool(node: Operator, inputs: list) -> Sequence[Tensor]:
    x = inputs[0]
    return [Primitives(node).op("ReduceMean", [x], "mean", axes=list(range(2, x.rank)),
                                 keepdims=1)]


def _average_pool(node: Operator, inputs: list) -> Optional[Sequence[Tensor]]:
    """A pool whose one window is the whole unpadded input is a global one; any other
    keeps its window template."""
    x, attrs = inputs[0], node.attrs
    spatial = list(x.shape[2:])
    no_pads = (not any(attrs.get("pads", ()))
               and attrs.get("auto_pad", "NOTSET") in ("NOTSET", "VALID"))
    undilated = all(d == 1 for d in attrs.get("dilations", ()))
    if list(attrs.get("kernel_shape", ())) == spatial and no_pads and undilated:
        return _global_average_pool(node, inputs)
    return None


# ---- products of row-scaled factors --------------------------------------------------------

def _matmul(node: Operator, inputs: list) -> Optional[Sequence[Tensor]]:
    """(e / s) @ v with s constant along the rows of e (a softmax's sum) is (e @ v) / s:
    the division moves after the product (Korch's Figure 2), so the exponentials can be
    computed where the product loads them and the division applied where it stores."""
    scaled, v = inputs
    divide = scaled.producer
    # Only real division commutes with the product: integer division truncates.
    if divide is None or divide.op_type != "Div" or not scaled.dtype.is_float \
            or v.rank < 2 or scaled.rank < 2:
        return None
    e, s = divide.inputs
    if e.shape != scaled.shape or s.rank > e.rank or s.rank == 0 or s.shape[-1] != 1:
        return None
    p = Primitives(node)
    return [p.op("Div", [p.op("MatMul", [e, v], "unscaled"), s], "scaled")]


RULES: dict[str, Rule] = {
    "MatMul": _matmul,
    "Softmax": _softmax,
    "LogSoftmax": _log_softmax,
    "LayerNormalization": _layer_norm,
    "RMSNormalization": _rms_norm,
    "InstanceNormalization": _instance_norm,
    "ChannelsLastInstanceNormalization": lambda node, inputs: _instance_norm(node, inputs, True),
    "GroupNormalization": _group_norm,
    "ChannelsLastGroupNormalization": lambda node, inputs: _group_norm(node, inputs, True),
    "BatchNormalization": _batch_norm,
    "Gelu": _gelu,
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": _hard_swish,
    "GlobalAveragePool": _global_average_pool,
    "AveragePool": _average_pool,
}
