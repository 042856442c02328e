"""Neural-network operators: softmax, normalisations, matmul, convolution and pooling.

Every op is a compute definition built from reductions and element-wise maps. Softmax is a
max and a sum reduction with the output an element-wise map over both (the scheduler
materialises the reductions and inlines the rest); a normalisation is a sum, a sum of
squared deviations from it, and a map. MatMul, Gemm and Conv are plain sum reductions
here; fast templates replace their schedules, not their definitions.

Convolution and pooling share one window geometry (``_window``): output sizes, padding
from ``pads`` or ``auto_pad``, and which spatial dimensions a window can leave. Reads in
such a dimension become ``select(inside, x[clamped], fill)``: the index is clamped, so
even the branch not taken stays inside the buffer. Each also has a channels-last twin
(``ChannelsLastConv``, ``ChannelsLastMaxPool``, ``ChannelsLastAveragePool``: N x spatial x C,
filters kernel x C/group x M), one definition with a ``Layout`` for both orders, and
grouped convolution with the group as an axis (``ChannelsLastGroupConv``); only graph
passes make them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from treadle.errors import DTypeError
from treadle.graph.operator import OpContext, register
from treadle.graph.ops.common import (broadcast_index, broadcast_load, broadcast_shape,
                                      normalize_axis, onnx_dtype, same_dtype)
from treadle.graph.ops.reduce import (accumulator, arg_reduce, count, project, reduce_axes,
                                      reduce_tensor)
from treadle.graph.tensor import Dim, normalize_dim
from treadle.ir import dtypes
from treadle.ir.compute import Compute, compute, identity_of, reduce
from treadle.ir.dtypes import DataType
from treadle.ir.expr import (Buffer, Const, Expr, as_expr, call, cast, ceil_div, eq,
                             logical_and, maximum, minimum, ne, select)
from treadle.ir.mapping import ravel, unravel


def _float_input(ctx: OpContext, i: int = 0) -> Buffer:
    x = ctx.input(i)
    if not x.dtype.is_float:
        raise ctx.error(f"input {i} must be a float tensor, got {x.dtype}", DTypeError)
    return x


def _rank_at_least(ctx: OpContext, x: Buffer, rank: int, what: str) -> None:
    if x.rank < rank:
        raise ctx.error(f"{what} must have rank {rank} or more, got shape "
                        f"{[str(d) for d in x.shape]}")


def _per_channel(ctx: OpContext, i: int, channels: Expr) -> Buffer:
    """Input ``i``, a vector with one value per channel."""
    b = ctx.input(i)
    if b.rank != 1:
        raise ctx.error(f"input {i} must have shape [{channels}], got "
                        f"{[str(d) for d in b.shape]}")
    _same_size(ctx, b.shape[0], channels, f"input {i} needs one value per channel")
    return b


def _broadcasts_to(ctx: OpContext, i: int, shape: Sequence[Dim]) -> Buffer:
    """Input ``i``, which must broadcast to ``shape`` without growing it (a symbolic
    dimension is checked at run time)."""
    b = ctx.input(i)
    if b.rank > len(shape):
        raise ctx.error(f"input {i} of shape {[str(d) for d in b.shape]} does not broadcast "
                        f"to {[str(d) for d in shape]}")
    for axis, (d, s) in enumerate(zip(b.shape[::-1], shape[::-1])):
        d, s = normalize_dim(d), normalize_dim(s)
        if d == 1 or d == s:
            continue
        if isinstance(d, int) and isinstance(s, int):
            raise ctx.error(f"input {i} of shape {[str(d) for d in b.shape]} does not "
                            f"broadcast to {[str(d) for d in shape]}")
        ctx.require(eq(as_expr(d), as_expr(s)) | eq(as_expr(d), 1),
                    f"input {i}'s dimension {d} must be 1 or {s} ({axis} from the last)")
    return b


def _c(value, dtype: DataType) -> Const:
    return Const(value, dtype)


# ---- softmax family -----------------------------------------------------------------------

def _softmax(ctx: OpContext, log: bool):
    x = _float_input(ctx)
    return [softmax(x, [normalize_axis(ctx, int(ctx.attr("axis", -1)), x.rank)], log)]


def softmax(x: Buffer, axes: list[int], log: bool) -> Compute:
    """The (log-)softmax of ``x`` over ``axes``, shifted by the maximum so exp never
    overflows. As ONNX defines it (a function of Exp, ReduceSum and Div), each step runs
    in x's dtype; only the sum of half-precision values accumulates in float32."""
    acc = accumulator(x.dtype)
    high = reduce_axes("max", x.shape, axes, True, lambda j: x[j], "max")

    def shifted(i):
        return x[i] - high[project(i, axes, True)]

    def sum_of(term) -> Callable:
        total = reduce_axes("sum", x.shape, axes, True, lambda j: cast(term(j), acc), "sum")
        return lambda i: cast(total[project(i, axes, True)], x.dtype)
    if log:
        total = sum_of(lambda j: call("exp", shifted(j)))
        return compute("logsoftmax", x.shape, lambda *i: shifted(i) - call("log", total(i)))
    # The sum and the output both read each exponential: one tensor of them, which the
    # rule-based schedule materialises (see rules._shared_costly) rather than inlining it
    # into both, so exp runs once per element.
    exps = compute("exp", x.shape, lambda *i: call("exp", shifted(i)))
    total = sum_of(lambda j: exps[j])
    return compute("softmax", x.shape, lambda *i: exps[i] / total(i))


register("Softmax")(lambda ctx: _softmax(ctx, log=False))
register("LogSoftmax")(lambda ctx: _softmax(ctx, log=True))


# ---- losses -------------------------------------------------------------------------------

