"""Pointwise convolutions of enlarged images run before the enlarging.

A 1x1 convolution mixes the channels of each pixel; nearest and linear resizing blend
pixels of each channel with weights that sum to one. The two commute, a bias included:
``Conv(Resize(x)) == Resize(Conv(x))``. Where the resize enlarges the image and the
convolution does not add channels, the second order does the same products on fewer
pixels and resizes fewer channels.

A convolution over a concatenation of channels splits into one convolution per part,
summed, and each part that is such a resize then convolves before it. Segformer's
all-MLP decoder is the case: four stages of 256 channels, three resized up to the first
stage's 128 x 128, concatenated and fused by one 1x1 convolution of 1024 channels, the
costliest layer of Segformer-B0 (4.3 of its 8 GMAC). Split, its products fall to 1.4
GMAC, and no 1024-channel image is written.

Rounding differs from the model's order by a few units in the last place (sums taken in
another order), as any reassociation does.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import numpy as np

from treadle.graph.graph import Graph
from treadle.graph.operator import Operator, apply
from treadle.graph.rewrite import consumers, rewrite_graph, sole_reader
from treadle.graph.tensor import Tensor, constant

# Resize attributes under which output pixels blend input pixels with weights summing to
# one (antialias, keep_aspect_ratio_policy and axes are left to the unchanged order).
BLENDING_MODES = ("nearest", "linear")
SOURCE_AXES = "axes"


def resize_conv(graph: Graph) -> Graph:
    sole = functools.partial(sole_reader, consumers(graph))

    def rule(node: Operator, inputs: list) -> Optional[Sequence[Tensor]]:
        if node.op_type != "Conv" or not pointwise(node, inputs):
            return None
        return _split(node, inputs, sole)
    return rewrite_graph(graph, rule)


def pointwise(node: Operator, inputs: list) -> bool:
    """A 1x1 convolution of one group, stride 1, unpadded, constant weights and bias."""
    x, weight = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    attrs = node.attrs
    return (weight is not None and weight.is_constant and weight.rank >= 3
            and (bias is None or bias.is_constant) and x.rank == weight.rank
            and all(d == 1 for d in weight.shape[2:]) and int(attrs.get("group", 1)) == 1
            and all(s == 1 for s in attrs.get("strides", [1]))
            and all(p == 0 for p in attrs.get("pads", [0]))
            and isinstance(x.shape[1], int) and x.dtype.is_float)


def _split(node: Operator, inputs: list, sole) -> Optional[Sequence[Tensor]]:
    x, weight = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    parts = _parts(node.inputs[0], x, sole)
    cout = weight.shape[0]
    enlarging = [_enlarging(old, new, cout, sole) for old, new in parts]
    if not any(enlarging):
        return None
    attrs = {k: v for k, v in node.attrs.items() if k != "group"}
    terms, offset = [], 0
    for k, ((_, part), moved) in enumerate(zip(parts, enlarging)):
        width = part.shape[1]
        w = constant(np.ascontiguousarray(weight.data[:, offset:offset + width]),
                     f"{weight.name}/part{k}", weight.dtype)
        offset += width
        if moved:
            resize = part.producer
            y = apply("Conv", [resize.inputs[0], w], attrs, f"{node.name}/part{k}")[0]
            y = apply("Resize", _resize_inputs(resize, y, cout), resize.attrs,
                      f"{resize.name}/after_conv")[0]
        else:
            y = apply("Conv", [part, w], attrs, f"{node.name}/part{k}")[0]
        terms.append(y)
    total = terms[0]
    for k, term in enumerate(terms[1:], start=1):
        total = apply("Add", [total, term], name=f"{node.name}/sum{k}")[0]
    if bias is not None:
        shape = (cout,) + (1,) * (x.rank - 2)
        b = constant(bias.data.reshape(shape), f"{bias.name}/image", bias.dtype)
        total = apply("Add", [total, b], name=f"{node.name}/bias")[0]
    return [total]


def _parts(old: Tensor, new: Tensor, sole) -> list[tuple[Tensor, Tensor]]:
    """The (old, new) tensors concatenated along the channels into ``new`` where only the
    convolution reads that concatenation, else ``new`` alone."""
    concat, before = new.producer, old.producer
    if (concat is None or concat.op_type != "Concat" or not sole(old)
            or int(concat.attrs.get("axis", 0)) % new.rank != 1
            or any(t is None or not isinstance(t.shape[1], int) for t in concat.inputs)):
        return [(old, new)]
    return list(zip(before.inputs, concat.inputs))


def _enlarging(old: Tensor, new: Tensor, cout: int, sole) -> bool:
    """Whether ``new`` is a resize (read only here) that blends pixels of each channel,
    enlarges the image and has at least ``cout`` channels."""
    resize = new.producer
    if resize is None or resize.op_type != "Resize" or not sole(old):
        return False
    x, attrs = resize.inputs[0], resize.attrs
    given = [t for t in resize.inputs[2:4] if t is not None]  # scales, sizes
    if (attrs.get("mode", "nearest") not in BLENDING_MODES or attrs.get("antialias", 0)
            or attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch"
            or attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize"
            or SOURCE_AXES in attrs or not all(t.is_constant for t in given)
            or tuple(x.shape[:2]) != tuple(new.shape[:2])
            or not isinstance(x.shape[1], int) or x.shape[1] < cout):
        return False
    pixels_in, pixels_out = _pixels(x), _pixels(new)
    return pixels_in is not None and pixels_out is not None and pixels_in < pixels_out


def _pixels(t: Tensor) -> Optional[int]:
    spatial = t.shape[2:]
    return int(np.prod(spatial)) if all(isinstance(d, int) for d in spatial) else None


def _resize_inputs(resize: Operator, y: Tensor, channels: int) -> list:
    """The resize's inputs for ``y``: its scales as they are (1 on the channels), its
    sizes with ``channels`` for the channels."""
    inputs = [y, *resize.inputs[1:]]
    if len(inputs) > 3 and inputs[3] is not None:
        sizes = np.array(inputs[3].data, dtype=np.int64)
        sizes[1] = channels
        inputs[3] = constant(sizes, f"{resize.name}/sizes_after_conv")
    return inputs
