"""Taps of a convolution that read only padding are dropped when compiling, and taps that
read it for most outputs run over the outputs they reach alone.

A dilated convolution's taps lie ``dilation`` apart, so on a small image the outer ones
may fall in the zero padding for every output: a DeepLabV3 head's 3x3 convolution at
dilation 36 on a 28x28 map reads the image through its centre tap alone, yet computed
all nine (4.5 ms, 0.59x ONNX Runtime). Along each spatial axis, the taps before the
first and after the last that reach the image for some output are cut from the constant
weights, and the padding shrinks by what they spanned: the result is the same
convolution over fewer taps, a padding that became negative cropping the input instead.

At dilation 24 on the same map, every tap reaches the image, but the outer ones for four
rows or columns of 28: the convolution becomes a sum over its taps of 1x1 convolutions,
each over the outputs its tap reaches and reading the input window that feeds them,
padded back to the whole output (``by_taps``), when that is under TAP_WORK of the work
of the live taps at every output. Each tap's weights are read once, as before.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from treadle.graph.operator import Operator, apply
from treadle.graph.passes.fission import Primitives
from treadle.graph.tensor import Tensor, normalize_dim


def live_taps(size: int, out: int, kernel: int, stride: int, dilation: int, before: int
              ) -> tuple[int, int]:
    """The first and last tap along one axis that reads the image (not padding) for some
    output, or (0, -1) when none does."""
    alive = [t for t in range(kernel) if _reaches(size, out, stride, t * dilation - before)]
    return (alive[0], alive[-1]) if alive else (0, -1)


def _reaches(size: int, out: int, stride: int, offset: int) -> bool:
    first, last = _reached(size, out, stride, offset)
    return first <= last


def _reached(size: int, out: int, stride: int, offset: int) -> tuple[int, int]:
    """The first and last output o < out with ``o * stride + offset`` in [0, size)
    (first > last when there is none)."""
    first = max(0, -(offset // stride))  # the smallest o with o * stride + offset >= 0
    last = min(out - 1, (size - 1 - offset) // stride)
    return first, last


# The share of a convolution's work (every tap that reaches the image, at every output)
# under which it runs as a sum of its taps, each over the outputs it reaches: a 3x3 at
# dilation 24 on a 28x28 map does 18% of it so; an ordinary 3x3 padded by one on 56x56,
# 98%.
TAP_WORK = 0.6


# The fewest multiply-adds a sum of taps must save: each tap is a kernel of its own, and
# a small image's nine kernels cost more to run than the padding's products.
MIN_SAVED = 1 << 22


@dataclass(frozen=True)
class _Sizes:
    """A convolution's static sizes along its spatial axes."""
    image: tuple[int, ...]
    out: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # all before, then all after

    def reached(self, axis: int, tap: int) -> tuple[int, int]:
        offset = tap * self.dilations[axis] - self.pads[axis]
        return _reached(self.image[axis], self.out[axis], self.strides[axis], offset)


def _sizes(node: Operator, inputs: list) -> Optional[_Sizes]:
    """The sizes of a Conv with constant weights, static spatial sizes and explicit pads;
    None for any other."""
    x, w = inputs[0], inputs[1]
    rank = x.rank - 2
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    if (auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad) != "NOTSET" \
            or w is None or not w.is_constant or rank < 1:
        return None
    image = [normalize_dim(d) for d in x.shape[2:]]
    out = [normalize_dim(d) for d in node.outputs[0].shape[2:]]
    pads = [int(p) for p in node.attrs.get("pads", [0] * 2 * rank)]
    strides = [int(s) for s in node.attrs.get("strides", [1] * rank)]
    dilations = [int(d) for d in node.attrs.get("dilations", [1] * rank)]
    if not all(isinstance(d, int) for d in (*image, *out)) or len(pads) != 2 * rank \
            or len(strides) != rank or len(dilations) != rank:
        return None  # the Conv definition reports a malformed attribute
    return _Sizes(tuple(image), tuple(out), tuple(w.shape[2:]), tuple(strides),
                  tuple(dilations), tuple(pads))


