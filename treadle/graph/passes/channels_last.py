"""Channels-last activations: convolutions and pooling read and write N x spatial x C.

With ONNX's N x C x spatial layout, a convolution as implicit GEMM (pixels x channels)
stores each output vector of channels one image plane apart, and its packing walks the
input one plane per reduction step. Channels last, the output channels and the input
channels of each tap are contiguous, and a 1x1 convolution is a plain matrix product.

Each Conv (but one with fewer output channels than a GEMM's narrowest columns), MaxPool
and AveragePool becomes its channels-last twin between two transposes:
``to_nchw(ChannelsLastConv(to_nhwc(x)))``. The transposes back to NCHW then sink through
the operators that commute with them (element-wise ops, whose constant operands are
transposed instead, Pad, Concat, Split, global pooling, instance and group
normalisation, Resize; a token sequence viewed as an image becomes a channels-last view)
until they meet the next layer's ``to_nhwc`` and cancel, so between consecutive layers
the activations stay channels-last.
A transpose left in front of some other consumer (a reshape, the
graph's output) is an ordinary operator, which fusion inlines into its reader or writer.
The weights become kernel x C/group x M constants. A grouped convolution (several
channels per group) becomes ``ChannelsLastGroupConv`` with G x kernel x C/G x M/G weights
and the group an axis of its output, viewed back as N x spatial x M; narrow groups run
several to a group with block-diagonal weights (``_merged_groups``).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from treadle.graph.graph import Graph
from treadle.graph.operator import Operator, apply
from treadle.graph.ops.elementwise import ELEMENTWISE
from treadle.graph.ops.shape import dims_tensor
from treadle.graph.ops.transform import transpose_perm
from treadle.graph.rewrite import rewrite_graph
from treadle.graph.tensor import Dim, Tensor, constant
from treadle.schedule.templates.thresholds import MIN_GEMM_COLUMNS, VECTOR_ELEMENTS

LAYERS = ("Conv", "ConvInteger", "MaxPool", "AveragePool")
CONVOLUTIONS = ("Conv", "ConvInteger")
GLOBAL_POOLS = {"GlobalAveragePool": "ReduceMean", "GlobalMaxPool": "ReduceMax"}
NORMS = {"InstanceNormalization": "ChannelsLastInstanceNormalization",
         "GroupNormalization": "ChannelsLastGroupNormalization"}


def channels_last(graph: Graph) -> Graph:
    return rewrite_graph(graph, _rule)


def _rule(node: Operator, inputs: list) -> Optional[Sequence[Tensor]]:
    if node.op_type in LAYERS and inputs[0].rank >= 3 and len(node.outputs) == 1 \
            and not _narrow(node, inputs[0]):
        return [_layer(node, inputs)]
    if node.op_type == "Transpose":
        return _compose(node, inputs[0])
    if node.op_type in ELEMENTWISE and len(node.outputs) == 1 or _per_tensor_quantize(node):
        return _sink_elementwise(node, inputs)
    if node.op_type == "Pad":
        return _sink_pad(node, inputs)
    if node.op_type == "Concat":
        return _sink_concat(node, inputs)
    if node.op_type == "Split":
        return _sink_split(node, inputs)
    if node.op_type in GLOBAL_POOLS:
        return _sink_global_pool(node, inputs[0])
    if node.op_type in NORMS:
        return _sink_norm(node, inputs)
    if node.op_type == "Resize":
        return _sink_resize(node, inputs)
    if node.op_type == "Reshape":
        return _unflatten_pixels(node, inputs[0])
    return None


def _narrow(node: Operator, x: Tensor) -> bool:
    """A convolution with fewer output channels than a GEMM's narrowest columns (an image
    model's last layer, back to 3 colours) stays N x C x spatial: there its GEMM is a few
    rows by the pixels, channels last the pixels by a few scattered columns (Candy's last
    layer ran 5x slower). Unless its input ``x`` is channels last already and its channels
    fill whole vectors: the dot template (``templates.dot_cpu``) sums those pixel by
    pixel, 1.8x faster than the window over N x C x spatial. A grouped one is no such
    GEMM (MixNet's depthwise branches of a few channels each)."""
    if node.op_type != "Conv" or not stays_channels_first(
            node.outputs[0].shape[1], int(node.attrs.get("group", 1))):
        return False
    channels = x.shape[1]
    return not (_back_to_first(x) is not None and isinstance(channels, int)
                and channels % VECTOR_ELEMENTS == 0)


def stays_channels_first(channels: Dim, group: int) -> bool:
    """Whether a convolution to ``channels`` in ``group`` groups is too narrow for a GEMM
    (``_narrow``)."""
    return group == 1 and isinstance(channels, int) and channels < MIN_GEMM_COLUMNS


def to_last(rank: int) -> list[int]:
    """The transposition N x C x spatial -> N x spatial x C."""
    return [0, *range(2, rank), 1]


def to_first(rank: int) -> list[int]:
    return [0, rank - 1, *range(1, rank - 1)]


def _layer(node: Operator, inputs: list) -> Tensor:
    x, rest = inputs[0], list(inputs[1:])
    if _grouped(node, inputs):
        return _grouped_layer(node, x, rest)
    if node.op_type in CONVOLUTIONS:
        rest[0] = _kernel_major(rest[0], node.name)
    last = _to_last(x, f"{node.name}/to_nhwc")
    y = apply(f"ChannelsLast{node.op_type}", [last, *rest], node.attrs, node.name)[0]
    return _transpose(y, to_first(x.rank), f"{node.name}/to_nchw")


def grouped_gemm(node: Operator) -> bool:
    """A convolution of several groups, each with several input channels, which runs as a
    batch of matrix products over groups (depthwise ones are the window template's)."""
    group = int(node.attrs.get("group", 1))
    channels = node.inputs[0].shape[1] if node.inputs[0].rank >= 3 else None
    return node.op_type == "Conv" and group > 1 and isinstance(channels, int) \
        and channels > group


def _grouped(node: Operator, inputs: list) -> bool:
    """A grouped GEMM convolution with constant weights, to lay out by group."""
    return grouped_gemm(node) and inputs[1].is_constant


def _grouped_layer(node: Operator, x: Tensor, rest: list) -> Tensor:
    """The grouped convolution as ChannelsLastGroupConv, whose N x spatial x G x M/G
    result is viewed as N x spatial x M."""
    group, weight = int(node.attrs["group"]), rest[0].data
    m, per_group = weight.shape[0], weight.shape[0] // group
    # M x C/G x kernel -> G x M/G x C/G x kernel -> G x kernel x C/G x M/G
    split = weight.reshape(group, per_group, *weight.shape[1:])
    layout = _merged_groups(split.transpose(0, *range(3, split.ndim), 2, 1))
    rest[0] = constant(layout, f"{rest[0].name}/by_group", rest[0].dtype)
    attrs = {k: v for k, v in node.attrs.items() if k != "group"}
    last = _to_last(x, f"{node.name}/to_nhwc")
    y = apply("ChannelsLastGroupConv", [last, *rest], attrs, node.name)[0]
    shape = dims_tensor([*y.shape[:-2], m], f"{node.name}/shape")
    flat = apply("Reshape", [y, shape], {}, f"{node.name}/channels")[0]
    return _transpose(flat, to_first(x.rank), f"{node.name}/to_nchw")


# Groups narrower than this many output channels run several to a GEMM group.
MERGED_GROUP_COLUMNS = 16


def _merged_groups(weight: np.ndarray) -> np.ndarray:
    """A G x kernel x C/G x M/G weight with narrow groups (ResNeXt's first stage: 4
    channels each) as fewer, wider groups whose weights are block-diagonal: B neighbouring
    groups, zero between them, make one group of B C/G inputs and B M/G outputs. Each
    product is then at least MERGED_GROUP_COLUMNS columns wide, a vector register's row
    of the GEMM's tile, where 4 columns ran on a quarter of each vector and across the
    pixels, 5x slower than the B-fold work merged."""
    group, *kernel, cin, cout = weight.shape
    merge = next((b for b in range(1, group + 1) if group % b == 0
                  and b * cout >= MERGED_GROUP_COLUMNS), group)
    merged = np.zeros((group // merge, *kernel, merge * cin, merge * cout), weight.dtype)
    for g in range(group):
        blocks = merged[g // merge, ..., g % merge * cin:(g % merge + 1) * cin,
                        g % merge * cout:(g % merge + 1) * cout]
        blocks[...] = weight[g]
    return merged


def _kernel_major(weight: Tensor, name: str) -> Tensor:
    """An M x C/group x kernel weight as kernel x C/group x M."""
    perm = [*range(2, weight.rank), 1, 0]
    if weight.is_constant:
        data = np.ascontiguousarray(weight.data.transpose(perm))
        return constant(data, f"{weight.name}/kernel_major", weight.dtype)
    return apply("Transpose", [weight], {"perm": perm}, f"{name}/weight")[0]


def _transpose(x: Tensor, perm: Sequence[int], name: str) -> Tensor:
    """x transposed by perm; a transpose of a transpose is one transpose, or none."""
    inner = _transposed(x)
    if inner is not None:
        x, first = inner
        perm = [first[p] for p in perm]
    if list(perm) == list(range(len(perm))):
        return x
    return apply("Transpose", [x], {"perm": list(perm)}, name)[0]


def _transposed(t: Optional[Tensor]) -> Optional[tuple[Tensor, list[int]]]:
    """(source, perm) when ``t`` is a transpose of source, else None."""
    node = t.producer if t is not None else None
    if node is None or node.op_type != "Transpose":
        return None
    source = node.inputs[0]
    return source, transpose_perm(node.attrs, source.rank)


def _back_to_first(t: Optional[Tensor]) -> Optional[tuple[Tensor, list[int]]]:
    """(source, perm) when ``t`` is a channels-last tensor transposed back to NCHW. Only
    these sink: other transposes (attention heads, say) keep the place the model gave
    them."""
    found = _transposed(t)
    if found is None or len(found[1]) < 3 or found[1] != to_first(len(found[1])):
        return None
    return found


def _compose(node: Operator, x: Tensor) -> Optional[Sequence[Tensor]]:
    if _transposed(x) is None:
        return None
    return [_transpose(x, transpose_perm(node.attrs, x.rank), node.name)]


def _inverse(perm: Sequence[int]) -> list[int]:
    inverse = [0] * len(perm)
    for k, p in enumerate(perm):
        inverse[p] = k
    return inverse


def _sink_elementwise(node: Operator, inputs: list) -> Optional[Sequence[Tensor]]:
    """op(transpose(a), transpose(b), c) = transpose(op(a, b, c')), where every transposed
    operand has the output's rank and the same perm, and c' is a constant transposed
    back, a per-channel operand transposed back, or an operand whose broadcast ignores the
    order of axes."""
    found = [_back_to_first(t) for t in inputs]
    perms = {tuple(f[1]) for f in found if f is not None}
    rank = node.outputs[0].rank
    if len(perms) != 1:
        return None
    perm = list(perms.pop())
    if len(perm) != rank:
        return None
    inverse = _inverse(perm)
    operands = []
    for t, f in zip(inputs, found):
        if f is not None:
            operands.append(f[0])
        elif t is None or _order_free(t):
            operands.append(t)
        elif t.is_constant and t.rank <= rank:
            full = t.data.reshape((1,) * (rank - t.rank) + t.data.shape)
            operands.append(constant(np.ascontiguousarray(full.transpose(inverse)),
                                     f"{t.name}/transposed", t.dtype))
        elif _per_channel(t, rank):
            # A channel attention's weights (squeeze-and-excitation, ECA): N x C values,
            # cheap to transpose, where the product over the whole map stays channels-last.
            operands.append(_transpose(t, inverse, f"{t.name}/to_last"))
        else:
            return None
    y = apply(node.op_type, operands, node.attrs, node.name)[0]
    return [_transpose(y, perm, f"{node.name}/sunk")]


def _per_tensor_quantize(node: Operator) -> bool:
    """A QuantizeLinear or DequantizeLinear of one scale and zero point for the whole
    tensor, element-wise as any map (a quantised model's activations between layers)."""
    return node.op_type in ("QuantizeLinear", "DequantizeLinear") \
        and all(t is None or _order_free(t) for t in node.inputs[1:])


def _per_channel(t: Tensor, rank: int) -> bool:
    """Whether ``t`` is N x C x 1 x ... x 1 at ``rank``: one value per image and channel."""
    return t.rank == rank >= 3 and all(isinstance(d, int) and d == 1 for d in t.shape[2:])


def _order_free(t: Tensor) -> bool:
    """Whether ``t`` broadcasts the same under any order of the axes: a scalar or one
    element."""
    return all(isinstance(d, int) and d == 1 for d in t.shape)


def _sunk(node: Operator, x: Tensor, build) -> Optional[Sequence[Tensor]]:
    """``node``'s result from its channels-last twin, ``build(source, perm)`` (None where
    there is none), when ``x`` is a channels-last tensor transposed back: the transpose
    moves after it."""
    found = _back_to_first(x)
    y = None if found is None else build(*found)
    return None if y is None else [_transpose(y, found[1], f"{node.name}/sunk")]


def _sink_pad(node: Operator, inputs: list) -> Optional[Sequence[Tensor]]:
    return _sunk(node, inputs[0], lambda source, perm: _pad_before(node, inputs, source, perm))


def _pad_before(node: Operator, inputs: Sequence, source: Tensor, perm: list[int]
                ) -> Optional[Tensor]:
    """The Pad ``node`` (over ``inputs``) applied to ``source``, of which its input is the
    transposition by ``perm``; None where its widths are not constant."""
    pads = inputs[1] if len(inputs) > 1 else None
    if pads is None or pads.value is None or len(inputs) > 3:
        return None
    widths, rank = list(pads.value), len(perm)
    if len(widths) != 2 * rank:
        return None
    moved = [0] * (2 * rank)
    for k, p in enumerate(perm):
        moved[p], moved[p + rank] = widths[k], widths[k + rank]
    new_pads = constant(np.array(moved, np.int64), f"{node.name}/pads")
    return apply("Pad", [source, new_pads, *inputs[2:]], node.attrs, node.name)[0]


def _to_last(x: Tensor, name: str) -> Tensor:
    """``x`` channels-last. A zero padding in front of the layer (canonicalize splits it
    off a convolution) pads the transposed input instead: transposing the padded tensor stores
    each element a channel plane from the last, padding included (a 960-channel 28x28
    map padded by 12 on every side took 15 ms to pad and transpose so, 3x the layer's
    ONNX Runtime time)."""
    pad = x.producer
    if pad is not None and pad.op_type == "Pad" and x.rank >= 3 and \
            pad.attrs.get("mode", "constant") in ("constant", b"constant"):
        last = _transpose(pad.inputs[0], to_last(x.rank), name)
        padded = _pad_before(pad, pad.inputs, last, to_first(x.rank))
        if padded is not None:
            return padded
    return _transpose(x, to_last(x.rank), name)


def _sink_concat(node: Operator, inputs: list) -> Optional[Sequence[Tensor]]:
    found = [_back_to_first(t) for t in inputs]
    if any(f is None for f in found) or len({tuple(f[1]) for f in found}) != 1:
        return None
    perm = found[0][1]
    axis = int(node.attrs["axis"]) % len(perm)
    y = apply("Concat", [f[0] for f in found], {"axis": perm[axis]}, node.name)[0]
    return [_transpose(y, perm, f"{node.name}/sunk")]


def _sink_split(node: Operator, inputs: list) -> Optional[Sequence[Tensor]]:
    """A split of channels (MixNet's mixed depthwise branches) splits the channels-last
    tensor, so each branch's convolution reads its slice in place of a transposed copy."""
    found = _back_to_first(inputs[0])
    if found is None:
        return None
    source, perm = found
    axis = int(node.attrs.get("axis", 0)) % len(perm)
    sizes = [t.shape[axis] for t in node.outputs]
    if not all(isinstance(s, int) for s in sizes):
        return None
    # One slice per part, not a Split: a single-output view fuses into its reader.
    parts, offset = [], 0
    for t, size in zip(node.outputs, sizes):
        bounds = [constant(np.array([v], np.int64), f"{t.name}/{what}")
                  for what, v in (("starts", offset), ("ends", offset + size),
                                  ("axes", perm[axis]))]
        part = apply("Slice", [source, *bounds], {}, f"{t.name}/last")[0]
        parts.append(_transpose(part, perm, f"{t.name}/sunk"))
        offset += size
    return parts


def _sink_global_pool(node: Operator, x: Tensor) -> Optional[Sequence[Tensor]]:
    """A global pooling (a squeeze-and-excitation gate's) reduces the spatial axes of the
    channels-last tensor: its producer then writes one layout instead of two."""
    return _sunk(node, x, lambda source, perm: apply(
        GLOBAL_POOLS[node.op_type], [source],
        {"axes": list(range(1, len(perm) - 1)), "keepdims": 1}, node.name)[0])


def _sink_norm(node: Operator, inputs: list) -> Optional[Sequence[Tensor]]:
    """Instance and group normalisation channels-last: their moments are column sums over
    the pixels (Candy's every layer; NCHW between them cost each convolution a transposed
    store and each reflection padding a transposed copy)."""
    return _sunk(node, inputs[0], lambda source, perm: apply(
        NORMS[node.op_type], [source, *inputs[1:]], node.attrs, node.name)[0])


def _sink_resize(node: Operator, inputs: list) -> Optional[Sequence[Tensor]]:
    """A resize with constant scales or sizes (an upsampling between layers) resizes the
    channels-last tensor, its scales or sizes moved with the axes."""
    roi = inputs[1] if len(inputs) > 1 else None
    if node.attrs.get("axes") is not None or not all(
            t is None or t.is_constant for t in inputs[1:]) or (roi is not None
                                                                 and roi.data.size):
        return None

    def build(source: Tensor, perm: list[int]) -> Optional[Tensor]:
        moved = list(inputs[1:])
        for k, given in enumerate(inputs[2:4], start=2):
            if given is None or not given.data.size:
                continue
            if given.data.size != len(perm):
                return None
            values = np.empty_like(given.data)
            values[perm] = given.data
            moved[k - 1] = constant(values, f"{node.name}/moved{k}", given.dtype)
        return apply("Resize", [source, *moved], node.attrs, node.name)[0]
    return _sunk(node, inputs[0], build)


def _unflatten_pixels(node: Operator, x: Tensor) -> Optional[Sequence[Tensor]]:
    """A token sequence N x HW x C, transposed to N x C x HW and viewed as an image
    N x C x H x W (a vision transformer's head: Segformer's), is the sequence viewed as
    N x H x W x C and transposed to NCHW: a transpose that sinks through the image
    operators after it (resizing, concatenation) to cancel against a convolution's."""
    found = _transposed(x)
    shape = node.outputs[0].shape
    if found is None or found[1] != [0, 2, 1] or len(shape) < 4:
        return None
    tokens = found[0]
    batch, length, channels = tokens.shape
    spatial = shape[2:]
    if (shape[0] != batch or shape[1] != channels
            or not all(isinstance(d, int) for d in (length, *spatial))
            or int(np.prod(spatial)) != length):
        return None
    image = dims_tensor([batch, *spatial, channels], f"{node.name}/pixels")
    last = apply("Reshape", [tokens, image], {}, f"{node.name}/last")[0]
    return [_transpose(last, to_first(len(shape)), f"{node.name}/sunk")]
