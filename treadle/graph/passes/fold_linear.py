"""A pointwise convolution of a dense layer's tokens folds into the layer.

Vision transformers keep tokens as N x pixels x C and view them as an N x C x H x W
image (a transpose and a reshape) for their convolutions. A 1x1 convolution of such a
view is the matrix product ``tokens @ W.T``; where the tokens come straight from a dense
layer ``X @ P + b`` with constant weights, the two products are one,
``X @ (P @ W.T) + b @ W.T``, fewer multiply-adds wherever the folded matrix is smaller
than the two. Segformer's decoder projects each stage to 256 channels and convolves
them again (after ``resize_conv`` moved its fusion convolution before the resizes):
folded, the first stage's products fall from 1.2 to 0.13 GMAC.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import numpy as np

from treadle.graph.graph import Graph
from treadle.graph.operator import Operator, apply
from treadle.graph.passes.resize_conv import pointwise
from treadle.graph.rewrite import consumers, rewrite_graph, sole_reader
from treadle.graph.tensor import Tensor, constant


def fold_linear(graph: Graph) -> Graph:
    sole = functools.partial(sole_reader, consumers(graph))

    def rule(node: Operator, inputs: list) -> Optional[Sequence[Tensor]]:
        if node.op_type != "Conv" or not pointwise(node, inputs) or inputs[0].rank != 4:
            return None
        return _fold(node, inputs, sole)
    return rewrite_graph(graph, rule)


def _fold(node: Operator, inputs: list, sole) -> Optional[Sequence[Tensor]]:
    out = node.outputs[0]
    dense = _dense_tokens(node.inputs[0], inputs[0], sole)
    if dense is None or not all(isinstance(d, int) for d in out.shape):
        return None
    x, p, b = dense
    w = inputs[1].data[:, :, 0, 0].T  # C x Co
    if p.shape[0] * w.shape[1] >= p.size + w.size:  # no fewer multiply-adds per token
        return None
    bias = b @ w if b is not None else np.zeros(w.shape[1], w.dtype)
    if len(inputs) > 2 and inputs[2] is not None:
        bias = bias + inputs[2].data
    name = node.name
    y = apply("MatMul", [x, constant((p @ w).astype(p.dtype), f"{name}/folded")], {},
              f"{name}/folded")[0]
    y = apply("Add", [y, constant(bias.astype(p.dtype), f"{name}/folded_bias")], {},
              f"{name}/folded_bias")[0]
    y = apply("Transpose", [y], {"perm": [0, 2, 1]}, f"{name}/image")[0]
    shape = constant(np.array(out.shape, np.int64), f"{name}/image_shape")
    return [apply("Reshape", [y, shape], {}, f"{name}/image_view")[0]]


def _dense_tokens(old: Tensor, new: Tensor, sole
                  ) -> Optional[tuple[Tensor, np.ndarray, Optional[np.ndarray]]]:
    """(X, P, b) where ``new`` views ``X @ P + b`` (N x pixels x C, b optional) as an
    N x C x H x W image and nothing else reads the steps between; else None."""
    steps = []
    for op_type in ("Reshape", "Transpose"):
        producer = new.producer
        if producer is None or producer.op_type != op_type or not sole(old):
            return None
        steps.append(producer)
        old, new = old.producer.inputs[0], producer.inputs[0]
    reshape, transpose = steps
    if (list(transpose.attrs.get("perm", [])) != [0, 2, 1] or new.rank != 3
            or tuple(reshape.outputs[0].shape[:2]) != tuple(transpose.outputs[0].shape[:2])
            or not sole(old)):
        return None
    bias = None
    add = new.producer
    if add is not None and add.op_type == "Add":
        constants = [t for t in add.inputs if t.is_constant]
        if len(constants) != 1 or constants[0].data.size != new.shape[2] \
                or constants[0].shape[-1:] != new.shape[2:]:
            return None
        bias = constants[0].data.reshape(-1)
        product = next(t for t in add.inputs if not t.is_constant)
        old_product = next(t for t in old.producer.inputs if not t.is_constant)
        if tuple(product.shape) != tuple(new.shape) or not sole(old_product):
            return None
        new = product
    matmul = new.producer
    if matmul is None or matmul.op_type != "MatMul" or not matmul.inputs[1].is_constant \
            or matmul.inputs[1].rank != 2:
        return None
    return matmul.inputs[0], matmul.inputs[1].data, bias
