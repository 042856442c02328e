"""Helpers shared by operator definitions: broadcasting, axes, dtype checks, ONNX dtypes."""
from __future__ import annotations

from typing import Sequence

from treadle.errors import DTypeError
from treadle.graph.operator import OpContext
from treadle.graph.tensor import Dim, normalize_dim
from treadle.ir import dtypes
from treadle.ir.dtypes import DataType
from treadle.ir.expr import Buffer, Expr, Load, as_expr, eq

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
    """The numpy/ONNX broadcast of several shapes. A symbolic dimension against a concrete
    one other than 1 is taken to equal it, and the kernel checks that at run time."""
    rank = max(len(s) for s in shapes)
    padded = [(1,) * (rank - len(s)) + tuple(_dim(d) for d in s) for s in shapes]
    result = []
    for axis in range(rank):
        dims = [p[axis] for p in padded]
        out: Dim = 1
        for d in dims:
            if d == 1 or d == out:
                continue
            if out == 1:
                out = d
            elif isinstance(out, int) and isinstance(d, int):
                raise ctx.error(f"shapes {[list(map(str, s)) for s in shapes]} cannot be "
                                f"broadcast (axis {axis}: {out} vs {d})")
            else:
                ctx.require(eq(as_expr(d), as_expr(out)),
                            f"dimension {axis} must match for broadcasting ({d} vs {out})")
                out = out if isinstance(out, int) else d
        result.append(out)
    return tuple(result)


def broadcast_load(buffer: Buffer, out_axes: Sequence[Expr]) -> Load:
    """Element of ``buffer`` read at output index ``out_axes`` under broadcasting."""
    offset = len(out_axes) - buffer.rank
    index = [as_expr(0) if _dim(d) == 1 else out_axes[offset + k]
             for k, d in enumerate(buffer.shape)]
    return buffer[tuple(index)]


def normalize_axis(ctx: OpContext, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def normalize_axes(ctx: OpContext, axes: Sequence[int], rank: int) -> list[int]:
    result = [normalize_axis(ctx, int(a), rank) for a in axes]
    if len(set(result)) != len(result):
        raise ctx.error(f"repeated axes {list(axes)}")
    return result
