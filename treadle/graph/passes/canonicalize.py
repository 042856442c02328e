"""Canonical forms that later stages rely on, as a table of rules keyed by op type:

* identities disappear: Identity, inference Dropout, reshapes to the same shape, casts to
  the same dtype, resizes to the same size (by sizes, or by scales of 1);
* Gemm becomes Transpose / MatMul / Mul / Add, so the matmul template and fusion see a
  plain MatMul and an element-wise epilogue;
* Attention's common case becomes MatMul / Softmax / MatMul (``passes.attention``), for
  the same reason;
* ConvTranspose with constant weights becomes one Conv of its stride phases and a pixel
  shuffle (``passes.conv_transpose``);
* BatchNormalization after a convolution with constant weights is folded into them;
  elsewhere it becomes a per-channel multiply-add;
* a convolution's taps that read only padding for every output are cut from its weights
  (``passes.conv_taps``: a 3x3 at dilation 36 on a 28x28 map is a 1x1), and one whose
  taps mostly read padding is a sum of its taps, each over the outputs it reaches;
* a dense (or grouped GEMM) convolution with explicit padding reads a padded copy of its input
  (Pad, then Conv without pads): the copy costs one pass over the input, while checking
  bounds at every one of the kernel-size-many reads of each input element in the GEMM's
  packing doubled the cost of ResNet's 3x3 convolutions;
* ``x * tanh(softplus(x))`` is Mish;
* a gather or scatter reads indices computed at run time through ``CheckIndices``, which
  fails on one out of range; known indices are checked here, and read through
  ``CheckIndices`` too when they index an axis of symbolic size, which only run time knows.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from treadle.graph.graph import Graph
from treadle.graph.known import small_contents
from treadle.graph.operator import Operator, apply
from treadle.errors import ModelError
from treadle.graph.ops.transform import index_bounds, out_of_range
from treadle.graph.passes.attention import decompose_attention
from treadle.graph.passes.channels_last import grouped_gemm
from treadle.graph.passes.conv_taps import by_taps, without_dead_taps
from treadle.graph.passes.conv_transpose import decompose_conv_transpose, zero_padded
from treadle.graph.passes.fission import Primitives
from treadle.graph.rewrite import consumers, reapply, rewrite_graph, sole_reader
from treadle.graph.tensor import Tensor, constant

Rule = Callable[[Operator, list, dict], Optional[Sequence[Tensor]]]


def canonicalize(graph: Graph) -> Graph:
    readers = consumers(graph)

    def rule(node: Operator, inputs: list) -> Optional[Sequence[Tensor]]:
        handler = RULES.get(node.op_type)
        return None if handler is None else handler(node, inputs, readers)
    return rewrite_graph(graph, rule)


def _forward(node: Operator, inputs: list, readers) -> Optional[Sequence[Tensor]]:
    if len(node.outputs) != 1:
        return None
    return [inputs[0]]


def _same_shape(node: Operator, inputs: list, readers) -> Optional[Sequence[Tensor]]:
    if node.outputs[0].shape == inputs[0].shape:
        return [inputs[0]]
    return None


def _same_dtype(node: Operator, inputs: list, readers) -> Optional[Sequence[Tensor]]:
    if node.outputs[0].dtype == inputs[0].dtype:
        return [inputs[0]]
    return None


def _same_size(node: Operator, inputs: list, readers) -> Optional[Sequence[Tensor]]:
    """A resize to its input's size maps each position to itself, unless scales other than
    1 round to the same length (which moves the positions within it) or it crops."""
    if node.attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        return None
    scales = inputs[2] if len(inputs) > 2 else None
    unscaled = scales is None or (scales.is_constant and bool(np.all(scales.data == 1)))
    return _same_shape(node, inputs, readers) if unscaled else None


def _gemm(node: Operator, inputs: list, readers) -> Optional[Sequence[Tensor]]:
    a, b = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    attrs = node.attrs
    name = node.name
    if attrs.get("transA", 0):
        a = apply("Transpose", [a], {"perm": [1, 0]}, f"{name}/transpose_a")[0]
    if attrs.get("transB", 0):
        b = apply("Transpose", [b], {"perm": [1, 0]}, f"{name}/transpose_b")[0]
    y = apply("MatMul", [a, b], {}, f"{name}/matmul")[0]
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if alpha != 1.0:
        y = apply("Mul", [y, constant(np.float32(alpha), f"{name}/alpha", y.dtype)], {},
                  f"{name}/scale")[0]
    if bias is not None and beta != 0.0:
        if beta != 1.0:
            bias = apply("Mul", [bias, constant(np.float32(beta), f"{name}/beta", bias.dtype)],
                         {}, f"{name}/scale_bias")[0]
        y = apply("Add", [y, bias], {}, f"{name}/bias")[0]
    return [y]


def _batch_norm(node: Operator, inputs: list, readers) -> Optional[Sequence[Tensor]]:
    x, scale, bias, mean, var = inputs[:5]
    if node.attrs.get("training_mode", 0) or len(node.outputs) != 1:
        return None
    if not all(t.is_constant for t in (scale, bias, mean, var)):
        return None
    eps = float(node.attrs.get("epsilon", 1e-5))
    factor = (scale.data.astype(np.float64) / np.sqrt(var.data.astype(np.float64) + eps))
    shift = bias.data.astype(np.float64) - mean.data * factor
    conv = x.producer
    if (conv is not None and conv.op_type == "Conv" and conv.inputs[1].is_constant
            and sole_reader(readers, node.inputs[0])):
        return [_fold_into_conv(conv, factor, shift, x.dtype)]
    channel_shape = (-1,) + (1,) * (x.rank - 2)
    k = constant(factor.astype(np.float32).reshape(channel_shape), f"{node.name}/factor", x.dtype)
    s = constant(shift.astype(np.float32).reshape(channel_shape), f"{node.name}/shift", x.dtype)
    y = apply("Mul", [x, k], {}, f"{node.name}/mul")[0]
    return [apply("Add", [y, s], {}, f"{node.name}/add")[0]]


def _fold_into_conv(conv: Operator, factor, shift, dtype) -> Tensor:
    weight = conv.inputs[1].data
    bias = conv.inputs[2].data if len(conv.inputs) > 2 and conv.inputs[2] is not None else 0.0
    new_weight = weight * factor.reshape((-1,) + (1,) * (weight.ndim - 1))
    new_bias = bias * factor + shift
    inputs = [conv.inputs[0], constant(new_weight.astype(weight.dtype), f"{conv.name}/w_bn", dtype),
              constant(new_bias.astype(weight.dtype), f"{conv.name}/b_bn", dtype)]
    return apply("Conv", inputs, conv.attrs, conv.name)[0]


def _conv(node: Operator, inputs: list, readers) -> Optional[Sequence[Tensor]]:
    """A convolution over its live taps only, or as a sum of its taps each over the
    outputs it reaches (``passes.conv_taps``); then without pads."""
    summed = by_taps(node, inputs)
    if summed is not None:
        return [summed]
    live = without_dead_taps(node, inputs)
    if live is None:
        return _conv_padding(node, inputs, readers)
    return _conv_padding(live, list(live.inputs), readers) or live.outputs


def _conv_padding(node: Operator, inputs: list, readers) -> Optional[Sequence[Tensor]]:
    x, attrs = inputs[0], node.attrs
    rank = x.rank - 2
    pads = [int(p) for p in attrs.get("pads", [0] * 2 * rank)]
    auto_pad = attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if (int(attrs.get("group", 1)) != 1 and not grouped_gemm(node)) or auto_pad != "NOTSET" \
            or not any(pads):
        return None
    if len(pads) != 2 * rank:
        return None  # the Conv definition reports the malformed attribute
    return [apply("Conv", [zero_padded(Primitives(node), x, pads), *inputs[1:]],
                  {**attrs, "pads": [0] * 2 * rank}, node.name)[0]]


def _check_indices(node: Operator, inputs: list, readers) -> Optional[Sequence[Tensor]]:
    data, indices = inputs[0], inputs[1]
    if data is None or indices is None or not indices.dtype.is_integer:
        return None  # the gather's definition reports it
    if indices.producer is not None and indices.producer.op_type == "CheckIndices":
        return None
    attrs = _index_axes(node, data, indices)
    if attrs is None:
        return None
    known = small_contents(indices)
    if known is not None and _check_known(known, data, attrs):
        return None
    checked = apply("CheckIndices", [indices, data], attrs, f"{node.name}/check_indices")[0]
    return reapply(node, [data, checked, *inputs[2:]])


def _index_axes(node: Operator, data: Tensor, indices: Tensor) -> Optional[dict]:
    """CheckIndices' attributes for a gather, or None if its attributes are malformed
    (its definition reports them)."""
    where = {"node": node.name, "op": node.op_type}
    if node.op_type in ("GatherND", "ScatterND"):
        depth = indices.shape[-1] if indices.rank else None
        batch = node.attrs.get("batch_dims", 0)
        if not isinstance(depth, int) or batch + depth > data.rank:
            return None
        return {**where, "axes": list(range(batch, batch + depth)), "tuples": 1}
    axis = int(node.attrs.get("axis", 0))
    if not -data.rank <= axis < data.rank:
        return None
    return {**where, "axes": [axis % data.rank]}


def _check_known(known: np.ndarray, data: Tensor, attrs: dict) -> bool:
    """Raises on a known index out of range of an axis of known size; returns whether that
    decided every index, so that no run-time check is left (none indexes a symbolic size)."""
    sizes = index_bounds(known.shape, data.shape, attrs)
    columns = known.reshape(-1, len(sizes)) if attrs.get("tuples") else known.reshape(-1, 1)
    for j, size in enumerate(sizes):
        if not isinstance(size, int):
            continue
        bad = columns[:, j][(columns[:, j] < -size) | (columns[:, j] >= size)]
        if bad.size:
            raise ModelError(out_of_range(attrs, int(bad[0]), j, size))
    return known.size == 0 or all(isinstance(size, int) for size in sizes)


def _mish(node: Operator, inputs: list, readers) -> Optional[Sequence[Tensor]]:
    """``x * tanh(softplus(x))``, as exporters write Mish before opset 18, is Mish: one
    exponential per element instead of an exponential, a logarithm and a tanh (the
    logarithm, a libm call, also kept the kernel from vectorising)."""
    if len(inputs) != 2:
        return None
    for x, other in (inputs, inputs[::-1]):
        tanh = other.producer if other is not None else None
        if tanh is None or tanh.op_type != "Tanh":
            continue
        softplus = tanh.inputs[0].producer
        if softplus is not None and softplus.op_type == "Softplus" \
                and softplus.inputs[0] is x:
            return [apply("Mish", [x], {}, node.name)[0]]
    return None


RULES: dict[str, Rule] = {
    "Identity": _forward,
    "Dropout": _forward,
    "Reshape": _same_shape,
    "Flatten": _same_shape,
    "Squeeze": _same_shape,
    "Unsqueeze": _same_shape,
    "Cast": _same_dtype,
    "Resize": _same_size,
    "Gemm": _gemm,
    "Attention": decompose_attention,
    "BatchNormalization": _batch_norm,
    "Conv": _conv,
    "ConvTranspose": decompose_conv_transpose,
    "Mul": _mish,
    "Gather": _check_indices,
    "GatherElements": _check_indices,
    "GatherND": _check_indices,
    "ScatterElements": _check_indices,
    "ScatterND": _check_indices,
}