def by_taps(node: Operator, inputs: list) -> Optional[Tensor]:
    """The Conv as a sum over its taps of 1x1 convolutions, each over the outputs its tap
    reaches the image from and padded back to the whole output, plus the bias; None
    where that saves too little work (see TAP_WORK)."""
    sizes = _sizes(node, inputs)
    if sizes is None:
        return None
    rank = len(sizes.out)
    every = {t: [sizes.reached(a, t[a]) for a in range(rank)]
             for t in itertools.product(*(range(k) for k in sizes.kernel))}
    taps = [t for t, r in every.items() if all(first <= last for first, last in r)]
    reached = [every[t] for t in taps]
    work = sum(math.prod(last - first + 1 for first, last in r) for r in reached)
    live = math.prod(sizes.out) * math.prod(len({t[a] for t in taps}) for a in range(rank))
    products = inputs[1].shape[0] * inputs[1].shape[1]  # multiply-adds per tap and output
    if not taps or work > TAP_WORK * live or (live - work) * products < MIN_SAVED:
        return None
    p = Primitives(node)
    parts = [_tap(p, inputs, sizes, tap, r, k) for k, (tap, r) in enumerate(zip(taps, reached))]
    total = parts[0] if len(parts) == 1 else p.op("Sum", parts, "taps")
    if len(inputs) > 2 and inputs[2] is not None:
        bias = p.shape([-1] + [1] * rank, "bias_shape")
        total = p.op("Add", [total, p.op("Reshape", [inputs[2], bias], "bias")], "biased")
    return total


def _tap(p: Primitives, inputs: list, sizes: _Sizes, tap: tuple[int, ...],
         reached: list[tuple[int, int]], k: int) -> Tensor:
    """One tap's 1x1 convolution over the outputs it reaches, padded to them all."""
    x, w = inputs[0], inputs[1]
    rank = len(tap)
    starts = [first * s + t * d - pad for (first, _), s, t, d, pad
              in zip(reached, sizes.strides, tap, sizes.dilations, sizes.pads)]
    ends = [last * s + t * d - pad + 1 for (_, last), s, t, d, pad
            in zip(reached, sizes.strides, tap, sizes.dilations, sizes.pads)]
    window = p.op("Slice", [x, p.shape(starts, f"tap{k}_starts"), p.shape(ends, f"tap{k}_ends"),
                            p.shape(list(range(2, 2 + rank)), f"tap{k}_axes")], f"tap{k}_window")
    data = np.ascontiguousarray(w.data[(slice(None), slice(None),
                                        *(slice(t, t + 1) for t in tap))])
    weights = Tensor(f"{p.node.name}/tap{k}", w.dtype, data.shape, data)
    attrs = {"strides": list(sizes.strides),
             "group": int(p.node.attrs.get("group", 1))}
    y = p.op("Conv", [window, weights], f"tap{k}", **attrs)
    widths = [0, 0, *(first for first, _ in reached), 0, 0,
              *(out - 1 - last for (_, last), out in zip(reached, sizes.out))]
    if not any(widths):
        return y
    return p.op("Pad", [y, p.shape(widths, f"tap{k}_pads")], f"tap{k}_padded", mode="constant")


def without_dead_taps(node: Operator, inputs: list) -> Optional[Operator]:
    """The Conv over its live taps, reading a cropped input where the padding before or
    after shrank below zero, when some taps read only padding; else None. Needs
    constant weights, static spatial sizes and explicit pads."""
    sizes = _sizes(node, inputs)
    if sizes is None:
        return None
    x, w = inputs[0], inputs[1]
    rank = len(sizes.out)
    live = [live_taps(sizes.image[a], sizes.out[a], sizes.kernel[a], sizes.strides[a],
                      sizes.dilations[a], sizes.pads[a]) for a in range(rank)]
    if all(first == 0 and last == k - 1 for (first, last), k in zip(live, sizes.kernel)) or \
            any(last < first for first, last in live):
        return None  # every tap reads the image, or none does (an output of padding)
    cut = tuple(slice(first, last + 1) for first, last in live)
    data = np.ascontiguousarray(w.data[(slice(None), slice(None), *cut)])
    weights = Tensor(f"{node.name}/live_taps", w.dtype, data.shape, data)
    pads = [p - first * d for p, (first, _), d in zip(sizes.pads, live, sizes.dilations)] + \
        [p - (k - 1 - last) * d for p, (_, last), d, k
         in zip(sizes.pads[rank:], live, sizes.dilations, sizes.kernel)]
    if any(p < 0 for p in pads):
        crop = [0, 0, *(min(p, 0) for p in pads[:rank]), 0, 0, *(min(p, 0) for p in pads[rank:])]
        x = Primitives(node).op("Pad", [x, Primitives(node).shape(crop, "crop")], "crop")
    attrs = {**node.attrs, "pads": [max(p, 0) for p in pads],
             "kernel_shape": list(data.shape[2:])}
    return apply("Conv", [x, weights, *inputs[2:]], attrs, node.name)[0].producer
