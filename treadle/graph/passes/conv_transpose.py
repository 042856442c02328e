"""ConvTranspose with constant weights as one Conv and a pixel shuffle.

A transposed convolution scatters each input pixel, times the kernel, over the output.
Its definition (``graph.ops.nn``) gathers instead: every output element tests each tap
for an input pixel behind it, and with stride s only one tap in s lands, so the
rule-based kernel spends its time on selects (16 to 3 channels, 4 x 4 taps, stride 2,
64 x 64 pixels: 7.9 ms, ONNX Runtime 0.17 ms).

Along an axis with stride s, the outputs of one phase r (positions o + begin = q s + r)
each take the taps k with k ≡ r (mod s), from input positions q - k div s: a plain
convolution of the input with those taps, reversed. Every phase of every axis becomes
output channels of one Conv over the input (the groups' phases next to each other, so a
grouped ConvTranspose stays one grouped Conv):

    Pad(x), Conv(·, W')           N x (G·P·M) x Q...   P phases, M channels per group
    Transpose, Reshape,           N x (Q·s)... x (G·M) each phase's pixels interleaved,
      Transpose, Reshape                               channels last
    Slice                         the output's pixels (the pads and output_padding)
    Transpose                     N x (G·M) x out...

Each phase's kernel has ceil(k / s) taps, the kernel padded with zero taps where s does
not divide it; dilation first spreads the kernel with zeros. Where that pads many taps
(a 3 x 3 kernel at stride 2: 16 taps for the four phases' 9), each phase is a Conv of its
own taps instead, the phases concatenated along the channels (CycleGAN's decoder: 59 ms
against 71 as one Conv), each reading its window of one padded copy of the input. The
padding lets every phase cover the whole output, and the Slice keeps it; as for any
convolution (``passes.canonicalize``) it is a copy of its own, not bounds checks at each
of the GEMM's reads. The Conv runs on the GEMM template like any other, channels last;
the shuffle moves runs of channels, and fuses into the Conv's stores or the next kernel.

A symbolic spatial size takes the same rewrite: each output size is the stride times the
input's plus a constant, so the pads and the rows cropped are constants, and only the
shuffle's shapes and the crop's ends hold the symbol.
"""
from __future__ import annotations

import functools
import itertools
import math
from typing import Callable, Optional, Sequence

import numpy as np

from treadle.graph.operator import OpContext, Operator
from treadle.graph.ops.nn import transposed_window
from treadle.graph.passes.channels_last import stays_channels_first, to_first, to_last
from treadle.graph.passes.fission import Primitives
from treadle.graph.tensor import Dim, Tensor, constant, normalize_dim
from treadle.ir.expr import ceil_div


