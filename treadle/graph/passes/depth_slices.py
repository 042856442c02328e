"""A 3-D convolution as 2-D convolutions of its depth slices: a video network's D' x 3 x 3
filters at stride 1, for the Winograd pass (``passes.winograd``), which takes 2-D
convolutions only.

Every depth slice of the channels-last input (N x D x H x W x C) is convolved with the
filter's D' depth taps side by side, to D' x M channels; output slice d is then the sum
over taps t of tap t's channels at input slice d + t - (depth padding). The 2-D
convolution runs on Winograd's 4x fewer multiply-adds and is a wider product, and the
sum fuses into one kernel with the bias, the activation and what follows. R3D-18's
64-channel 3x3x3 layers on 8 x 56 x 56 ran 1.8x faster so. Where Winograd would not take
the 2-D convolution, the layer stays one convolution: the taps' sum would cost a pass
over D' outputs for nothing.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from treadle.graph.operator import Operator, apply
from treadle.graph.ops.shape import dims_tensor
from treadle.graph.tensor import Dim, Tensor, constant, normalize_dim

# The 2-D convolution of (depth slices N*D x H x W x C, weights 3 x 3 x C x D'M, name),
# or None where it is not worth it.
Convolve = Callable[[Tensor, Tensor, str], Optional[Tensor]]


def by_depth_slices(node: Operator, inputs: list, convolve: Convolve) -> Optional[Tensor]:
    """The ChannelsLastConv ``node`` of a 5-D input as ``convolve`` of its depth slices
    and a sum over the depth taps (N x D_out x H x W x M, as the node's), or None."""
    x, weight = inputs[0], inputs[1]
    if x.rank != 5 or weight is None or not weight.is_constant or not plain_convolution(node.attrs):
        return None
    padding = _depth_padding(x)
    if padding is None:
        return None
    unpadded, depth_padding = padding
    batch, depth = unpadded.shape[:2]
    if not isinstance(depth, int):
        return None
    taps, kh, kw, channels, m = weight.shape
    images = _reshape(unpadded, [normalize_dim(batch * depth), *unpadded.shape[2:]],
                      f"{node.name}/slices")
    # D' x kh x kw x C x M -> kh x kw x C x (D' x M): each depth tap a block of channels
    stacked = weight.data.transpose(1, 2, 3, 0, 4).reshape(kh, kw, channels, taps * m)
    w = constant(np.ascontiguousarray(stacked), f"{weight.name}/depth_taps", weight.dtype)
    y = convolve(images, w, f"{node.name}/by_slice")
    if y is None:
        return None
    by_tap = _reshape(y, [batch, depth, *y.shape[1:3], taps, m], f"{node.name}/by_tap")
    total = _sum_of_taps(node.name, by_tap, depth_padding)
    out = _reshape(total, [batch, *total.shape[1:4], m], f"{node.name}/summed")
    bias = inputs[2] if len(inputs) > 2 else None
    return out if bias is None else apply("Add", [out, bias], {}, f"{node.name}/bias")[0]


def _reshape(x: Tensor, shape: Sequence[Dim], name: str) -> Tensor:
    return apply("Reshape", [x, dims_tensor(shape, f"{name}/shape")], {}, name)[0]


def plain_convolution(attrs: dict) -> bool:
    """Stride and dilation 1, one group, no padding of its own (canonicalize splits it
    off into a Pad)."""
    return (all(int(v) == 1 for v in attrs.get("strides", []))
            and all(int(v) == 1 for v in attrs.get("dilations", []))
            and int(attrs.get("group", 1)) == 1 and not any(attrs.get("pads", []))
            and attrs.get("auto_pad", "NOTSET") in ("NOTSET", b"NOTSET"))


def _depth_padding(x: Tensor) -> Optional[tuple[Tensor, tuple[int, int]]]:
    """(``x`` padded as it is but along the depth, the depth padding) for a 5-D
    channels-last ``x``: ``x`` itself where it is no Pad, the Pad without its depth widths
    where it pads with zeros by constant widths and leaves the batch and the channels
    alone; None for another padding."""
    pad = x.producer
    if pad is None or pad.op_type != "Pad":
        return x, (0, 0)
    pads = pad.inputs[1] if len(pad.inputs) > 1 else None
    fill = pad.inputs[2] if len(pad.inputs) > 2 else None
    rank = x.rank
    if (pads is None or pads.value is None or len(pads.value) != 2 * rank
            or len(pad.inputs) > 3
            or pad.attrs.get("mode", "constant") not in ("constant", b"constant")
            or fill is not None and not (fill.is_constant and not fill.data.any())):
        return None
    widths = [int(v) for v in pads.value]
    if any(widths[a] or widths[a + rank] for a in (0, rank - 1)):
        return None
    depth = (widths[1], widths[1 + rank])
    widths[1] = widths[1 + rank] = 0
    if not any(widths):
        return pad.inputs[0], depth
    plane = constant(np.array(widths, np.int64), f"{pad.name}/plane_pads")
    return apply("Pad", [pad.inputs[0], plane, *pad.inputs[2:]], pad.attrs,
                 f"{pad.name}/plane")[0], depth


def _sum_of_taps(name: str, by_tap: Tensor, depth_padding: tuple[int, int]) -> Tensor:
    """sum over t of by_tap[:, d + t - before, :, :, t] for every output slice d, a slice
    outside the input adding nothing; by_tap is N x D x H x W x D' x M, the result
    N x D_out x H x W x 1 x M. The depth padding pads by_tap itself (its producer writes
    the zeros), so each tap is a slice of one tensor, read where the sum is computed."""
    before, after = depth_padding
    _, depth, _, _, taps, _ = by_tap.shape
    if before or after:
        widths = [0, before, 0, 0, 0, 0, 0, after, 0, 0, 0, 0]
        by_tap = apply("Pad", [by_tap, constant(np.array(widths, np.int64), f"{name}/pads")],
                       {}, f"{name}/padded")[0]
    out_depth = depth + before + after - taps + 1
    parts = []
    for t in range(taps):
        bounds = [constant(np.array(v, np.int64), f"{name}/tap{t}/{what}") for what, v in
                  (("starts", [t, t]), ("ends", [t + out_depth, t + 1]), ("axes", [1, 4]))]
        parts.append(apply("Slice", [by_tap, *bounds], {}, f"{name}/tap{t}")[0])
    return parts[0] if len(parts) == 1 else apply("Sum", parts, {}, f"{name}/taps_sum")[0]
