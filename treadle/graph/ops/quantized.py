"""Integer products of quantised tensors: MatMulInteger and ConvInteger, and the
QLinearMatMul and QLinearConv that import as dequantised products.

Both sum the products of 8-bit factors less their zero points in int32, as ONNX defines
them (a convolution's padding reads as the input's zero point, so it adds nothing).
Their computes are those definitions; ``passes.integer_products`` rewrites one with zero
points into a product of the raw bytes (which the GEMM template runs on VNNI) and
corrections that fuse into its epilogue. ``ChannelsLastConvInteger`` is the channels-last
twin that ``passes.channels_last`` makes, as for Conv.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from treadle.errors import DTypeError
from treadle.graph.operator import OpContext, apply, register
from treadle.graph.ops.common import broadcast_index
from treadle.graph.ops.nn import NCHW, NHWC, Layout, conv_product, matmul_product
from treadle.graph.tensor import Tensor, normalize_dim
from treadle.ir import dtypes
from treadle.ir.expr import Buffer, Expr, as_expr, cast

BYTE_TYPES = (dtypes.uint8, dtypes.int8)


@register("MatMulInteger")
def matmul_integer(ctx: OpContext):
    """numpy.matmul of (a - a_zero_point) and (b - b_zero_point) in int32; a zero point
    is one value, one per row of a (per column of b), or broadcast along a's leading
    dimensions with a 1 in place of K."""
    a, b = _byte_operands(ctx)
    shifts = [_zero_point(ctx, k, x, row) for k, x, row in ((2, a, True), (3, b, False))]

    def factor(x: Buffer, index: tuple) -> Expr:
        value = cast(x[index], dtypes.int32)
        shift = shifts[0] if x is a else shifts[1]
        return value if shift is None else value - shift(index)
    return [matmul_product(ctx, a, b, factor)]


def _conv_integer(ctx: OpContext, layout: Layout):
    """Conv of (x - x_zero_point) and (w - w_zero_point) in int32; x's zero point is one
    value, w's one or one per output channel."""
    x, w = _byte_operands(ctx)
    if x.rank < 3:
        raise ctx.error(f"input 0 must be N x C x spatial..., got rank {x.rank}")
    zero_x = _conv_zero(ctx, 2, x, None)
    channels = w.shape[-1] if layout.channels_last else w.shape[0]
    zero_w = _conv_zero(ctx, 3, w, channels)
    fill = zero_x(()) if zero_x else as_expr(0, x.dtype)

    def x_factor(value: Expr) -> Expr:
        wide = cast(value, dtypes.int32)
        return wide if zero_x is None else wide - cast(zero_x(()), dtypes.int32)

    def w_factor(value: Expr, oc: Expr) -> Expr:
        wide = cast(value, dtypes.int32)
        return wide if zero_w is None else wide - cast(zero_w((oc,)), dtypes.int32)
    return [conv_product(ctx, layout, x, w, x_factor, w_factor, fill)]


register("ConvInteger")(lambda ctx: _conv_integer(ctx, NCHW))
register("ChannelsLastConvInteger", internal=True)(lambda ctx: _conv_integer(ctx, NHWC))


def _byte_operands(ctx: OpContext) -> tuple[Buffer, Buffer]:
    operands = ctx.input(0), ctx.input(1)
    for k, x in enumerate(operands):
        if x.dtype not in BYTE_TYPES:
            raise ctx.error(f"input {k} must be uint8 or int8, got {x.dtype}", DTypeError)
    return operands


def _conv_zero(ctx: OpContext, i: int, x: Buffer, channels
               ) -> Optional[Callable[[tuple], Expr]]:
    """A convolution operand's zero point at (output channel,): one value, or with
    ``channels`` given, one per output channel; None where there is none."""
    z = _zero_input(ctx, i, x)
    if z is None:
        return None
    if _single(z):
        return lambda index: z[(as_expr(0),) * z.rank]
    if channels is None or z.rank != 1 or normalize_dim(z.shape[0]) != normalize_dim(channels):
        per = "" if channels is None else f" or {channels}, one per output channel"
        raise ctx.error(f"input {i} (zero point) has shape {[str(d) for d in z.shape]}; it "
                        f"must hold 1 value{per}")
    return lambda index: z[index]