def decompose_conv_transpose(node: Operator, inputs: list, readers=None
                             ) -> Optional[Sequence[Tensor]]:
    """The node as Conv and a pixel shuffle, or None where it keeps its definition (a
    weight or bias computed at run time)."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    if not w.is_constant or (bias is not None and not bias.is_constant):
        return None
    sizes = [normalize_dim(d) for d in x.shape[2:]]
    ctx = OpContext(node.op_type, node.name, inputs, node.attrs)
    win = transposed_window(ctx, sizes, tuple(w.shape[2:]))
    # Each output size is the stride times the input's plus a constant (symbolic sizes
    # included), so every pad and crop below is a constant.
    offsets = [normalize_dim(o - s * i) for o, s, i in zip(win.out, win.strides, sizes)]
    if not all(isinstance(c, int) for c in offsets):
        return None
    group = int(node.attrs.get("group", 1))
    taps = [ceil_div((k - 1) * d + 1, s) for k, d, s in zip(win.kernel, win.dilations,
                                                            win.strides)]
    # The phase rows q that hold output positions begin .. begin + out: first, rows
    # before the input (shift) where output_shape asks for more than the pads give; then
    # from the first row needed (skip) to the last, ``excess`` more than the input has.
    shift = [ceil_div(max(0, -b), s) for b, s in zip(win.begin, win.strides)]
    start = [b + e * s for b, e, s in zip(win.begin, shift, win.strides)]
    skip = [min(a // s, t - 1 + e) for a, s, t, e in zip(start, win.strides, taps, shift)]
    excess = [(a + c - 1) // s + 1 - k for a, c, s, k in zip(start, offsets, win.strides, skip)]
    before = [t - 1 + e - k for t, e, k in zip(taps, shift, skip)]
    after = [max(0, q + t - 1 - b) for q, t, b in zip(excess, taps, before)]
    start = [a - k * s for a, k, s in zip(start, skip, win.strides)]
    p = Primitives(node)
    exact = _exact_taps(win)
    if group == 1 and sum(map(math.prod, exact)) * MAX_PADDED_TAPS < math.prod(
            [*taps, *win.strides]):
        y = _phase_convs(p, x, w, bias, win, exact, [shift, skip, excess])
    else:
        y = _one_conv(p, x, w, bias, win, group, taps, before + after)
    rank = len(sizes)
    if all(s == 1 for s in win.strides):
        return [_cropped(p, y, start, win.out, 2)]
    y = _interleaved(p, y, group, w.shape[1], win.strides)
    y = _cropped(p, y, start, win.out, 1)
    return [p.op("Transpose", [y], "to_nchw", perm=[0, rank + 1, *range(1, rank + 1)])]


def _cropped(p: Primitives, y: Tensor, start: Sequence[int], out: Sequence[Dim],
             axis: int) -> Tensor:
    """``out`` positions of ``y`` from ``start`` along the spatial axes from ``axis``."""
    if all(a == 0 for a in start) and all(normalize_dim(d - o) == 0 for d, o in
                                          zip(y.shape[axis:axis + len(out)], out)):
        return y
    return p.op("Slice", [y, p.shape(start, "starts"),
                          p.shape([a + o for a, o in zip(start, out)], "ends"),
                          p.shape(list(range(axis, axis + len(out))), "axes")], "crop")


def _one_conv(p: Primitives, x: Tensor, w: Tensor, bias: Optional[Tensor], win, group: int,
              taps: Sequence[int], pads: Sequence[int]) -> Tensor:
    """Every phase in one Conv of ``taps`` taps along each axis, its output channels
    (group, phase, channel)."""
    weight = _phase_weights(w.data, group, win.strides, win.dilations, taps)
    inputs = [x, constant(weight, f"{p.node.name}/phase_weight")]
    if bias is not None:
        phases = math.prod(win.strides)
        tiled = np.tile(bias.data.reshape(group, 1, -1), (1, phases, 1)).reshape(-1)
        inputs.append(constant(tiled, f"{p.node.name}/phase_bias"))
    return p.op("Conv", [zero_padded(p, x, pads), *inputs[1:]], "phases", group=group)


def zero_padded(p: Primitives, x: Tensor, pads: Sequence[int]) -> Tensor:
    """``x`` with ``pads`` (a Conv's: all before, then all after, per spatial axis) zeros
    around its image, the Pad named ``<node>/pad``: a convolution reads a padded copy,
    where checking bounds at every read of its GEMM doubled the cost of ResNet's 3x3
    convolutions (and of a ConvTranspose's phases)."""
    if not any(pads):
        return x
    rank = len(pads) // 2
    widths = [0, 0, *pads[:rank], 0, 0, *pads[rank:]]
    return p.op("Pad", [x, p.shape(widths, "pads")], "pad", mode="constant")


# How many times the taps it needs the one Conv of every phase may compute: where the
# stride does not divide the kernel, the phases that have fewer taps are padded with zero
# taps (3 x 3 taps at stride 2: 16 taps for the 9 of the four phases).
MAX_PADDED_TAPS = 4 / 3


def _exact_taps(win) -> list[tuple[int, ...]]:
    """Each phase's taps along each axis, phases in row-major order of their offsets."""
    per_axis = [[ceil_div(max(0, (k - 1) * d + 1 - r), s) for r in range(s)]
                for k, d, s in zip(win.kernel, win.dilations, win.strides)]
    return list(itertools.product(*per_axis))


def _phase_convs(p: Primitives, x: Tensor, w: Tensor, bias: Optional[Tensor], win,
                 exact: Sequence[tuple[int, ...]], grid: Sequence[Sequence[int]]) -> Tensor:
    """One Conv per phase with its own taps (group 1), concatenated along the channels
    in phase order, as the one Conv of every phase lays them out. Along each axis, a
    phase's Conv reads its taps m = lo .. hi (zero outside the kernel: hi reaches the
    first row needed, lo keeps the end padding from going negative), so that every
    phase computes the same rows."""
    shift, skip, excess = grid
    spread = _dilated(w.data, win.dilations)
    outputs, phases = [], []
    for k, phase in enumerate(itertools.product(*(range(s) for s in win.strides))):
        index, before, after = [], [], []
        for a, (r, t) in enumerate(zip(phase, exact[k])):
            s, e = win.strides[a], shift[a]
            lo = min(0, excess[a] - e + skip[a])
            hi = max(t - 1, skip[a] - e, lo)
            index.append(r + (hi - np.arange(hi - lo + 1)) * s)
            before.append(hi + e - skip[a])
            after.append(excess[a] - lo - e + skip[a])
        inside = functools.reduce(np.multiply.outer, [(i >= 0) & (i < n) for i, n in
                                                      zip(index, spread.shape[2:])])
        clipped = [np.clip(i, 0, n - 1) for i, n in zip(index, spread.shape[2:])]
        taps = spread[(slice(None), slice(None), *np.ix_(*clipped))] * inside
        weight = np.ascontiguousarray(taps.swapaxes(0, 1))
        phases.append((constant(weight, f"{p.node.name}/phase{k}_weight"), before, after))
    rank = len(exact[0])
    most = [max(ph[1][a] for ph in phases) for a in range(rank)] + \
        [max(ph[2][a] for ph in phases) for a in range(rank)]
    read = _windows(p, zero_padded(p, x, most), w.shape[1])
    for k, (weight, before, after) in enumerate(phases):
        window = read([m - b for m, b in zip(most, before + after)], k)
        outputs.append(p.op("Conv", [window, weight, *([] if bias is None else [bias])],
                            f"phase{k}"))
    return p.op("Concat", outputs, "phases", axis=1)


def _windows(p: Primitives, padded: Tensor, channels: Dim) -> Callable:
    """``read(trim, k)``: phase k's window of the one padded copy every phase reads,
    ``trim`` (before, then after, per spatial axis) rows less at its ends. Phases that
    run channels last read a channels-last copy: read N x C x spatial, each phase's
    GEMM gathers its rows one image plane apart (2x slower). There each phase reads its
    window through a Slice, a whole one included: ``passes.channels_last`` cancels a
    transposition of a transposition, so a phase reading the copy itself would transpose
    it back and forth into a second copy."""
    rank = padded.rank
    last = not stays_channels_first(channels, 1)
    if last:
        padded = p.op("Transpose", [padded], "pad_nhwc", perm=to_last(rank))
    first_axis = 1 if last else 2

    def read(trim: Sequence[int], k: int) -> Tensor:
        if not (last or any(trim)):
            return padded
        spatial = len(trim) // 2
        # The ends count back from the end: a symbolic size needs no symbol.
        ends = [-t if t else np.iinfo(np.int64).max for t in trim[spatial:]]
        axes = list(range(first_axis, first_axis + spatial))
        window = p.op("Slice", [padded, p.shape(trim[:spatial], f"phase{k}_starts"),
                                p.shape(ends, f"phase{k}_ends"),
                                p.shape(axes, f"phase{k}_axes")], f"phase{k}_window")
        return p.op("Transpose", [window], f"phase{k}_nchw", perm=to_first(rank)) \
            if last else window
    return read


def _dilated(w: np.ndarray, dilations: Sequence[int]) -> np.ndarray:
    """The kernel with dilation - 1 zero taps between its taps."""
    shape = [(k - 1) * d + 1 for k, d in zip(w.shape[2:], dilations)]
    spread = np.zeros((*w.shape[:2], *shape), w.dtype)
    spread[(slice(None), slice(None), *(slice(0, None, d) for d in dilations))] = w
    return spread


def _phase_weights(w: np.ndarray, group: int, strides: Sequence[int],
                   dilations: Sequence[int], taps: Sequence[int]) -> np.ndarray:
    """The Conv's weights, (G·P·M) x C/G x taps...: phase r of an axis takes the taps
    r, r + s, ... of the (dilated) kernel, reversed."""
    channels, per_group, *kernel = w.shape
    rank = len(kernel)
    dilated = _dilated(w, dilations)
    spread = np.zeros((channels, per_group, *(s * t for s, t in zip(strides, taps))), w.dtype)
    spread[(slice(None), slice(None), *(slice(0, n) for n in dilated.shape[2:]))] = dilated
    # axes: G, C/G, M, then (taps, phase) per spatial axis
    split = spread.reshape(group, channels // group, per_group,
                           *(n for t, s in zip(taps, strides) for n in (t, s)))
    split = np.flip(split, axis=tuple(3 + 2 * a for a in range(rank)))
    order = [0, *(4 + 2 * a for a in range(rank)), 2, 1, *(3 + 2 * a for a in range(rank))]
    return np.ascontiguousarray(split.transpose(order)).reshape(-1, channels // group, *taps)


def _interleaved(p: Primitives, y: Tensor, group: int, per_group: int,
                 strides: Sequence[int]) -> Tensor:
    """N x (G·P·M) x Q... as N x (Q·s)... x (G·M), channels last: phase r of each axis at
    positions q s + r. The shuffle moves whole runs of M channels, and the Conv's own
    transposition back from channels-last cancels against the first Transpose here
    (``passes.channels_last``), as does the last one against a next convolution's."""
    rank = len(strides)
    q = [normalize_dim(d) for d in y.shape[2:]]
    y = p.op("Transpose", [y], "to_nhwc", perm=[0, *range(2, rank + 2), 1])
    y = p.op("Reshape", [y, p.shape([0, *q, group, *strides, per_group], "phase_shape")],
             "phase_split")
    # axes: N, Q..., G, s..., M -> N, (Q, s)..., G, M
    perm = [0, *(n for a in range(rank) for n in (1 + a, 2 + rank + a)), 1 + rank,
            2 + 2 * rank]
    y = p.op("Transpose", [y], "phase_order", perm=perm)
    return p.op("Reshape", [y, p.shape([0, *(a * s for a, s in zip(q, strides)),
                                        group * per_group], "shuffled_shape")], "shuffled")