def _class_loss(ctx: OpContext, log_prob, target: Buffer, weight: Buffer | None) -> Compute:
    """The negative log-likelihood of ``log_prob`` (N x C x d...) at the classes in
    ``target`` (N x d...), times the class weights, then reduced as ``reduction`` says:
    none, sum, or mean (divided by the sum of the weights taken). A target equal to
    ``ignore_index`` counts as neither loss nor weight."""
    if not target.dtype.is_integer:
        raise ctx.error(f"the target must hold integers, got {target.dtype}", DTypeError)
    dtype, classes = log_prob.dtype, log_prob.shape[1]
    work, ignore = accumulator(dtype), ctx.attr("ignore_index")
    reduction = ctx.attr("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise ctx.error(f"reduction must be none, sum or mean, got {reduction!r}")

    def clamped(i):  # an ignored target may lie outside the classes
        return minimum(maximum(cast(target[i], dtypes.index_type), 0), classes - 1)

    def weight_of(i):
        w = _c(1.0, work) if weight is None else cast(weight[clamped(i)], work)
        return w if ignore is None else select(eq(target[i], ignore), _c(0.0, work), w)

    def loss(*i):
        return -cast(log_prob[(i[0], clamped(i), *i[1:])], work) * weight_of(i)
    shape = [log_prob.shape[0], *log_prob.shape[2:]]
    if reduction == "none":
        return compute("loss", shape, loss, dtype)
    every = list(range(len(shape)))
    total = reduce_axes("loss_sum", shape, every, False, lambda j: loss(*j), "sum")
    if reduction == "sum":
        return compute("loss", [], lambda: total[()], dtype)
    weights = reduce_axes("weight_sum", shape, every, False, weight_of, "sum")
    return compute("loss", [], lambda: total[()] / weights[()], dtype)


@register("NegativeLogLikelihoodLoss")
def negative_log_likelihood_loss(ctx: OpContext):
    x = _float_input(ctx)
    _rank_at_least(ctx, x, 2, "input 0 (N x C x d...)")
    weight = _per_channel(ctx, 2, x.shape[1]) if ctx.has_input(2) else None
    return [_class_loss(ctx, x, ctx.input(1), weight)]


@register("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_loss(ctx: OpContext):
    """The NLL loss of the log-softmax over the classes (axis 1); output 1 is that."""
    x = _float_input(ctx)
    _rank_at_least(ctx, x, 2, "input 0 (N x C x d...)")
    weight = _per_channel(ctx, 2, x.shape[1]) if ctx.has_input(2) else None
    log_prob = softmax(x, [1], log=True)
    return [_class_loss(ctx, log_prob, ctx.input(1), weight), log_prob]


@register("Hardmax")
def hardmax(ctx: OpContext):
    x = ctx.input(0)
    axis = normalize_axis(ctx, int(ctx.attr("axis", -1)), x.rank)
    first = arg_reduce(x, axis, True, largest=True, last=False)
    return [compute("hardmax", x.shape, lambda *i: select(
        eq(i[axis], first[project(i, [axis], True)]), _c(1, x.dtype), _c(0, x.dtype)))]


@register("LpNormalization")
def lp_normalization(ctx: OpContext):
    x = _float_input(ctx)
    axes = [normalize_axis(ctx, int(ctx.attr("axis", -1)), x.rank)]
    p = int(ctx.attr("p", 2))
    if p not in (1, 2):
        raise ctx.error(f"p must be 1 or 2, got {p}")
    norm = reduce_tensor("ReduceL1" if p == 1 else "ReduceL2", x, axes, True)

    def element(*i):  # a zero norm (all of the axis zero) gives zeros, not NaN
        n = norm[project(i, axes, True)]
        return select(eq(n, _c(0, n.dtype)), _c(0, x.dtype), x[i] / n)
    return [compute("lpnorm", x.shape, element)]


# ---- normalisations -----------------------------------------------------------------------

def _mean_and_variance(x: Buffer, axes: Sequence[int], work: DataType, keepdims: bool = True
                       ) -> tuple[Compute, Compute]:
    """Mean and (population) variance over ``axes``, the variance from squared deviations
    so large means cost no precision."""
    n = cast(count(x.shape, axes), work)
    total = reduce_axes("sum", x.shape, axes, keepdims, lambda j: cast(x[j], work), "sum")
    mean = compute("mean", total.shape, lambda *i: total[i] / n)

    def deviation(j):
        d = cast(x[j], work) - mean[project(j, axes, keepdims)]
        return d * d
    squares = reduce_axes("squares", x.shape, axes, keepdims, deviation, "sum")
    return mean, compute("variance", squares.shape, lambda *i: squares[i] / n)


def _moments(x: Buffer, axes: Sequence[int], epsilon: float, work: DataType):
    """Mean and 1/sqrt(variance + epsilon) over ``axes`` (keepdims shapes)."""
    mean, variance = _mean_and_variance(x, axes, work)
    inv_std = compute("inv_std", variance.shape, lambda *i: _c(1.0, work) / call(
        "sqrt", variance[i] + _c(epsilon, work)))
    return mean, inv_std


@register("LayerNormalization")
def layer_normalization(ctx: OpContext):
    x = _float_input(ctx)
    scale = _broadcasts_to(ctx, 1, x.shape)
    bias = _broadcasts_to(ctx, 2, x.shape) if ctx.has_input(2) else None
    axis = normalize_axis(ctx, int(ctx.attr("axis", -1)), x.rank)
    axes = list(range(axis, x.rank))
    work = _stash_type(ctx)
    mean, inv_std = _moments(x, axes, float(ctx.attr("epsilon", 1e-5)), work)

    def element(*i):
        p = project(i, axes, True)
        y = (cast(x[i], work) - mean[p]) * inv_std[p] * cast(broadcast_load(scale, i, x.shape), work)
        return y + cast(broadcast_load(bias, i, x.shape), work) if bias is not None else y
    outputs = [compute("layernorm", x.shape, element, x.dtype)]
    # The optional outputs Mean and InvStdDev: stash type, reduced axes kept as 1.
    extras = [("mean", mean), ("inv_std_dev", inv_std)][:ctx.num_outputs - 1]
    return outputs + [compute(name, c.shape, lambda *i, c=c: c[i]) for name, c in extras]


@register("RMSNormalization")
def rms_normalization(ctx: OpContext):
    """x / sqrt(mean(x²) + epsilon) over the axes from ``axis`` on, in the stash type,
    rounded to x's type, times the scale (Llama's normalisation)."""
    x = _float_input(ctx)
    scale = _broadcasts_to(ctx, 1, x.shape)
    axes = list(range(normalize_axis(ctx, int(ctx.attr("axis", -1)), x.rank), x.rank))
    work = _stash_type(ctx)
    n, epsilon = cast(count(x.shape, axes), work), float(ctx.attr("epsilon", 1e-5))

    def square(j):
        v = cast(x[j], work)
        return v * v
    squares = reduce_axes("squares", x.shape, axes, True, square, "sum")
    inv_rms = compute("inv_rms", squares.shape, lambda *i: _c(1.0, work) / call(
        "sqrt", squares[i] / n + _c(epsilon, work)))

    def element(*i):
        normalized = cast(cast(x[i], work) * inv_rms[project(i, axes, True)], x.dtype)
        return cast(normalized, scale.dtype) * broadcast_load(scale, i, x.shape)
    return [compute("rmsnorm", x.shape, element)]


def _stash_type(ctx: OpContext) -> DataType:
    work = onnx_dtype(ctx, int(ctx.attr("stash_type", 1)))
    if not work.is_float:
        raise ctx.error(f"stash_type must be a float type, got {work}")
    return work


def _instance_normalization(ctx: OpContext, layout: Layout):
    x = _float_input(ctx)
    _rank_at_least(ctx, x, 3, "input 0")
    _, channels, _ = layout.split(x.shape)
    scale, bias = _per_channel(ctx, 1, channels), _per_channel(ctx, 2, channels)
    axes = list(range(1, x.rank - 1) if layout.channels_last else range(2, x.rank))
    work = accumulator(x.dtype)
    mean, inv_std = _moments(x, axes, float(ctx.attr("epsilon", 1e-5)), work)

    def element(*i):
        p, c = project(i, axes, True), layout.split(i)[1]
        y = (cast(x[i], work) - mean[p]) * inv_std[p]
        return y * cast(scale[c], work) + cast(bias[c], work)
    return [compute("instancenorm", x.shape, element, x.dtype)]


register("InstanceNormalization")(lambda ctx: _instance_normalization(ctx, NCHW))
# Channels-last (``passes.channels_last``): N x spatial x C, moments over the spatial axes,
# which the rule-based schedule sums a whole row of channels at a time.
register("ChannelsLastInstanceNormalization", internal=True)(
    lambda ctx: _instance_normalization(ctx, NHWC))


def _group_normalization(ctx: OpContext, layout: Layout):
    """ONNX GroupNormalization: the channels in ``num_groups`` groups, each normalised over
    its channels and pixels per sample, then scaled and shifted per channel (opset 21;
    ONNX deprecated opset 18's version, per group). The moments sum each
    channel's pixels first (rows NCHW, columns channels-last) and then the group's
    channels, so neither layout reads a group's channels strided."""
    x = _float_input(ctx)
    _rank_at_least(ctx, x, 3, "input 0")
    groups = int(ctx.required_attr("num_groups"))
    batch, channels, sizes = layout.split(x.shape)
    channels = normalize_dim(channels)
    if not isinstance(channels, int) or groups < 1 or channels % groups:
        raise ctx.error(f"num_groups {groups} must divide the {channels} channels")
    per = channels // groups
    scale, bias = (_per_channel(ctx, k, as_expr(channels)) for k in (1, 2))
    work = accumulator(x.dtype) if ctx.attr("stash_type", 1) == 1 else x.dtype
    n_points = cast(as_expr(per) * count(list(sizes), range(len(sizes))), work)
    epsilon = _c(float(ctx.attr("epsilon", 1e-5)), work)

    def by_channel(name, value):
        return reduce(name, [batch, channels], list(sizes),
                      lambda n, c, *sp: value(n, c, cast(x[layout.join(n, c, sp)], work)))

    def by_group(name, sums, finish):
        total = reduce(name, [batch, groups], [per], lambda n, g, c: sums[n, g * per + c])
        return compute(f"{name}_of_group", [batch, groups], lambda n, g: finish(total[n, g]))
    mean = by_group("mean", by_channel("sum", lambda n, c, v: v), lambda t: t / n_points)
    squares = by_channel("squares", lambda n, c, v: (v - mean[n, c // per]) *
                         (v - mean[n, c // per]))
    inv_std = by_group("inv_std", squares, lambda t: _c(1.0, work) / call(
        "sqrt", t / n_points + epsilon))

    def element(*i):
        n, c, _ = layout.split(i)
        y = (cast(x[i], work) - mean[n, c // per]) * inv_std[n, c // per]
        return y * cast(scale[c], work) + cast(bias[c], work)
    return [compute("groupnorm", x.shape, element, x.dtype)]


register("GroupNormalization")(lambda ctx: _group_normalization(ctx, NCHW))
register("ChannelsLastGroupNormalization", internal=True)(
    lambda ctx: _group_normalization(ctx, NHWC))


@register("BatchNormalization")
def batch_normalization(ctx: OpContext):
    """(x - mean) / sqrt(var + epsilon) * scale + bias per channel (axis 1). In inference
    mean and var are inputs 3 and 4; with ``training_mode`` they are the batch's own,
    over every axis but the channels, and the optional outputs 1 and 2 are the running
    statistics: input * momentum + batch's * (1 - momentum)."""
    x = _float_input(ctx)
    _rank_at_least(ctx, x, 2, "input 0")
    scale, bias, mean, var = (_per_channel(ctx, k, x.shape[1]) for k in range(1, 5))
    epsilon, work = float(ctx.attr("epsilon", 1e-5)), accumulator(x.dtype)
    training = bool(ctx.attr("training_mode", 0))
    if ctx.num_outputs > 1 and not training:
        raise ctx.unsupported("running mean and variance outputs exist only in training mode")
    if training:
        axes = [0, *range(2, x.rank)]
        used_mean, used_var = _mean_and_variance(x, axes, work, keepdims=False)
    else:
        used_mean, used_var = mean, var

    def element(*i):
        def param(b):
            return cast(b[i[1]], work)
        factor = param(scale) / call("sqrt", param(used_var) + _c(epsilon, work))
        return (cast(x[i], work) - param(used_mean)) * factor + param(bias)
    y = compute("batchnorm", x.shape, element, x.dtype)
    if ctx.num_outputs == 1:
        return [y]
    momentum = float(ctx.attr("momentum", 0.9))

    def running(name: str, given: Buffer, batch: Compute) -> Compute:
        acc = accumulator(given.dtype)
        return compute(name, given.shape, lambda c: cast(
            cast(given[c], acc) * _c(momentum, acc) + cast(batch[c], acc) *
            _c(1.0 - momentum, acc), given.dtype))
    return [y, running("running_mean", mean, used_mean), running("running_var", var, used_var)]


@register("Dropout")
def dropout(ctx: OpContext):
    """Inference: the identity, and an all-true mask when one is asked for."""
    if ctx.has_input(2):
        training = ctx.data(2)
        if training is None or training.any():
            raise ctx.unsupported("training_mode must be a constant false (only inference "
                                  "is supported)")
    x = ctx.input(0)
    outputs = [compute("dropout", x.shape, lambda *i: x[i])]
    if ctx.num_outputs > 1:
        outputs.append(compute("mask", x.shape, lambda *i: Const(True, dtypes.boolean)))
    return outputs


@register("LRN")
def lrn(ctx: OpContext):
    """x / (bias + alpha / size * sum of x² over the ``size`` nearest channels)^beta."""
    x = _float_input(ctx)
    _rank_at_least(ctx, x, 2, "input 0")
    size = int(ctx.required_attr("size"))
    if size < 1:
        raise ctx.error(f"size must be positive, got {size}")
    alpha, beta = float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75))
    bias, work, channels = float(ctx.attr("bias", 1.0)), accumulator(x.dtype), x.shape[1]

    def square(n, c, *rest):
        *spatial, r = rest
        ch = c - (size - 1) // 2 + r
        inside = logical_and(ch >= 0, ch < channels)
        v = cast(x[(n, minimum(maximum(ch, 0), channels - 1), *spatial)], work)
        return select(inside, v * v, _c(0.0, work))
    squares = reduce("lrn_squares", x.shape, [size], square)
    return [compute("lrn", x.shape, lambda *i: cast(x[i], work) / call(
        "pow", _c(bias, work) + _c(alpha / size, work) * squares[i], _c(beta, work)), x.dtype)]


# ---- matrix products ----------------------------------------------------------------------

def _same_size(ctx: OpContext, a: Expr, b: Expr, what: str) -> Expr:
    """Two sizes that must agree: an error when both are known, else a run-time check."""
    a, b = normalize_dim(a), normalize_dim(b)
    if isinstance(a, int) and isinstance(b, int):
        if a != b:
            raise ctx.error(f"{what}: {a} != {b}")
        return as_expr(a)
    if a != b:
        ctx.require(eq(as_expr(a), as_expr(b)), f"{what} ({a} vs {b})")
    return as_expr(a if isinstance(a, int) else b)


def _finish(ctx: OpContext, product: Compute, dtype: DataType, epilogue=None) -> Compute:
    """The accumulated product as the output: itself, or a map rounding it (and adding
    ``epilogue(index, value)``) to ``dtype``."""
    if epilogue is None and product.dtype == dtype:
        return product
    step = epilogue or (lambda i, v: v)
    return compute(ctx.op_type.lower(), product.shape, lambda *i: step(i, product[i]), dtype)


@register("MatMul")
def matmul(ctx: OpContext):
    """numpy.matmul: a 1-D operand is a row (left) or column (right) vector that the
    result drops; leading dimensions broadcast."""
    a, b = ctx.input(0), ctx.input(1)
    dtype = same_dtype(ctx, a, b)
    acc = accumulator(dtype)
    product = matmul_product(ctx, a, b, lambda x, index: cast(x[index], acc))
    return [_finish(ctx, product, dtype)]


# A factor's value at an index of its operand (a widening cast, a zero point subtracted).
Factor = Callable[[Buffer, tuple], Expr]


def matmul_product(ctx: OpContext, a: Buffer, b: Buffer, factor: Factor) -> Compute:
    """numpy.matmul's sum over K of factor(a, index) * factor(b, index)."""
    if a.rank == 0 or b.rank == 0:
        raise ctx.error("operands must have rank 1 or more")
    k = _same_size(ctx, a.shape[-1], b.shape[0] if b.rank == 1 else b.shape[-2],
                   "inner dimensions differ")
    batch = broadcast_shape(ctx, a.shape[:-2], b.shape[:-2])
    rows, cols = a.rank > 1, b.rank > 1
    shape = [*batch, *([a.shape[-2]] if rows else []), *([b.shape[-1]] if cols else [])]
    nb = len(batch)

    def element(*idx):
        out, r = idx[:-1], idx[-1]
        left = (*broadcast_index(a.shape[:-2], out[:nb], batch), out[nb], r) if rows else (r,)
        right = (*broadcast_index(b.shape[:-2], out[:nb], batch), r, out[-1]) if cols else (r,)
        return factor(a, left) * factor(b, right)
    return reduce("matmul", shape, [k], element)


@register("Gemm")
def gemm(ctx: OpContext):
    """alpha * A' B' + beta * C, with A' and B' optionally transposed and C broadcast."""
    a, b = ctx.input(0), ctx.input(1)
    dtype = same_dtype(ctx, a, b)
    if a.rank != 2 or b.rank != 2:
        raise ctx.error(f"A and B must be matrices, got ranks {a.rank} and {b.rank}")
    trans_a, trans_b = bool(ctx.attr("transA", 0)), bool(ctx.attr("transB", 0))
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    m, ka = a.shape[::-1] if trans_a else a.shape
    kb, n = b.shape[::-1] if trans_b else b.shape
    k = _same_size(ctx, ka, kb, "inner dimensions differ")
    acc = accumulator(dtype)

    def element(i, j, r):
        left = a[r, i] if trans_a else a[i, r]
        right = b[j, r] if trans_b else b[r, j]
        return cast(left, acc) * cast(right, acc)
    product = reduce("gemm", [m, n], [k], element)
    c = _broadcasts_to(ctx, 2, [m, n]) if ctx.has_input(2) else None
    if c is None and alpha == 1:
        return [_finish(ctx, product, dtype)]

    def epilogue(i, v):
        v = v if alpha == 1 else v * _c(alpha, acc)
        return v if c is None else v + _c(beta, acc) * cast(broadcast_load(c, i, [m, n]), acc)
    return [_finish(ctx, product, dtype, epilogue)]


# ---- windows: convolution and pooling -----------------------------------------------------

@dataclass(frozen=True)
class Window:
    """Where each window of a convolution or pooling lies along the spatial dimensions:
    output position o reads input positions o * stride - begin + k * dilation."""
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[Dim, ...]     # padding before the input
    end: tuple[Dim, ...]       # padding after it
    out: tuple[Dim, ...]
    sizes: tuple[Expr, ...]    # the input's spatial sizes
    leaves: tuple[bool, ...]   # whether some window reaches outside the input

    def positions(self, out: Sequence[Expr], taps: Sequence[Expr]) -> list[Expr]:
        return [o * s - b + k * d for o, k, s, b, d in
                zip(out, taps, self.strides, self.begin, self.dilations)]

    def inside(self, positions: Sequence[Expr]) -> Expr | None:
        """Whether every position lies in the input; None when that always holds."""
        conds = []
        for p, n, leaves in zip(positions, self.sizes, self.leaves):
            if leaves:
                conds += [p >= 0, p < n]
        return logical_and(*conds) if conds else None

    def load(self, x: Buffer, layout: "Layout", batch: Expr, channel: Expr,
             positions: Sequence[Expr], fill: Expr):
        """x at (batch, channel, positions), or ``fill`` where a position is outside the
        input."""
        index = [minimum(maximum(p, 0), n - 1) if leaves else p
                 for p, n, leaves in zip(positions, self.sizes, self.leaves)]
        value = x[layout.join(batch, channel, index)]
        inside = self.inside(positions)
        return value if inside is None else select(inside, value, fill)


def _ints(ctx: OpContext, key: str, count_: int, default: int, low: int = 1) -> tuple[int, ...]:
    values = ctx.attr(key)
    values = [default] * count_ if values is None else [int(v) for v in values]
    if len(values) != count_ or any(v < low for v in values):
        raise ctx.error(f"{key} must be {count_} integers of at least {low}, got {values}")
    return tuple(values)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _auto_pad(ctx: OpContext) -> str:
    auto_pad = _text(ctx.attr("auto_pad", "NOTSET"))
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise ctx.error(f"auto_pad {auto_pad!r} is not one of NOTSET, SAME_UPPER, "
                        "SAME_LOWER, VALID")
    return auto_pad


def _dim_max0(value) -> Dim:
    value = normalize_dim(value)
    return max(value, 0) if isinstance(value, int) else normalize_dim(maximum(value, 0))


def _window(ctx: OpContext, sizes: Sequence[Expr], kernel: Sequence[int],
            ceil_mode: bool = False) -> Window:
    n = len(sizes)
    strides = _ints(ctx, "strides", n, 1)
    dilations = _ints(ctx, "dilations", n, 1)
    pads = _ints(ctx, "pads", 2 * n, 0, low=0)
    auto_pad = _auto_pad(ctx)
    sizes = [normalize_dim(d) for d in sizes]
    begin, end, out, leaves = [], [], [], []
    for d, (size, k, s, dil) in enumerate(zip(sizes, kernel, strides, dilations)):
        span = dil * (k - 1) + 1
        if auto_pad.startswith("SAME"):
            b, e, o = _same_padding(size, span, s, auto_pad == "SAME_UPPER")
        else:
            b, e = (pads[d], pads[d + n]) if auto_pad == "NOTSET" else (0, 0)
            o = _output_size(ctx, d, size, span, s, b, e, ceil_mode)
        last = normalize_dim((o - 1) * s - b + span - 1)  # the last position read
        if all(isinstance(v, int) for v in (b, last, size)):
            leaves.append(b > 0 or last >= size)
        else:  # without padding, the output size keeps windows inside unless ceil_mode
            leaves.append(not (b == 0 and e == 0 and not ceil_mode))
        begin.append(b)
        end.append(e)
        out.append(o)
    return Window(tuple(kernel), strides, dilations, tuple(begin), tuple(end), tuple(out),
                  tuple(as_expr(s) for s in sizes), tuple(leaves))


def _same_padding(size: Dim, span: int, stride: int, upper: bool) -> tuple[Dim, Dim, Dim]:
    """(begin, end, output size) for SAME_UPPER / SAME_LOWER: ceil(size / stride) outputs,
    the odd padding element at the end (upper) or the beginning (lower)."""
    out = normalize_dim(ceil_div(size, stride))
    total = _dim_max0((out - 1) * stride + span - size)
    begin = normalize_dim(total // 2 if upper else (total + 1) // 2)
    return begin, normalize_dim(total - begin), out


def _output_size(ctx: OpContext, d: int, size: Dim, span: int, stride: int, begin: int,
                 end: int, ceil_mode: bool) -> Dim:
    room = normalize_dim(size + begin + end - span)
    if isinstance(room, int) and room < 0:
        raise ctx.error(f"the window ({span} wide) is larger than the padded input "
                        f"({size + begin + end}) along spatial axis {d}")
    if not ceil_mode:
        return normalize_dim(room // stride + 1)
    return _drop_window_in_padding(ctx, normalize_dim(ceil_div(room, stride) + 1), stride,
                                   size, begin)


def _drop_window_in_padding(ctx: OpContext, out: Dim, stride: int, size: Dim, begin: int) -> Dim:
    """With ceil_mode a last window that would start in the end padding is dropped."""
    start = normalize_dim((out - 1) * stride)
    limit = normalize_dim(size + begin)
    if isinstance(start, int) and isinstance(limit, int):
        return out - 1 if start >= limit else out
    raise ctx.unsupported("ceil_mode with a symbolic spatial size")


@dataclass(frozen=True)
class Layout:
    """Where the channel axis of a batch x channel x spatial tensor lies: second (ONNX's
    NCHW) or last (NHWC, the channels-last operators that ``passes.channels_last``
    introduces so that a convolution's channels are contiguous)."""
    channels_last: bool

    def split(self, dims: Sequence) -> tuple:
        """(batch, channel, spatial) of a shape or an index."""
        if self.channels_last:
            return dims[0], dims[-1], tuple(dims[1:-1])
        return dims[0], dims[1], tuple(dims[2:])

    def join(self, batch, channel, spatial: Sequence) -> tuple:
        if self.channels_last:
            return (batch, *spatial, channel)
        return (batch, channel, *spatial)


NCHW, NHWC = Layout(False), Layout(True)


def _spatial_input(ctx: OpContext, float_only: bool = True) -> Buffer:
    x = _float_input(ctx) if float_only else ctx.input(0)
    _rank_at_least(ctx, x, 3, "input 0 (N x C x spatial...)")
    return x


def _weight_shape(ctx: OpContext, x: Buffer, w: Buffer) -> list[int]:
    """A convolution's weight shape, which must be static and of the input's rank."""
    if w.rank != x.rank:
        raise ctx.error(f"weight rank {w.rank} differs from input rank {x.rank}")
    fixed = [normalize_dim(d) for d in w.shape]
    if not all(isinstance(d, int) for d in fixed):
        raise ctx.unsupported(f"weight shape {[str(d) for d in w.shape]} must be static")
    return fixed


def _kernel_and_group(ctx: OpContext, kernel: Sequence[int], channels: int, what: str
                      ) -> tuple[tuple[int, ...], int]:
    """The weight's spatial shape, which ``kernel_shape`` must repeat where given, and the
    group count, which must divide the ``channels`` ``what``."""
    kernel = tuple(kernel)
    if ctx.attr("kernel_shape") is not None \
            and _ints(ctx, "kernel_shape", len(kernel), 1) != kernel:
        raise ctx.error(f"kernel_shape {list(ctx.attr('kernel_shape'))} differs from the "
                        f"weight's spatial shape {list(kernel)}")
    group = int(ctx.attr("group", 1))
    if group < 1 or channels % group:
        raise ctx.error(f"group {group} must be positive and divide the {channels} {what}")
    return kernel, group


def _conv(ctx: OpContext, layout: Layout):
    """ONNX Conv; channels-last, the input is N x spatial x C and the weight
    kernel x C/group x M (reduction axes kernel-major, so an implicit GEMM's packing
    reads contiguous channels)."""
    x, w = _spatial_input(ctx), ctx.input(1)
    dtype = same_dtype(ctx, x, w)
    acc = accumulator(dtype)
    product = conv_product(ctx, layout, x, w, lambda v: cast(v, acc),
                           lambda v, oc: cast(v, acc), _c(0, dtype))
    if not ctx.has_input(2):
        return [_finish(ctx, product, dtype)]
    m = layout.split(product.shape)[1]
    bias = _per_channel(ctx, 2, as_expr(m))
    return [_finish(ctx, product, dtype, lambda i, v: v + cast(bias[layout.split(i)[1]], acc))]


def conv_product(ctx: OpContext, layout: Layout, x: Buffer, w: Buffer,
                 x_factor: Callable[[Expr], Expr], w_factor: Callable[[Expr, Expr], Expr],
                 fill: Expr) -> Compute:
    """The sum over each window of x_factor(input) * w_factor(weight, output channel),
    an input outside the image read as ``fill``."""
    nsp = x.rank - 2
    fixed = _weight_shape(ctx, x, w)
    if layout.channels_last:
        *kernel, group_channels, m = fixed
    else:
        m, group_channels, *kernel = fixed
    kernel, group = _kernel_and_group(ctx, kernel, m, "output channels")
    batch, channels, sizes = layout.split(x.shape)
    _same_size(ctx, channels, group_channels * group,
               f"input channels must be group ({group}) x weight channels ({group_channels})")
    win, per_group = _window(ctx, sizes, kernel), m // group

    def element(*idx):
        n, oc, out = layout.split(idx[:nsp + 2])
        window = idx[nsp + 2:]
        taps, c = (window[:-1], window[-1]) if layout.channels_last else (window[1:], window[0])
        channel = c if group == 1 else oc // per_group * group_channels + c
        value = win.load(x, layout, n, channel, win.positions(out, taps), fill)
        weight = w[(*taps, c, oc)] if layout.channels_last else w[(oc, c, *taps)]
        return x_factor(value) * w_factor(weight, oc)
    taps = [*kernel, group_channels] if layout.channels_last else [group_channels, *kernel]
    return reduce("conv", layout.join(batch, m, win.out), taps, element)


@dataclass(frozen=True)
class TransposedWindow:
    """Where ConvTranspose puts each input pixel: input position i with tap k lands on
    output position ``i * stride - begin + k * dilation``. ``begin`` is negative where
    ``output_shape`` asks for more outputs than the pads give."""
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[Dim, ...]
    out: tuple[Dim, ...]


def transposed_window(ctx: OpContext, sizes: Sequence[Dim], kernel: tuple[int, ...]
                      ) -> TransposedWindow:
    """ConvTranspose's geometry, as ONNX's reference computes it: explicit pads, or the
    padding that ``output_shape`` (or ``auto_pad`` SAME, ``stride`` times the input)
    implies, its odd element at the end for SAME_UPPER and at the beginning otherwise."""
    n = len(sizes)
    strides = _ints(ctx, "strides", n, 1)
    dilations = _ints(ctx, "dilations", n, 1)
    extra = _ints(ctx, "output_padding", n, 0, low=0)
    if any(e >= max(s, d) for e, s, d in zip(extra, strides, dilations)):
        raise ctx.error(f"output_padding {list(extra)} must be less than the stride or "
                        "the dilation along each axis")
    auto_pad = _auto_pad(ctx)
    sizes = [normalize_dim(d) for d in sizes]
    full = [normalize_dim(s * (i - 1) + e + (k - 1) * d + 1)
            for i, k, s, d, e in zip(sizes, kernel, strides, dilations, extra)]
    shape = ctx.attr("output_shape")
    if shape is not None or auto_pad.startswith("SAME"):
        wanted = (_ints(ctx, "output_shape", n, 1) if shape is not None
                  else [normalize_dim(i * s) for i, s in zip(sizes, strides)])
        totals = [normalize_dim(f - w) for f, w in zip(full, wanted)]
        if not all(isinstance(t, int) for t in totals):
            raise ctx.unsupported("output_shape or auto_pad SAME with a symbolic spatial size")
        begin = tuple(t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in totals)
        return TransposedWindow(kernel, strides, dilations, begin, tuple(wanted))
    pads = _ints(ctx, "pads", 2 * n, 0, low=0) if auto_pad == "NOTSET" else (0,) * (2 * n)
    out = tuple(normalize_dim(f - pads[d] - pads[d + n]) for d, f in enumerate(full))
    if any(isinstance(o, int) and o < 1 for o in out):
        raise ctx.error(f"the pads {list(pads)} leave no output (before padding: "
                        f"{[str(f) for f in full]})")
    return TransposedWindow(kernel, strides, dilations, pads[:n], out)


@register("ConvTranspose")
def _conv_transpose(ctx: OpContext):
    """ONNX ConvTranspose: every input pixel adds its channels times the kernel's taps
    into the output. Here each output element gathers the taps that land on it (an input
    position ``(o + begin - k * dilation) / stride`` that divides and lies inside);
    ``passes.conv_transpose`` turns one with constant weights into a Conv, and this
    definition runs the others."""
    x, w = _spatial_input(ctx), ctx.input(1)
    dtype = same_dtype(ctx, x, w)
    nsp = x.rank - 2
    channels, per_group, *kernel = _weight_shape(ctx, x, w)
    kernel, group = _kernel_and_group(ctx, kernel, channels, "input channels")
    batch, x_channels, sizes = NCHW.split(x.shape)
    _same_size(ctx, x_channels, channels, "input channels must match the weight's first axis")
    win = transposed_window(ctx, sizes, kernel)
    acc, group_channels = accumulator(dtype), channels // group

    def element(n, oc, *rest):
        out, (c, *taps) = rest[:nsp], rest[nsp:]
        conds, index = [], []
        for o, k, s, b, d, size in zip(out, taps, win.strides, win.begin, win.dilations,
                                       sizes):
            p = o + b - k * d
            conds += [p >= 0, p < size * s] + ([eq(p % s, 0)] if s > 1 else [])
            index.append(minimum(maximum(p, 0) // s, as_expr(size) - 1))
        channel = oc // per_group * group_channels + c
        weight = w[(channel, oc % per_group, *taps)]
        value = cast(x[(n, channel, *index)], acc) * cast(weight, acc)
        return select(logical_and(*conds), value, _c(0, acc))
    product = reduce("conv_transpose", (batch, per_group * group, *win.out),
                     [group_channels, *kernel], element)
    if not ctx.has_input(2):
        return [_finish(ctx, product, dtype)]
    bias = _per_channel(ctx, 2, as_expr(per_group * group))
    return [_finish(ctx, product, dtype, lambda i, v: v + cast(bias[i[1]], acc))]


@register("ChannelsLastGroupConv", internal=True)
def channels_last_group_conv(ctx: OpContext):
    """A grouped convolution channels-last with the group an axis of its own: input
    N x spatial x C, weight G x kernel x C/G x M/G, output N x spatial x G x M/G. Its
    definition is a batch over groups of matrix products (pixels by each group's
    filters), which the GEMM template runs with the group as a parallel axis, where
    ``Conv``'s single channel axis, read by both factors, would be no matrix product."""
    x, w = _spatial_input(ctx), ctx.input(1)
    dtype = same_dtype(ctx, x, w)
    nsp = x.rank - 2
    fixed = [normalize_dim(d) for d in w.shape]
    if w.rank != nsp + 3 or not all(isinstance(d, int) for d in fixed):
        raise ctx.error(f"weight shape {[str(d) for d in w.shape]} must be static "
                        f"G x kernel x C/G x M/G")
    group, *kernel, group_channels, per_group = fixed
    batch, channels, sizes = NHWC.split(x.shape)
    _same_size(ctx, channels, group_channels * group,
               f"input channels must be {group} groups x {group_channels} weight channels")
    win = _window(ctx, sizes, tuple(kernel))
    acc = accumulator(dtype)

    def element(n, *idx):
        out, (g, oc), (*taps, c) = idx[:nsp], idx[nsp:nsp + 2], idx[nsp + 2:]
        value = win.load(x, NHWC, n, g * group_channels + c, win.positions(out, taps),
                         _c(0, dtype))
        return cast(value, acc) * cast(w[(g, *taps, c, oc)], acc)
    product = reduce("conv", [batch, *win.out, group, per_group], [*kernel, group_channels],
                     element)
    if not ctx.has_input(2):
        return [_finish(ctx, product, dtype)]
    bias = _per_channel(ctx, 2, as_expr(group * per_group))
    return [_finish(ctx, product, dtype,
                    lambda i, v: v + cast(bias[i[-2] * per_group + i[-1]], acc))]


def _pool_window(ctx: OpContext, x: Buffer, layout: Layout) -> Window:
    ctx.required_attr("kernel_shape")
    return _window(ctx, layout.split(x.shape)[2], _ints(ctx, "kernel_shape", x.rank - 2, 1),
                   bool(ctx.attr("ceil_mode", 0)))


def _max_pool(ctx: OpContext, layout: Layout):
    x = _spatial_input(ctx, float_only=False)  # MaxPool also takes 8-bit integers
    if x.dtype.is_bool:
        raise ctx.error(f"input 0 must be numeric, got {x.dtype}", DTypeError)
    win, nsp = _pool_window(ctx, x, layout), x.rank - 2
    lowest = identity_of("max", x.dtype)

    def element(*idx):
        n, c, out = layout.split(idx[:nsp + 2])
        return win.load(x, layout, n, c, win.positions(out, idx[nsp + 2:]), lowest)
    batch, channels, _ = layout.split(x.shape)
    y = reduce("maxpool", layout.join(batch, channels, win.out), win.kernel, element, "max")
    if ctx.num_outputs == 1:
        return [y]
    if layout.channels_last:
        raise ctx.unsupported("the Indices output of a channels-last MaxPool")
    return [y, _max_pool_indices(ctx, x, win, y)]


def _max_pool_indices(ctx: OpContext, x: Buffer, win: Window, y: Compute) -> Compute:
    """MaxPool's Indices: where in x each window's maximum lies, as one int64 over all of
    x's axes, the spatial ones counted row-major or, with ``storage_order`` 1,
    column-major. Of equal maxima the first in the window (row-major) counts, as in ONNX
    Runtime; a NaN counts as the maximum, as it makes one. Two reductions: the maximum
    (the output), then the first tap holding it."""
    storage = int(ctx.attr("storage_order", 0))
    if storage not in (0, 1):
        raise ctx.error(f"storage_order must be 0 or 1, got {storage}")
    nsp, taps = x.rank - 2, count(win.kernel, range(len(win.kernel)))

    def holds(n, c, *idx):
        out, tap = idx[:nsp], idx[nsp:]
        positions = win.positions(out, tap)
        value = win.load(x, NCHW, n, c, positions, identity_of("max", x.dtype))
        found = eq(value, y[(n, c, *out)])
        if x.dtype.is_float:
            found = found | ne(value, value)
        inside = win.inside(positions)
        found = found if inside is None else logical_and(inside, found)
        return select(found, ravel(tap, win.kernel), taps)
    first = reduce("maxpool_first", y.shape, win.kernel, holds, "min")

    def index(n, c, *out):
        tap = unravel(minimum(first[(n, c, *out)], taps - 1), win.kernel)
        positions = [minimum(maximum(p, 0), size - 1)
                     for p, size in zip(win.positions(out, tap), win.sizes)]
        spatial = (ravel(positions, win.sizes) if storage == 0
                   else ravel(positions[::-1], win.sizes[::-1]))
        return cast(ravel([n, c, spatial], [x.shape[0], x.shape[1], count(win.sizes, range(nsp))]),
                    dtypes.int64)
    return compute("maxpool_indices", y.shape, index)


def _average_pool(ctx: OpContext, layout: Layout):
    """The window sum over the number of positions counted: those inside the input, or
    with count_include_pad those inside the padded input. The count is a product of one
    count per dimension, since the condition holds per dimension, each a closed form of
    the output position (``_window_count``): the sum is then the operator's one
    reduction, which the window template takes with the division as its epilogue."""
    x = _spatial_input(ctx)
    win, nsp = _pool_window(ctx, x, layout), x.rank - 2
    work = accumulator(x.dtype)
    padded = bool(ctx.attr("count_include_pad", 0))

    def element(*idx):
        n, c, out = layout.split(idx[:nsp + 2])
        value = win.load(x, layout, n, c, win.positions(out, idx[nsp + 2:]), _c(0, x.dtype))
        return cast(value, work)
    batch, channels, _ = layout.split(x.shape)
    total = reduce("avgpool_sum", layout.join(batch, channels, win.out), win.kernel, element)
    counts = [_window_count(win, d, padded, work) for d in range(nsp)]

    def average(*i):
        divisor = _c(1.0, work)
        out = layout.split(i)[2]
        for d, cnt in enumerate(counts):
            divisor = divisor * (_c(float(win.kernel[d]), work) if cnt is None else cnt(out[d]))
        return total[i] / divisor
    return [compute("avgpool", total.shape, average, x.dtype)]


for _layout, _prefix in ((NCHW, ""), (NHWC, "ChannelsLast")):
    _internal = _layout.channels_last
    register(f"{_prefix}Conv", internal=_internal)(lambda ctx, layout=_layout: _conv(ctx, layout))
    register(f"{_prefix}MaxPool", internal=_internal)(
        lambda ctx, layout=_layout: _max_pool(ctx, layout))
    register(f"{_prefix}AveragePool", internal=_internal)(
        lambda ctx, layout=_layout: _average_pool(ctx, layout))


def _lp_maps(ctx: OpContext, work: DataType) -> tuple[Callable[[Expr], Expr],
                                                      Callable[[Expr], Expr]]:
    """For LpPool's ``p``: the map of each element (|x| ** p) and of the window's sum
    (its p-th root); p = 1 and 2 without pow, which is slower and no more exact."""
    p = int(ctx.attr("p", 2))
    if p < 1:
        raise ctx.error(f"p must be a positive integer, got {p}")
    if p == 1:
        return (lambda v: call("abs", v)), (lambda total: total)
    if p == 2:
        return (lambda v: v * v), (lambda total: call("sqrt", total))
    return ((lambda v: call("pow", call("abs", v), _c(float(p), work))),
            (lambda total: call("pow", total, _c(1.0 / p, work))))


@register("LpPool")
def lp_pool(ctx: OpContext):
    """The p-norm of each window; padding adds nothing to it."""
    x = _spatial_input(ctx)
    win, nsp = _pool_window(ctx, x, NCHW), x.rank - 2
    work = accumulator(x.dtype)
    power, root = _lp_maps(ctx, work)

    def element(n, c, *idx):
        value = win.load(x, NCHW, n, c, win.positions(idx[:nsp], idx[nsp:]), _c(0, x.dtype))
        return power(cast(value, work))
    total = reduce("lppool_sum", [*x.shape[:2], *win.out], win.kernel, element)
    return [compute("lppool", total.shape, lambda *i: root(total[i]), x.dtype)]


@register("GlobalLpPool")
def global_lp_pool(ctx: OpContext):
    x = _spatial_input(ctx)
    work = accumulator(x.dtype)
    power, root = _lp_maps(ctx, work)
    total = reduce_axes("lppool_sum", x.shape, list(range(2, x.rank)), True,
                        lambda j: power(cast(x[j], work)), "sum")
    return [compute("globallppool", total.shape, lambda *i: root(total[i]), x.dtype)]


def _window_count(win: Window, d: int, padded: bool, work: DataType
                  ) -> Callable[[Expr], Expr] | None:
    """How many taps are counted at an output position along spatial dimension d; None
    where every window lies inside the counted range (the input, or with ``padded`` the
    padded input), so that the count is the kernel size. The taps k counted from the
    window's first position p, those with low <= p + k * dilation < high, run from
    ceil((low - p) / dilation) to floor((high - 1 - p) / dilation), clipped to the
    kernel; both numerators are clamped at zero, where C's truncating division floors."""
    low, high = (-win.begin[d], win.sizes[d] + win.end[d]) if padded else (0, win.sizes[d])
    span = win.dilations[d] * (win.kernel[d] - 1)
    last = normalize_dim((as_expr(win.out[d]) - 1) * win.strides[d] - win.begin[d] + span)
    end = normalize_dim(high)
    if not win.leaves[d] or (padded and isinstance(last, int) and isinstance(end, int)
                             and last < end):
        return None
    dilation, kernel = win.dilations[d], win.kernel[d]

    def counted(o: Expr) -> Expr:
        first_position = o * win.strides[d] - win.begin[d]
        first = ceil_div(maximum(low - first_position, 0), dilation)
        stop = minimum(maximum(high - first_position - 1 + dilation, 0) // dilation, kernel)
        return cast(maximum(stop - first, 0), work)
    return counted


def _global_pool(op: str):
    def define(ctx: OpContext):
        x = _spatial_input(ctx)
        return [reduce_tensor(op, x, list(range(2, x.rank)), True)]
    return define


register("GlobalAveragePool")(_global_pool("ReduceMean"))
register("GlobalMaxPool")(_global_pool("ReduceMax"))
