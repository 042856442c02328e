"""3x3 stride-1 convolutions as Winograd F(m x m, 3x3) (``ops.winograd``): 4x (m = 4) or
2.25x (m = 2) fewer multiply-adds, for the channels-last convolutions where the transforms
pay off.

It runs after ``channels_last`` (which leaves dense convolutions channels-last, their
padding split off into a Pad) and transforms each qualifying constant filter once, here.
A convolution qualifies with float32 data, a 3x3 filter over at most
MAX_CHANNELS input channels and a multiple of PANEL output channels, stride and dilation
1, one group, no padding of its own, and at least MIN_TILES output tiles: with fewer, the
per-transform-position products are too small to run the register tiles well (ResNet-50's
7x7 layers: 16 tiles of 2x2, 0.6x the direct convolution; its 14x14 ones, 49 tiles, gain
1.5x). The larger tile needs MIN_TILES tiles of its own and at least LARGE_TILE_CHANNELS
input channels, below which its larger transforms outweigh the products saved (measured
on ResNet-50 and Inception-V3 layers: 4x4 tiles 2.5-2.8x the direct convolution on
56x56x64 and 28x28x128, 2x2 tiles 2.0x; on 35x35x48 and 147x147x32 2x2 tiles win).
A symbolic batch counts as 1. Where the height or width is symbolic, the tiles may
overhang any size: layers with LARGE_TILE_CHANNELS to MAX_SYMBOLIC_LARGE_TILE_CHANNELS
input channels take 4x4 tiles, others 2x2. A 3-D convolution of a D' x 3 x 3 filter runs
as such a 2-D convolution of its depth slices and a sum over its depth taps
(``passes.depth_slices``), where the 2-D one qualifies.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

from treadle.graph.graph import Graph
from treadle.graph.operator import Operator, apply
from treadle.graph.ops.winograd import PANEL, transform_weights
from treadle.graph.passes.depth_slices import by_depth_slices, plain_convolution
from treadle.graph.rewrite import rewrite_graph
from treadle.graph.tensor import Tensor, constant, normalize_dim
from treadle.ir.dtypes import float32

MIN_TILES = 32
LARGE_TILE_CHANNELS = 64
# Where the image size is symbolic, layers with more input channels take 2x2 tiles.
MAX_SYMBOLIC_LARGE_TILE_CHANNELS = 128
# The template keeps a block of transformed input tiles, all channels, on a thread's stack.
MAX_CHANNELS = 256


def winograd(graph: Graph) -> Graph:
    return rewrite_graph(graph, _rule)


def _rule(node: Operator, inputs: list) -> Optional[Sequence[Tensor]]:
    if node.op_type != "ChannelsLastConv":
        return None
    if inputs[0].rank == 5:
        folded = by_depth_slices(node, inputs, _winograd_or_none)
        return None if folded is None else [folded]
    tile = _tile(inputs[0], inputs[1], node.attrs)
    if tile is None:
        return None
    return [_winograd(inputs[0], inputs[1], inputs[2:], tile, node.name)]


def _winograd(x: Tensor, weight: Tensor, rest: Sequence, tile: int, name: str) -> Tensor:
    u = constant(transform_weights(weight.data, tile), f"{weight.name}/winograd{tile}", float32)
    return apply("WinogradConv", [x, u, *rest], {"tile": tile}, name)[0]


def _winograd_or_none(x: Tensor, weight: Tensor, name: str) -> Optional[Tensor]:
    """The plain 2-D convolution of ``x`` by ``weight`` on Winograd, where it qualifies."""
    tile = _tile(x, weight, {})
    return None if tile is None else _winograd(x, weight, [], tile, name)


def _tile(x: Tensor, weight: Optional[Tensor], attrs: dict) -> Optional[int]:
    """The output tile side to use, 4 or 2, or None to keep the direct convolution."""
    if (x.dtype != float32 or x.rank != 4 or weight is None
            or not weight.is_constant or weight.dtype != float32):
        return None
    kh, kw, channels, filters = weight.shape
    if not (plain_convolution(attrs) and (kh, kw) == (3, 3) and filters % PANEL == 0
            and channels <= MAX_CHANNELS):
        return None
    batch, height, width, _ = (normalize_dim(d) for d in x.shape)
    if not isinstance(height, int) or not isinstance(width, int):
        # Any size: tiles may overhang it. A layer's channels tell its likely size: in
        # U-Net with a symbolic image, 4x4 tiles on layers to 128 channels ran 1.10-1.12x
        # faster than 2x2 ones everywhere at 96-256 pixels; on the 256-channel layers
        # (12-32 pixels there) 0.95-1.06x, and 1.6x slower at ResNet-50's 14 x 14.
        return 4 if LARGE_TILE_CHANNELS <= channels <= MAX_SYMBOLIC_LARGE_TILE_CHANNELS else 2
    batch = batch if isinstance(batch, int) else 1  # a symbolic batch: at least 1

    def tiles(side: int) -> int:
        return batch * math.ceil((height - 2) / side) * math.ceil((width - 2) / side)
    whole = (height - 2) % 4 == 0 and (width - 2) % 4 == 0
    if tiles(4) >= MIN_TILES and channels >= LARGE_TILE_CHANNELS and whole:
        return 4
    return 2 if tiles(2) >= MIN_TILES else None
