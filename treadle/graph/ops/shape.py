"""Operators that make shapes and constants: Shape, Size, Constant, ConstantOfShape,
Range, EyeLike (and NonZero, refused), and the internal Dims.

Shape's output holds the input's dimensions, which may be symbolic. Its compute
definition picks, for each output index, one of those size expressions from a tree of
selects: at run time the kernel evaluates the chosen expression from the symbol values,
and at compile time ``graph/known.py`` evaluates the same definition at each constant
index, where the selects fold away and leave the dimension itself (``seq``). So the
Reshape targets an exported model computes from ``Shape`` are known, symbolically.

Constant nodes use the same tree over their literal elements; that suits the small
constants of shape arithmetic. A frontend should turn a large Constant into a constant
tensor, ``constant(constant_value(attrs))``, and this op refuses one above
``MAX_CONSTANT_ELEMENTS``.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from treadle.errors import UnsupportedOpError
from treadle.graph.operator import OpContext, apply, register
from treadle.graph.ops.common import onnx_dtype, same_dtype
from treadle.graph.ops.transform import known_scalar, simplify_dim
from treadle.graph.tensor import Tensor, constant, num_elements
from treadle.ir import dtypes
from treadle.ir.compute import compute
from treadle.ir.dtypes import DataType, dtype_of
from treadle.ir.expr import Const, Expr, as_expr, cast, eq, maximum, select
from treadle.ir.mapping import ravel

MAX_CONSTANT_ELEMENTS = 1024


def pick(values: Sequence, index: Expr, dtype: DataType) -> Expr:
    """``values[index]`` as a balanced tree of selects (depth log2 of the count)."""
    if not values:
        return Const(0, dtype)
    if len(values) == 1:
        value = values[0]
        return cast(value, dtype) if isinstance(value, Expr) else Const(value, dtype)
    middle = len(values) // 2
    return select(index < middle, pick(values[:middle], index, dtype),
                  pick(values[middle:], index - middle, dtype))


@register("Shape")
def shape_op(ctx: OpContext):
    ctx.input(0)
    dims = list(ctx.tensors[0].shape)
    rank = len(dims)
    start, end = (min(max(v + rank if v < 0 else v, 0), rank)
                  for v in (ctx.attr("start", 0), ctx.attr("end", rank)))
    picked = dims[start:end]
    return [compute("shape", [len(picked)], lambda i: pick(picked, i, dtypes.int64))]


@register("Dims", internal=True)
def dims_op(ctx: OpContext):
    """The sizes in attribute ``dims`` (ints or symbolic expressions) as an int64 vector:
    frontends whose graphs give sizes as values rather than as Shape chains (PyTorch's
    ``SymInt``) hand them to Reshape, Expand and ConstantOfShape this way."""
    dims = list(ctx.required_attr("dims"))
    return [compute("dims", [len(dims)], lambda i: pick(dims, i, dtypes.int64))]


def dims_tensor(dims: Sequence, name: str) -> Tensor:
    """Sizes as an int64 vector: a constant, or a Dims node where one is symbolic."""
    if all(isinstance(d, int) for d in dims):
        return constant(np.array(dims, np.int64), name)
    return apply("Dims", [], {"dims": list(dims)}, name)[0]


@register("Size")
def size_op(ctx: OpContext):
    ctx.input(0)
    size = num_elements(ctx.tensors[0].shape)
    return [compute("size", [], lambda: as_expr(size))]


def _array(value) -> np.ndarray:
    """A tensor attribute as numpy, whether it arrives converted or as an ONNX TensorProto."""
    if hasattr(value, "data_type") and hasattr(value, "dims"):
        from onnx import numpy_helper
        return numpy_helper.to_array(value)
    return np.asarray(value)


# Constant's attributes: name -> its value as an array.
CONSTANT_ATTRS = {
    "value": _array,
    "value_float": lambda v: np.array(v, np.float32),
    "value_floats": lambda v: np.array(v, np.float32),
    "value_int": lambda v: np.array(v, np.int64),
    "value_ints": lambda v: np.array(v, np.int64),
}


def constant_value(attrs: dict, where: str = "Constant") -> np.ndarray:
    """The tensor a Constant node holds, from its ONNX attributes."""
    given = [k for k in attrs if attrs[k] is not None]
    if len(given) != 1:
        raise UnsupportedOpError(f"{where}: needs exactly one value attribute, got {given}")
    if given[0] not in CONSTANT_ATTRS:
        raise UnsupportedOpError(f"{where}: attribute {given[0]!r} is not supported")
    return CONSTANT_ATTRS[given[0]](attrs[given[0]])


@register("Constant")
def constant_op(ctx: OpContext):
    data = constant_value(ctx.attrs, ctx.where)
    if data.size > MAX_CONSTANT_ELEMENTS:
        raise ctx.unsupported(f"a Constant of {data.size} elements should become a constant "
                              "tensor: constant(constant_value(attrs))")
    dtype = dtype_of(data.dtype)
    flat = data.reshape(-1).tolist()
    return [compute("constant", data.shape, lambda *i: pick(flat, ravel(i, data.shape), dtype))]


@register("ConstantOfShape")
def constant_of_shape(ctx: OpContext):
    shape = ctx.known(0, "the shape")
    if any(isinstance(d, int) and d < 0 for d in shape):
        raise ctx.error(f"negative dimension in shape {[str(d) for d in shape]}")
    value = _array(ctx.attr("value", np.zeros(1, np.float32)))
    if value.size != 1:
        raise ctx.error(f"value must hold one element, got {value.size}")
    element = Const(value.reshape(-1)[0].item(), dtype_of(value.dtype))
    return [compute("y", shape, lambda *i: element)]


def _scalar(ctx: OpContext, i: int, what: str):
    """An int (maybe symbolic) known when compiling, or a float from a constant."""
    if ctx.input(i).dtype.is_integer:
        return known_scalar(ctx, i, what)
    data = ctx.data(i)
    if data is None:
        raise ctx.needs_value(i, what)
    if data.size != 1:
        raise ctx.error(f"{what} (input {i}) must be a scalar, got {data.size} values")
    if ctx.input(i).dtype == dtypes.bfloat16:  # held as its bits, the top half of a float32
        return (data.reshape(1).astype(np.uint32) << 16).view(np.float32)[0]
    return data.reshape(-1)[0]


@register("Range")
def range_op(ctx: OpContext):
    dtype = same_dtype(ctx, ctx.input(0), ctx.input(1), ctx.input(2))
    start, limit, delta = (_scalar(ctx, k, w) for k, w in enumerate(("start", "limit", "delta")))
    if not isinstance(delta, Expr) and delta == 0:
        raise ctx.error("delta is 0")
    if dtype.is_float:
        # As ONNX Runtime: the difference in the tensor's type, the quotient in double.
        count = max(math.ceil(float(limit - start) / float(delta)), 0)
        # bfloat16 arithmetic is float32's, rounded once.
        work = dtypes.float32 if dtype == dtypes.bfloat16 else dtype
        return [compute("y", [count], lambda i: cast(
            Const(start.item(), work) + cast(i, work) * Const(delta.item(), work), dtype))]
    if isinstance(delta, Expr):
        raise ctx.unsupported(f"symbolic delta {delta}")
    step = abs(delta)
    span = as_expr(limit) - start if delta > 0 else as_expr(start) - limit
    # C's division rounds toward zero, so an empty range gives 0 or less: clamp at 0.
    count = simplify_dim(maximum((span + (step - 1)) // step, 0))
    return [compute("y", [count], lambda i: cast(as_expr(start) + i * delta, dtype))]


@register("EyeLike")
def eye_like(ctx: OpContext):
    x = ctx.input(0)
    if x.rank != 2:
        raise ctx.error(f"needs a 2-D input, got rank {x.rank}")
    dtype = onnx_dtype(ctx, ctx.attr("dtype")) if ctx.attr("dtype") is not None else x.dtype
    k = ctx.attr("k", 0)
    return [compute("y", x.shape, lambda r, c: select(eq(c - r, k), Const(1, dtype),
                                                      Const(0, dtype)))]