def _zero_input(ctx: OpContext, i: int, x: Buffer) -> Optional[Buffer]:
    """Input ``i``, the zero point of operand ``x``, which has x's type; None if absent."""
    if not ctx.has_input(i):
        return None
    z = ctx.input(i)
    if z.dtype != x.dtype:
        raise ctx.error(f"input {i} (zero point) must have its operand's type {x.dtype}, "
                        f"got {z.dtype}", DTypeError)
    return z


def _single(z: Buffer) -> bool:
    return z.rank == 0 or (z.rank == 1 and normalize_dim(z.shape[0]) == 1)


def _zero_point(ctx: OpContext, i: int, x: Buffer, row: bool
                ) -> Optional[Callable[[tuple], Expr]]:
    """The zero point of operand ``x`` at one of its indices, as int32; None where there
    is none."""
    z = _zero_input(ctx, i, x)
    if z is None:
        return None
    axis = -2 if row else -1
    if _single(z):
        return lambda index: cast(z[(as_expr(0),) * z.rank], dtypes.int32)
    if z.rank == 1 and x.rank >= 2:
        if normalize_dim(z.shape[0]) != normalize_dim(x.shape[axis]):
            raise ctx.error(f"input {i} (zero point) has {z.shape[0]} values, one per "
                            f"{'row' if row else 'column'} needs {x.shape[axis]}")
        return lambda index: cast(z[(index[axis],)], dtypes.int32)
    if z.rank != x.rank:
        raise ctx.error(f"input {i} (zero point) of shape {[str(d) for d in z.shape]} "
                        f"fits neither per tensor nor per {'row' if row else 'column'}")
    return lambda index: cast(z[broadcast_index(z.shape, index, x.shape)], dtypes.int32)


# ---- QLinearMatMul and QLinearConv: their dequantised float op, quantised ---------------
# Imported as DequantizeLinear -> MatMul / Conv -> QuantizeLinear, the QDQ form, which
# passes.integer_products turns into an integer product whose epilogue requantises.

def qlinear_matmul(inputs: Sequence[Optional[Tensor]], attrs: dict, name: str,
                   out: Optional[str]) -> list[Tensor]:
    a, b = _dequantize(inputs[0:3], -1, f"{name}/a"), _dequantize(inputs[3:6], -1, f"{name}/b")
    y = apply("MatMul", [a, b], name=f"{name}/float")[0]
    return _requantize(y, inputs[6:8], name, out)


def qlinear_conv(inputs: Sequence[Optional[Tensor]], attrs: dict, name: str,
                 out: Optional[str]) -> list[Tensor]:
    """Its int32 bias has the scale x_scale * w_scale (per output channel) and no zero
    point."""
    x, scale_x = _dequantize(inputs[0:3], 1, f"{name}/x"), inputs[1]
    w, scale_w = _dequantize(inputs[3:6], 0, f"{name}/w"), inputs[4]
    operands = [x, w]
    if len(inputs) > 8 and inputs[8] is not None:
        scale = apply("Mul", [scale_x, scale_w], name=f"{name}/bias_scale")[0]
        operands.append(apply("DequantizeLinear", [inputs[8], scale], {"axis": 0},
                              name=f"{name}/bias")[0])
    y = apply("Conv", operands, attrs, name=f"{name}/float")[0]
    return _requantize(y, inputs[6:8], name, out)


def _dequantize(operands: Sequence[Optional[Tensor]], axis: int, name: str) -> Tensor:
    return apply("DequantizeLinear", list(operands), {"axis": axis}, name=name)[0]


def _requantize(y: Tensor, operands: Sequence[Optional[Tensor]], name: str,
                out: Optional[str]) -> list[Tensor]:
    return apply("QuantizeLinear", [y, *operands], name=name,
                 output_names=[out] if out else None)
