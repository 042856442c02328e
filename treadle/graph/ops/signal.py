"""Signal processing: the window functions, the discrete Fourier transform (DFT) and the
short-time Fourier transform (STFT).

A complex tensor is a real one with a last axis of 2 (real, imaginary); a real signal has a
last axis of 1. Each output frequency is a sum over the signal of the sample times
e^(-i theta), theta = 2 pi k n / N, as a reduction. The phase is taken from k * n modulo N
in integers, then scaled in float64, so that long transforms keep their accuracy, and the
products are summed in the signal's type.
"""
from __future__ import annotations

import math

from treadle.graph.operator import OpContext, register
from treadle.graph.ops.common import normalize_axis, onnx_dtype
from treadle.graph.ops.transform import _dims, known_scalar
from treadle.graph.tensor import Dim, normalize_dim
from treadle.ir import dtypes
from treadle.ir.compute import Compute, compute, reduce
from treadle.ir.expr import Buffer, Const, Expr, as_expr, call, cast, eq, minimum, select


def _phase(m: Expr, n: Dim) -> Expr:
    """2 pi m / n in float64."""
    return cast(m, dtypes.float64) * Const(2 * math.pi, dtypes.float64) / cast(
        as_expr(n), dtypes.float64)


# ---- windows: w[n] = sum of c_j cos(2 pi j n / N) -------------------------------------
WINDOWS = {"HannWindow": (0.5, -0.5), "HammingWindow": (25 / 46, -21 / 46),
           "BlackmanWindow": (0.42, -0.5, 0.08)}


def _window(ctx: OpContext) -> list[Compute]:
    size = known_scalar(ctx, 0, "size")
    if isinstance(size, int) and size < 0:
        raise ctx.error(f"size must not be negative, got {size}")
    dtype = onnx_dtype(ctx, ctx.attr("output_datatype", 1))
    # A periodic window is one period of a window one longer, a symmetric one ends as it
    # starts.
    period = size if ctx.attr("periodic", 1) else as_expr(size) - 1

    def element(n):
        terms = [Const(c, dtypes.float64) * call("cos", _phase(n * j, period))
                 for j, c in enumerate(WINDOWS[ctx.op_type])]
        return cast(sum(terms[1:], terms[0]), dtype)
    return [compute("y", [size], element)]


for _name in WINDOWS:
    register(_name)(_window)


# ---- DFT --------------------------------------------------------------------------------
def _complex(x: Buffer, at) -> tuple[Expr, Expr]:
    """The real and imaginary parts of x at index ``at`` (without the last axis)."""
    if normalize_dim(x.shape[-1]) == 1:
        return x[(*at, 0)], Const(0.0, x.dtype)
    return x[(*at, 0)], x[(*at, 1)]


def _dft(x: Buffer, out: list[Dim], axis: int, terms: Dim, size: Dim, inverse: bool,
         sample=None) -> Compute:
    """y[.., k, .., c] = sum over n < ``terms`` of sample(n) e^(-+ i 2 pi k n / size)
    (+ for ``inverse``), part c; ``sample(i, n)`` defaults to x at i with n on ``axis``."""
    sign = -1.0 if inverse else 1.0

    def element(*index):
        i, n = index[:-1], index[-1]
        re, im = (sample or (lambda i, n: _complex(x, (*i[:axis], n, *i[axis + 1:-1]))))(i, n)
        theta = _phase(i[axis] * n % as_expr(size), size)
        cos, sin = (cast(call(f, theta), x.dtype) for f in ("cos", "sin"))
        real = re * cos + Const(sign, x.dtype) * im * sin
        imaginary = im * cos - Const(sign, x.dtype) * re * sin
        return select(eq(i[-1], 0), real, imaginary)
    total = reduce("dft", out, [terms], element)
    if not inverse:
        return total
    return compute("y", out, lambda *i: total[i] / cast(as_expr(size), x.dtype))


