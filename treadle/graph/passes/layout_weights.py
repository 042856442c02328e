"""Constant convolution weights stored in the order the GEMM template reads them.

The matmul template packs a convolution's weight as its right factor, column by column of
output channels for each reduction position (input channel, kernel row, kernel column).
ONNX stores weights output channel first, so that packing gathers one element per
output channel, K floats apart. This pass stores each constant weight of a dense
convolution as [C, kH, kW, O] and reads it back through a Transpose, which the fusion
partition inlines into the convolution (a prologue on a constant): the packing then
reads rows of contiguous output channels. It runs after constant folding, which would
otherwise fold the Transpose straight back.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from treadle.graph.graph import Graph
from treadle.graph.operator import Operator, apply
from treadle.graph.rewrite import rewrite_graph
from treadle.graph.tensor import Tensor, constant


def layout_weights(graph: Graph) -> Graph:
    return rewrite_graph(graph, _conv_weight)


def _conv_weight(node: Operator, inputs: list) -> Optional[Sequence[Tensor]]:
    if node.op_type != "Conv" or int(node.attrs.get("group", 1)) != 1:
        return None
    weight = inputs[1]
    if weight is None or not weight.is_constant:
        return None
    rank = weight.rank
    stored = constant(np.ascontiguousarray(np.moveaxis(weight.data, 0, -1)),
                      f"{weight.name}/channels_last", weight.dtype)
    perm = [rank - 1, *range(rank - 1)]
    read = apply("Transpose", [stored], {"perm": perm}, f"{node.name}/weight")[0]
    return [apply("Conv", [inputs[0], read, *inputs[2:]], node.attrs, node.name)[0]]
