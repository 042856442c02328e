"""Helpers shared by operator definitions: broadcasting, axes, dtype checks, ONNX dtypes."""
from __future__ import annotations

from typing import Sequence

from treadle.errors import DTypeError
from treadle.graph.operator import OpContext
from treadle.graph.tensor import Dim, normalize_dim
from treadle.ir import dtypes
from treadle.ir.dtypes import DataType
from treadle.ir.expr import Buffer, Expr, Load, as_expr, eq, select

# ONNX TensorProto.DataType codes.
ONNX_DTYPES: dict[int, DataType] = {
    1: dtypes.float32, 2: dtypes.uint8, 3: dtypes.int8, 4: dtypes.uint16, 5: dtypes.int16,
    6: dtypes.int32, 7: dtypes.int64, 9: dtypes.boolean, 10: dtypes.float16,
    11: dtypes.float64, 12: dtypes.uint32, 13: dtypes.uint64, 16: dtypes.bfloat16,
}


def onnx_dtype(ctx: OpContext, code: int) -> DataType:
    if code not in ONNX_DTYPES:
        raise ctx.unsupported(f"ONNX data type {code} is not supported")
    return ONNX_DTYPES[code]


def same_dtype(ctx: OpContext, *buffers: Buffer) -> DataType:
    first = buffers[0].dtype
    for k, b in enumerate(buffers[1:], 1):
        if b.dtype != first:
            raise DTypeError(f"{ctx.where}: inputs have different dtypes ({first} and {b.dtype} "
                             f"for input {k})")
    return first


def _dim(d) -> Dim:
    return normalize_dim(d)


def broadcast_shape(ctx: OpContext, *shapes: Sequence[Expr]) -> tuple[Dim, ...]:
    """The numpy/ONNX broadcast of several shapes. A symbolic dimension may be 1 at run
    time and then broadcasts: against a concrete size other than 1 it is taken to be that
    size or 1, against another symbol the result is the larger of the two, and the kernel
    checks at run time that the sizes agree."""
    rank = max(len(s) for s in shapes)
    padded = [(1,) * (rank - len(s)) + tuple(_dim(d) for d in s) for s in shapes]
    result = []
    for axis in range(rank):
        out: Dim = 1
        for d in (p[axis] for p in padded):
            if d == 1 or d == out:
                continue
            if out == 1:
                out = d
            elif isinstance(out, int) and isinstance(d, int):
                raise ctx.error(f"shapes {[list(map(str, s)) for s in shapes]} cannot be "
                                f"broadcast (axis {axis}: {out} vs {d})")
            else:
                a, b = as_expr(out), as_expr(d)
                ctx.require(eq(a, b) | eq(a, 1) | eq(b, 1),
                            f"dimension {axis} must match for broadcasting ({d} vs {out})")
                if isinstance(d, int):
                    out = d
                elif not isinstance(out, int):
                    out = _dim(select(eq(a, 1), b, a))  # 0 against 1 is 0
        result.append(out)
    return tuple(result)


def broadcast_index(dims: Sequence[Dim], out_axes: Sequence[Expr],
                    out_shape: Sequence[Dim]) -> tuple[Expr, ...]:
    """The index into trailing-aligned ``dims`` of the result's element at ``out_axes``
    (of a result of ``out_shape``) under broadcasting. A symbolic dimension that differs
    from the result's may be 1 at run time, so its index is chosen then."""
    offset = len(out_axes) - len(dims)
    index = []
    for k, d in enumerate(dims):
        d, axis = _dim(d), out_axes[offset + k]
        if d == 1:
            index.append(as_expr(0))
        elif isinstance(d, int) or d == _dim(out_shape[offset + k]):
            index.append(axis)
        else:
            index.append(select(eq(d, 1), 0, axis))
    return tuple(index)


def broadcast_load(buffer: Buffer, out_axes: Sequence[Expr], out_shape: Sequence[Dim]) -> Load:
    """Element of ``buffer`` read at output index ``out_axes`` under broadcasting."""
    return buffer[broadcast_index(buffer.shape, out_axes, out_shape)]


def normalize_axis(ctx: OpContext, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def normalize_axes(ctx: OpContext, axes: Sequence[int], rank: int) -> list[int]:
    result = [normalize_axis(ctx, int(a), rank) for a in axes]
    if len(set(result)) != len(result):
        raise ctx.error(f"repeated axes {list(axes)}")
    return result


def static_dim(ctx: OpContext, dim, what: str) -> int:
    """``dim`` as an int, which the operator needs when compiling (a head size)."""
    d = normalize_dim(dim)
    if not isinstance(d, int):
        raise ctx.unsupported(f"{what} must be known when compiling, got {d}")
    return d