def _half_spectrum(x: Buffer, out: list[Dim], axis: int, terms: Dim, size: Dim) -> Compute:
    """The real signal of length ``size`` whose spectrum is Hermitian and starts with the
    ``terms`` given: y[n] = (1/N) sum over k of w_k (Re X_k cos - Im X_k sin)(2 pi k n / N),
    w_k = 1 for k = 0 and k = N/2, else 2 (the conjugate half counted twice)."""
    def element(*index):
        i, k = index[:-1], index[-1]
        re, im = _complex(x, (*i[:axis], k, *i[axis + 1:-1]))
        theta = _phase(k * i[axis] % as_expr(size), size)
        edge = eq(k, 0) | eq(k * 2, size)
        weight = select(edge, Const(1.0, x.dtype), Const(2.0, x.dtype))
        return weight * (re * cast(call("cos", theta), x.dtype)
                         - im * cast(call("sin", theta), x.dtype))
    total = reduce("irfft", out, [terms], element)
    return compute("y", out, lambda *i: total[i] / cast(as_expr(size), x.dtype))


def _signal_input(ctx: OpContext, i: int, what: str) -> tuple[Buffer, list[Dim]]:
    x, shape = ctx.input(i), _dims(ctx, i)
    if len(shape) < 2 or shape[-1] not in (1, 2):
        raise ctx.error(f"{what} must end in an axis of 1 (real) or 2 (complex), got shape "
                        f"{shape}")
    if not x.dtype.is_float:
        raise ctx.unsupported(f"{what} of type {x.dtype}")
    return x, shape


@register("DFT")
def dft(ctx: OpContext) -> list[Compute]:
    x, shape = _signal_input(ctx, 0, "the input")
    axis = known_scalar(ctx, 2, "axis") if ctx.has_input(2) else -2
    if not isinstance(axis, int):
        raise ctx.unsupported(f"a symbolic axis {axis}")
    axis = normalize_axis(ctx, axis, len(shape))
    if axis == len(shape) - 1:
        raise ctx.error("the axis must not be the last (real, imaginary) one")
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    given = shape[axis]
    if ctx.has_input(1):
        size = known_scalar(ctx, 1, "dft_length")
    else:
        size = as_expr(given) * 2 - 2 if inverse and onesided else given
    if isinstance(size, int) and size < 1:
        raise ctx.error(f"dft_length must be positive, got {size}")
    if inverse and onesided:
        terms = _smaller(given, as_expr(size) // 2 + 1)
        return [_half_spectrum(x, [*shape[:axis], size, *shape[axis + 1:-1], 1], axis,
                               terms, size)]
    if onesided and shape[-1] == 2:
        raise ctx.unsupported("a one-sided transform of a complex signal")
    bins = as_expr(size) // 2 + 1 if onesided else size
    out = [*shape[:axis], bins, *shape[axis + 1:-1], 2]
    return [_dft(x, out, axis, _smaller(given, size), size, inverse)]


def _smaller(a: Dim, b) -> Dim:
    """The signal's terms that count: zero-padded past it, cut past the transform."""
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return minimum(as_expr(a), as_expr(b))


# ---- STFT -------------------------------------------------------------------------------
@register("STFT")
def stft(ctx: OpContext) -> list[Compute]:
    x, shape = _signal_input(ctx, 0, "the signal")
    if len(shape) != 3:
        raise ctx.error(f"the signal must be [batch, length, 1 or 2], got {shape}")
    step = known_scalar(ctx, 1, "frame_step")
    window = ctx.input(2) if ctx.has_input(2) else None
    if ctx.has_input(3):
        length = known_scalar(ctx, 3, "frame_length")
    elif window is not None:
        length = _dims(ctx, 2)[0]
    else:
        raise ctx.error("needs a window or a frame_length")
    if isinstance(step, int) and step < 1:
        raise ctx.error(f"frame_step must be positive, got {step}")
    frames = (as_expr(shape[1]) - length) // step + 1
    bins = as_expr(length) // 2 + 1 if ctx.attr("onesided", 1) else length

    def sample(i, n):
        re, im = _complex(x, (i[0], i[1] * step + n))
        if window is None:
            return re, im
        return re * window[(n,)], im * window[(n,)]
    return [_dft(x, [shape[0], frames, bins, 2], 2, length, length, False, sample)]
