"""Random valid ONNX graphs for differential testing against ONNX Runtime.

``cases()`` is a hypothesis strategy of ``Case``s: a model of 3 to 15 nodes (a few ops
emit a helper node or two, so a model may end slightly past 15) and feeds for its inputs.
Each op family is one function in ``OPS`` that reads operands from the tensors built so
far (often the latest, so chains form, else any, so graphs branch and a tensor has several
readers) or makes new graph inputs and initializers, and returns False when nothing it
needs exists. Tensors no node reads become outputs, and a few that are read.

The generator tracks every tensor's run-time shape, a bound on the magnitude of its
finite elements and whether it may hold NaN or inf. That is how it builds only what ONNX
defines and float32 computes well: no overflow, no division by numbers near zero, no cast
of NaN to an integer, windows that fit their inputs, axes that exist, empty tensors only
where no op reduces over an empty axis. Input dimensions may be symbolic (``dim_param``),
of any run-time size, 1 (which broadcasts) and rarely 0 included; one symbol names one
size, as treadle requires.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 10
OPSETS = (18, 19, 20, 21)  # axes as inputs from 18 on; Gelu from 20
MAX_MAG = 1e4              # bound on |x| of every tensor the generator builds
MAX_INPUTS = 4
SIZES = (1, 2, 3, 4, 5, 7, 8)
SPECIALS = (np.nan, np.inf, -np.inf)


@dataclass
class Value:
    name: str
    shape: tuple[int, ...]
    mag: float = 2.0       # bound on |x| over its finite elements
    special: bool = False  # may hold NaN or +-inf
    terms: int = 1         # most float terms summed along a path to it (for tolerances)


@dataclass
class Case:
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    terms: dict[str, int]  # per output: most terms summed along a path to it


@dataclass
class Builder:
    draw: Callable
    opset: int
    dynamic: bool    # graph inputs get symbolic dimensions
    zero_size: bool  # a symbolic dimension may be 0 at run time
    specials: bool   # graph inputs may hold NaN and inf
    nodes: list = field(default_factory=list)
    inits: list = field(default_factory=list)
    inputs: list = field(default_factory=list)
    feeds: dict = field(default_factory=dict)
    values: list = field(default_factory=list)
    read: set = field(default_factory=set)
    symbols: dict = field(default_factory=dict)
    count: int = 0

    # ---- drawing -----------------------------------------------------------------------
    def int(self, low: int, high: int) -> int:
        return self.draw(st.integers(low, high))

    def pick(self, options):
        return self.draw(st.sampled_from(list(options)))

    def chance(self, one_in: int) -> bool:
        return self.draw(st.integers(0, one_in - 1)) == 0

    def size(self) -> int:
        return self.pick(SIZES)

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    # ---- tensors -----------------------------------------------------------------------
    def operand(self, ok: Callable[[Value], bool] = lambda v: True) -> Value | None:
        """An existing tensor satisfying ``ok``: half the time the most recent, so that
        chains form (fusion groups grow along them), else any (and graphs branch)."""
        found = [v for v in reversed(self.values) if ok(v)]
        if not found:
            return None
        return found[0] if self.chance(2) else self.pick(found)

    def operand_or_input(self, ok: Callable[[Value], bool], shape: Callable[[], tuple]) -> Value:
        found = self.operand(ok) if not self.chance(4) else None
        return found or self.input(shape())

    def input(self, shape: tuple[int, ...], empty: bool = False) -> Value:
        """A new graph input; in a dynamic graph some dimensions become symbols (one per
        run-time size, sometimes two, so distinct symbols of one size meet too), and where
        ``empty`` allows, a symbol's size may be 0."""
        if len(self.inputs) >= MAX_INPUTS:
            return self.const(shape)
        name = f"in{len(self.inputs)}"
        shape = tuple(0 if empty and self.zero_size and self.chance(4) else d for d in shape)
        dims = [self.symbols.setdefault((d, self.int(0, 1)), f"s{len(self.symbols)}")
                if self.dynamic and (d == 0 or self.chance(2)) else d for d in shape]
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
        data = self.random(shape, 2.0)
        special = self.specials and data.size > 0 and self.chance(2)
        if special:
            flat = data.reshape(-1)
            for _ in range(self.int(1, 3)):
                flat[self.int(0, flat.size - 1)] = self.pick(SPECIALS)
        self.feeds[name] = data
        value = Value(name, shape, 2.0, special)
        self.values.append(value)
        return value

    def random(self, shape, high: float, low: float | None = None) -> np.ndarray:
        seed = self.int(0, 2 ** 32 - 1)
        low = -high if low is None else low
        return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)

    def const(self, shape, high: float = 2.0, low: float | None = None) -> Value:
        data = self.random(shape, high, low)
        return Value(self.constant(data), tuple(shape), float(np.abs(data).max(initial=0.0)))

    def constant(self, array) -> str:
        name = self.fresh("c")
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def ints(self, values) -> str:
        return self.constant(np.asarray(values, dtype=np.int64))

    def node(self, op: str, inputs: list, shapes: list, *, mag: float,
             special: bool = False, terms: int = 1, hidden: bool = False,
             **attrs) -> list[Value]:
        """Emits ``op`` reading ``inputs`` (Values, names or None for a skipped optional
        input) with one output per shape in ``shapes``. A ``hidden`` output (not float32,
        or a helper only its next node reads) is not offered to later ops."""
        names = [x.name if isinstance(x, Value) else x or "" for x in inputs]
        self.read.update(names)
        outs = [Value(self.fresh("t"), tuple(s), mag, special, terms) for s in shapes]
        self.nodes.append(helper.make_node(op, names, [o.name for o in outs],
                                           name=f"n{len(self.nodes)}_{op}", **attrs))
        if not hidden:
            self.values.extend(outs)
        return outs

    def broadcastable(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts with ``shape``: trailing dimensions kept or 1, a 1 of
        ``shape`` sometimes against a new size, sometimes one more leading dimension."""
        kept = shape[self.int(0, len(shape)):]
        dims = tuple(self.pick([d, 1]) if d != 1 else self.pick([1, self.size()]) for d in kept)
        return ((self.size(),) if len(kept) == len(shape) and self.chance(6) else ()) + dims


def _broadcast(*shapes) -> tuple[int, ...] | None:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def _joins(v: Value, x: Value) -> bool:
    """Whether ``v`` broadcasts with ``x`` into a tensor whose size stays small."""
    shape = _broadcast(v.shape, x.shape)
    return shape is not None and math.prod(shape) <= 4096 and len(shape) <= 5


def _partner(b: Builder, x: Value) -> Value:
    """A second operand that broadcasts with ``x``: x itself, another tensor, an
    initializer or a new input."""
    choice = b.int(0, 3)
    if choice == 0:
        found = b.operand(lambda v: _joins(v, x))
        if found:
            return found
    shape = b.broadcastable(x.shape)
    return b.const(shape) if choice == 1 else b.input(shape)


# ---- element-wise ------------------------------------------------------------------------
def unary(b: Builder) -> bool:
    x = b.operand()
    if x is None:
        return False
    ops = ["Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Neg", "Sqrt", "LeakyRelu", "Erf",
           "Clip", "Cast", *(["Gelu"] if b.opset >= 20 else [])]
    op = b.pick(ops)
    keep = dict(special=x.special, terms=x.terms)
    if op in ("Relu", "Abs", "Neg"):
        b.node(op, [x], [x.shape], mag=x.mag, **keep)
    elif op in ("Sigmoid", "Tanh", "Erf"):
        b.node(op, [x], [x.shape], mag=1.0, **keep)
    elif op == "Exp":
        if x.mag > 10:
            return False
        b.node(op, [x], [x.shape], mag=math.exp(x.mag), **keep)
    elif op == "Sqrt":
        (a,) = b.node("Abs", [x], [x.shape], mag=x.mag, **keep)
        b.node("Sqrt", [a], [x.shape], mag=math.sqrt(x.mag), **keep)
    elif op == "LeakyRelu":
        alpha = b.pick([0.01, 0.2, 1.5])
        b.node(op, [x], [x.shape], mag=x.mag * max(1.0, alpha), alpha=alpha, **keep)
    elif op == "Gelu":
        b.node(op, [x], [x.shape], mag=x.mag, approximate=b.pick(["none", "tanh"]), **keep)
    elif op == "Clip":
        low = b.constant(np.float32(b.pick([-1.0, -0.5, 0.0]))) if not b.chance(3) else None
        high = b.constant(np.float32(b.pick([0.5, 1.0, 3.0]))) if not b.chance(3) else None
        b.node(op, [x, low, high], [x.shape], mag=x.mag, **keep)
    else:
        return _cast(b, x)
    return True


def _cast(b: Builder, x: Value) -> bool:
    """A round trip through another type: float16 and int32 round, double does not."""
    to = b.pick([TensorProto.FLOAT16, TensorProto.INT32, TensorProto.DOUBLE, TensorProto.FLOAT])
    if to == TensorProto.INT32 and x.special:
        return False  # NaN and inf have no int32 value
    (y,) = b.node("Cast", [x], [x.shape], mag=x.mag + 1, hidden=True, to=to)
    b.node("Cast", [y], [x.shape], mag=x.mag + 1, special=x.special, terms=x.terms,
           to=TensorProto.FLOAT)
    return True


def binary(b: Builder) -> bool:
    x = b.operand()
    if x is None:
        return False
    op = b.pick(["Add", "Sub", "Mul", "Div", "Max", "Min"])
    if op == "Div":
        return _divide(b, x)
    others = [_partner(b, x) for _ in range(b.int(1, 2) if op in ("Max", "Min") else 1)]
    shape = _broadcast(x.shape, *(o.shape for o in others))
    if shape is None:
        return False
    mags = [x.mag] + [o.mag for o in others]
    mag = {"Add": sum(mags), "Sub": sum(mags), "Mul": math.prod(mags)}.get(op, max(mags))
    if mag > MAX_MAG:
        return False
    b.node(op, [x, *others], [shape], mag=mag, special=any(v.special for v in [x, *others]),
           terms=max(v.terms for v in [x, *others]))
    return True


def _divide(b: Builder, x: Value) -> bool:
    """x over a denominator at least 0.5 in size: an initializer, or 1 + |y|."""
    if b.chance(2):
        shape = b.broadcastable(x.shape)
        data = b.random(shape, 2.0, 0.5) * np.where(b.random(shape, 1.0) < 0, -1, 1)
        den = Value(b.constant(data.astype(np.float32)), shape, 2.0)
        least = 0.5
    else:
        y = _partner(b, x)
        (a,) = b.node("Abs", [y], [y.shape], mag=y.mag, special=y.special, terms=y.terms)
        (den,) = b.node("Add", [a, b.constant(np.float32(1))], [y.shape], mag=y.mag + 1,
                        special=y.special, terms=y.terms)
        least = 1.0
    shape = _broadcast(x.shape, den.shape)
    if shape is None or x.mag / least > MAX_MAG:
        return False
    b.node("Div", [x, den], [shape], mag=x.mag / least, special=x.special or den.special,
           terms=max(x.terms, den.terms))
    return True


def where(b: Builder) -> bool:
    """Where(x < t, x, y), with > for < and the branches swapped at random; t a constant."""
    x = b.operand()
    if x is None:
        return False
    y = _partner(b, x)
    shape = _broadcast(x.shape, y.shape)
    threshold = b.constant(np.float32(b.pick([0.0, 0.5, -1.0])))
    (cond,) = b.node(b.pick(["Less", "Greater"]), [x, threshold], [x.shape], mag=1.0,
                     hidden=True)
    pair = [x, y] if b.chance(2) else [y, x]
    b.node("Where", [cond, *pair], [shape], mag=max(x.mag, y.mag),
           special=x.special or y.special, terms=max(x.terms, y.terms))
    return True


# ---- products ----------------------------------------------------------------------------
def _weights(b: Builder, shape, fan_in: int) -> tuple[str, np.ndarray]:
    data = b.random(shape, 1.0 / math.sqrt(max(fan_in, 1)))
    return b.constant(data), data


def matmul(b: Builder) -> bool:
    a = b.operand(lambda v: len(v.shape) >= 1 and not v.special)
    if a is None:
        return False
    k, n = a.shape[-1], b.size()
    rhs = b.operand(lambda v: len(v.shape) >= 2 and v.shape[-2] == k and not v.special
                    and _broadcast(a.shape[:-2], v.shape[:-2]) is not None)
    if rhs is None or b.chance(2):
        if b.chance(3):
            rhs = b.input((k, n))
            mag = k * a.mag * rhs.mag
        else:
            name, w = _weights(b, (k, n), k)
            rhs, mag = Value(name, (k, n)), a.mag * float(np.abs(w).sum(0).max(initial=0))
    else:
        mag = k * a.mag * rhs.mag
    shape = np.matmul(np.zeros(a.shape, np.float32), np.zeros(rhs.shape, np.float32)).shape
    if mag > MAX_MAG or math.prod(shape) > 4096:
        return False
    # A fresh input may hold NaN or inf: the product's columns then do too.
    b.node("MatMul", [a, rhs], [shape], mag=mag, special=rhs.special,
           terms=max(a.terms, rhs.terms) + k)
    return True


def gemm(b: Builder) -> bool:
    a = b.operand(lambda v: len(v.shape) == 2 and not v.special)
    if a is None:
        return False
    trans_a, trans_b = b.int(0, 1), b.int(0, 1)
    m, k = a.shape[::-1] if trans_a else a.shape
    n = b.size()
    name, w = _weights(b, (n, k) if trans_b else (k, n), k)
    alpha, beta = b.pick([1.0, 0.5, -2.0]), b.pick([1.0, 0.5, -2.0])
    mag = abs(alpha) * a.mag * float(np.abs(w).sum(1 if trans_b else 0).max(initial=0))
    inputs = [a, name]
    if not b.chance(3):
        c = b.const(b.pick([(n,), (1, n), (m, 1), (m, n), ()]))
        inputs.append(c)
        mag += abs(beta) * c.mag
    b.node("Gemm", inputs, [(m, n)], mag=mag, terms=a.terms + k, alpha=alpha, beta=beta,
           transA=trans_a, transB=trans_b)
    return True


# ---- windows -----------------------------------------------------------------------------
def _image(v: Value) -> bool:
    return len(v.shape) in (3, 4) and 0 not in v.shape[1:] and math.prod(v.shape) <= 4096


def _spatial_input(b: Builder) -> Value:
    """An N x C x spatial tensor; 2 x 16 x 16 images have enough tiles for Winograd."""
    return b.operand_or_input(_image, lambda: (
        b.pick([1, 2]), b.pick([1, 2, 3, 4, 8]),
        *(b.pick([*range(1, 10), 16]) for _ in range(b.int(1, 2)))))


def _window_attrs(b: Builder, sizes, kernel_max: int, pool: bool, dilated: bool = True):
    """(kernel, attrs, output sizes) of a window that fits ``sizes``; pads stay below
    the kernel, as ONNX Runtime requires of pooling."""
    n = len(sizes)
    kernel = [b.int(1, min(kernel_max, s + 2)) for s in sizes]
    strides = [b.int(1, 2) for _ in sizes]
    # ONNX Runtime's pools compute negative SAME padding where the stride exceeds the window.
    auto_pad = b.pick(["NOTSET", "NOTSET", "VALID", *([] if pool else ["SAME_UPPER", "SAME_LOWER"])])
    # ONNX Runtime refuses dilations with SAME padding.
    dilations = [b.int(1, 2) if dilated and not auto_pad.startswith("SAME") else 1
                 for _ in sizes]
    spans = [d * (k - 1) + 1 for d, k in zip(dilations, kernel)]
    attrs = dict(strides=strides, dilations=dilations)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        attrs["auto_pad"] = auto_pad
        return kernel, attrs, [-(-s // st_) for s, st_ in zip(sizes, strides)]
    pads = [0] * 2 * n if auto_pad == "VALID" else [b.int(0, k - 1 if pool else 2)
                                                    for k in kernel * 2]
    if auto_pad == "VALID":
        attrs["auto_pad"] = auto_pad
    else:
        attrs["pads"] = pads
    rooms = [s + pads[d] + pads[d + n] - spans[d] for d, s in enumerate(sizes)]
    if min(rooms) < 0:
        return None
    return kernel, attrs, [r // st_ + 1 for r, st_ in zip(rooms, strides)]


def conv(b: Builder) -> bool:
    x = _spatial_input(b)
    if x.special or not _image(x):
        return False
    channels, sizes = x.shape[1], x.shape[2:]
    group = b.pick([g for g in range(1, channels + 1) if channels % g == 0])
    m = group * b.int(1, 3)
    window = _window_attrs(b, sizes, 3, pool=False)
    if window is None:
        return False
    kernel, attrs, out = window
    fan_in = channels // group * math.prod(kernel)
    name, w = _weights(b, (m, channels // group, *kernel), fan_in)
    mag = x.mag * float(np.abs(w).reshape(m, -1).sum(1).max())
    inputs = [x, name]
    if b.chance(2):
        bias = b.const((m,), 1.0)
        inputs.append(bias)
        mag += bias.mag
    if b.chance(3):
        attrs["kernel_shape"] = kernel
    b.node("Conv", inputs, [(x.shape[0], m, *out)], mag=mag, terms=x.terms + fan_in,
           group=group, **attrs)
    return True


def pool(b: Builder) -> bool:
    x = _spatial_input(b)
    if not _image(x):
        return False
    op = b.pick(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"])
    if op.endswith("MaxPool") and x.special:
        return False  # as for ReduceMax; and ONNX Runtime's max pools read -inf as -FLT_MAX
    if op.startswith("Global"):
        b.node(op, [x], [x.shape[:2] + (1,) * (len(x.shape) - 2)], mag=x.mag,
               special=x.special, terms=x.terms + math.prod(x.shape[2:]))
        return True
    # AveragePool takes dilations from opset 19 on.
    window = _window_attrs(b, x.shape[2:], 3, True, op == "MaxPool" or b.opset >= 19)
    if window is None:
        return False
    kernel, attrs, out = window
    if op == "AveragePool":
        if b.opset < 19:
            del attrs["dilations"]
        attrs["count_include_pad"] = b.int(0, 1)
    if not b.dynamic and "pads" in attrs and b.chance(3):
        attrs["ceil_mode"] = 1
        out = _ceil_sizes(x.shape[2:], kernel, attrs)
    if not out or min(out) < 1 or not _windows_reach_input(x.shape[2:], kernel, attrs, out):
        return False
    b.node(op, [x], [x.shape[:2] + tuple(out)], mag=x.mag, special=x.special,
           terms=x.terms + math.prod(kernel), kernel_shape=kernel, **attrs)
    return True


def _windows_reach_input(sizes, kernel, attrs, out) -> bool:
    """Whether every window holds an input element: a dilated window can lie wholly in
    the padding, and its maximum is then -FLT_MAX in ONNX Runtime, -inf in treadle."""
    n = len(sizes)
    pads, dilations = attrs.get("pads", [0] * 2 * n), attrs.get("dilations", [1] * n)
    return all(any(0 <= o * attrs["strides"][d] - pads[d] + k * dilations[d] < sizes[d]
                   for k in range(kernel[d]))
               for d in range(n) for o in range(out[d]))


def _ceil_sizes(sizes, kernel, attrs) -> list[int] | None:
    """Output sizes with ceil_mode; None where a last window would start in the end
    padding: ONNX Runtime drops it, ONNX's shape inference does not."""
    n, out = len(sizes), []
    for d, s in enumerate(sizes):
        begin, end = attrs["pads"][d], attrs["pads"][d + n]
        stride, span = attrs["strides"][d], attrs.get("dilations", [1] * n)[d] * (kernel[d] - 1) + 1
        out.append(-(-(s + begin + end - span) // stride) + 1)
        if (out[-1] - 1) * stride >= s + begin:
            return None
    return out


# ---- reductions and normalisations -------------------------------------------------------
def reduction(b: Builder) -> bool:
    x = b.operand(lambda v: len(v.shape) >= 1)
    if x is None:
        return False
    op = b.pick(["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"])
    if op in ("ReduceMax", "ReduceMin") and x.special:
        return False  # ONNX Runtime's result is NaN or not depending on where the NaN stands
    rank = len(x.shape)
    axes = b.draw(st.lists(st.integers(0, rank - 1), min_size=0, max_size=rank, unique=True))
    reduced = axes or list(range(rank))
    if any(x.shape[a] == 0 for a in reduced):
        return False  # an empty reduction: 0, NaN or an error depending on the op
    keepdims = b.int(0, 1)
    shape = tuple(1 if a in reduced else d for a, d in enumerate(x.shape)
                  if keepdims or a not in reduced)
    n = math.prod(x.shape[a] for a in reduced)
    mag = x.mag * n if op == "ReduceSum" else x.mag
    if mag > MAX_MAG:
        return False
    inputs = [x]
    if axes:
        inputs.append(b.ints([a - rank if b.chance(2) else a for a in axes]))
    b.node(op, inputs, [shape], mag=mag, special=x.special, terms=x.terms + n,
           keepdims=keepdims)
    return True


def softmax(b: Builder) -> bool:
    x = b.operand(lambda v: len(v.shape) >= 1 and 0 not in v.shape)
    if x is None:
        return False
    op = b.pick(["Softmax", "LogSoftmax"])
    axis = b.int(-len(x.shape), len(x.shape) - 1)
    n = x.shape[axis]
    mag = 1.0 if op == "Softmax" else 2 * x.mag + math.log(n)
    b.node(op, [x], [x.shape], mag=mag, special=x.special, terms=x.terms + n, axis=axis)
    return True


def normalization(b: Builder) -> bool:
    op = b.pick(["LayerNormalization", "BatchNormalization", "InstanceNormalization"])
    least = {"LayerNormalization": 1, "BatchNormalization": 2, "InstanceNormalization": 3}[op]
    x = b.operand(lambda v: len(v.shape) >= least and 0 not in v.shape)
    if x is None:
        return False
    epsilon = b.pick([1e-5, 1e-3, 0.1])
    if op == "LayerNormalization":
        axis = b.int(-len(x.shape), len(x.shape) - 1)
        shape = x.shape[axis:]
        n = math.prod(shape)
        inputs = [x, b.const(shape, 1.5, 0.5)] + ([b.const(shape, 1.0)] if b.chance(2) else [])
        b.node(op, inputs, [x.shape], mag=1.5 * math.sqrt(n) + 1, special=x.special,
               terms=_normalized_terms(x, n, epsilon), axis=axis, epsilon=epsilon)
    elif op == "BatchNormalization":
        c = (x.shape[1],)
        params = [b.const(c, 1.5, 0.5), b.const(c, 1.0), b.const(c, 1.0), b.const(c, 2.0, 0.5)]
        b.node(op, [x, *params], [x.shape], mag=(x.mag + 1) * 1.5 * 1.5 + 1,
               special=x.special, terms=x.terms, epsilon=epsilon)
    else:
        n = math.prod(x.shape[2:])
        params = [b.const((x.shape[1],), 1.5, 0.5), b.const((x.shape[1],), 1.0)]
        b.node(op, [x, *params], [x.shape], mag=1.5 * math.sqrt(n) + 1, special=x.special,
               terms=_normalized_terms(x, n, epsilon), epsilon=epsilon)
    return True


def _normalized_terms(x: Value, n: int, epsilon: float) -> int:
    """Terms of a normalisation over n elements of x. Where they (nearly) agree, the
    rounding of their mean (an ulp of x's size) is amplified by up to 1/sqrt(epsilon):
    tolerances scale with the square root of terms, so that counts as its square."""
    amplified = 0.02 * x.mag / math.sqrt(epsilon)  # ulp / float32 tolerance, times scale
    return x.terms + n + math.ceil(amplified ** 2)


# ---- layout ------------------------------------------------------------------------------
def layout(b: Builder) -> bool:
    x = b.operand()
    if x is None:
        return False
    op = b.pick(["Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze"])
    keep = dict(mag=x.mag, special=x.special, terms=x.terms)
    rank = len(x.shape)
    if op == "Transpose":
        if not rank:
            return False
        perm = b.draw(st.permutations(range(rank)))
        b.node(op, [x], [tuple(x.shape[p] for p in perm)], perm=perm, **keep)
    elif op == "Reshape":
        if 0 in x.shape:
            return False
        target = _factorize(b, math.prod(x.shape))
        spec = [0 if k < rank and d == x.shape[k] and b.chance(3) else d
                for k, d in enumerate(target)]
        if b.chance(2):
            spec[b.int(0, len(spec) - 1)] = -1
        b.node(op, [x, b.ints(spec)], [target], **keep)
    elif op == "Flatten":
        axis = b.int(-rank, rank)
        b.node(op, [x], [(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))], axis=axis,
               **keep)
    elif op == "Squeeze":
        ones = [a for a, d in enumerate(x.shape) if d == 1]
        if not ones:
            return False
        axes = b.draw(st.lists(st.sampled_from(ones), min_size=1, unique=True))
        shape = tuple(d for a, d in enumerate(x.shape) if a not in axes)
        b.node(op, [x, b.ints([a - rank if b.chance(2) else a for a in axes])], [shape], **keep)
    else:
        count = b.int(1, 2)
        axes = b.draw(st.lists(st.integers(0, rank + count - 1), min_size=count,
                               max_size=count, unique=True))
        it = iter(x.shape)
        shape = tuple(1 if a in axes else next(it) for a in range(rank + count))
        b.node(op, [x, b.ints(axes)], [shape], **keep)
    return True


def _factorize(b: Builder, total: int) -> tuple[int, ...]:
    """A random shape of ``total`` elements, rank 1 to 4."""
    primes, n, p = [], total, 2
    while n > 1:
        while n % p == 0:
            primes.append(p)
            n //= p
        p += 1
    dims = [1] * b.int(1, 4)
    for q in primes:
        dims[b.int(0, len(dims) - 1)] *= q
    return tuple(dims)


def concat(b: Builder) -> bool:
    x = b.operand(lambda v: len(v.shape) >= 1)
    if x is None:
        return False
    axis = b.int(0, len(x.shape) - 1)
    parts = [x]
    for _ in range(b.int(1, 2)):
        def fits(v):
            return (len(v.shape) == len(x.shape) and
                    all(d == e for a, (d, e) in enumerate(zip(v.shape, x.shape)) if a != axis))
        shape = x.shape[:axis] + (b.size(),) + x.shape[axis + 1:]
        parts.append(b.operand_or_input(fits, lambda: shape) if b.chance(2)
                     else b.const(shape))
    shape = x.shape[:axis] + (sum(p.shape[axis] for p in parts),) + x.shape[axis + 1:]
    if math.prod(shape) > 4096:
        return False
    b.node("Concat", parts, [shape], mag=max(p.mag for p in parts),
           special=any(p.special for p in parts), terms=max(p.terms for p in parts),
           axis=axis - len(x.shape) if b.chance(2) else axis)
    return True


def split(b: Builder) -> bool:
    x = b.operand(lambda v: any(d >= 2 for d in v.shape))
    if x is None:
        return False
    axis = b.pick([a for a, d in enumerate(x.shape) if d >= 2])
    d = x.shape[axis]
    keep = dict(mag=x.mag, special=x.special, terms=x.terms)
    if b.chance(2):
        cuts = sorted(b.draw(st.lists(st.integers(1, d - 1), min_size=1, max_size=2,
                                      unique=True)))
        sizes = [e - s for s, e in zip([0, *cuts], [*cuts, d])]
        inputs, attrs = [x, b.ints(sizes)], {}
    else:
        count = b.int(2, min(d, 3))
        chunk = -(-d // count)
        if chunk * (count - 1) >= d:
            return False
        sizes = [chunk] * (count - 1) + [d - chunk * (count - 1)]
        inputs, attrs = [x], {"num_outputs": count}
    shapes = [x.shape[:axis] + (s,) + x.shape[axis + 1:] for s in sizes]
    b.node("Split", inputs, shapes, axis=axis, **attrs, **keep)
    return True


def slice_(b: Builder) -> bool:
    x = b.operand(lambda v: len(v.shape) >= 1)
    if x is None:
        return False
    rank = len(x.shape)
    axes = b.draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=min(rank, 2),
                           unique=True))
    big = 2 ** 63 - 1
    starts, ends, steps, shape = [], [], [], list(x.shape)
    for a in axes:
        d = x.shape[a]
        step = b.pick([1, 1, 2, -1, -2, 3] if d else [1, 2])
        start = b.pick([b.int(-d - 2, d + 2), 0, -big if step > 0 else big])
        end = b.pick([b.int(-d - 2, d + 2), big if step > 0 else -big])
        starts.append(start)
        ends.append(end)
        steps.append(step)
        shape[a] = _slice_size(d, start, end, step)
    inputs = [x, b.ints(starts), b.ints(ends), b.ints([a - rank if b.chance(2) else a
                                                       for a in axes])]
    if steps != [1] * len(axes) or b.chance(2):
        inputs.append(b.ints(steps))
    b.node("Slice", inputs, [tuple(shape)], mag=x.mag, special=x.special, terms=x.terms)
    return True


def _slice_size(d: int, start: int, end: int, step: int) -> int:
    """ONNX's rule, which clamps a negative step's start into [0, d - 1] (Python's slice
    makes an empty range of a start below -d)."""
    start, end = (v + d if v < 0 else v for v in (start, end))
    low, high = (0, d) if step > 0 else (-1, d - 1)
    start = min(max(start, 0), d if step > 0 else d - 1)
    end = min(max(end, low), high)
    return max(0, -(-(end - start) // step))


def gather(b: Builder) -> bool:
    x = b.operand(lambda v: len(v.shape) >= 1 and any(d > 0 for d in v.shape))
    if x is None:
        return False
    axis = b.pick([a for a, d in enumerate(x.shape) if d > 0])
    d = x.shape[axis]
    index_shape = tuple(b.int(1, 3) for _ in range(b.int(0, 2)))
    seed = b.int(0, 2 ** 32 - 1)
    indices = np.random.default_rng(seed).integers(-d, d, size=index_shape, dtype=np.int64)
    shape = x.shape[:axis] + index_shape + x.shape[axis + 1:]
    b.node("Gather", [x, b.constant(indices)], [shape], mag=x.mag, special=x.special,
           terms=x.terms, axis=axis - len(x.shape) if b.chance(2) else axis)
    return True


def pad(b: Builder) -> bool:
    x = b.operand(lambda v: len(v.shape) >= 1)
    if x is None:
        return False
    mode = b.pick(["constant", "edge", "reflect"])
    rank = len(x.shape)
    axes = list(range(rank)) if b.chance(2) else sorted(b.draw(st.lists(
        st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True)))
    pads = []
    for a in axes * 2:
        d = x.shape[a]
        most = {"constant": 2, "edge": 2 if d else 0, "reflect": min(2, d - 1)}[mode]
        # Constant mode may also crop, from the start only so that no size goes negative.
        least = -min(d, 1) if mode == "constant" and len(pads) < len(axes) else 0
        pads.append(b.int(least, max(most, least)))
    shape = list(x.shape)
    for k, a in enumerate(axes):
        shape[a] += pads[k] + pads[k + len(axes)]
    if math.prod(shape) > 4096:
        return False
    inputs = [x, b.ints(pads)]
    value = 0.0
    if mode == "constant" and b.chance(2):
        value = b.pick([1.5, -3.0])
        inputs.append(b.constant(np.float32(value)))
    if axes != list(range(rank)):
        inputs += [None] * (3 - len(inputs)) + [b.ints(axes)]
    b.node("Pad", inputs, [tuple(shape)], mag=max(x.mag, abs(value)), special=x.special,
           terms=x.terms, mode=mode)
    return True


def resize(b: Builder) -> bool:
    x = b.operand(lambda v: len(v.shape) == 4 and 0 not in v.shape[2:])
    if x is None:
        x = b.input((b.pick([1, 2]), b.pick([1, 3]), b.int(1, 7), b.int(1, 7)))
        if 0 in x.shape[2:]:
            return False
    mode = b.pick(["nearest", "linear"])
    if mode == "linear" and x.special:
        return False  # inf times a zero weight is NaN in one interpolation order, not another
    attrs = dict(mode=mode, coordinate_transformation_mode=b.pick(
        ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"]))
    if mode == "nearest":
        attrs["nearest_mode"] = b.pick(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
    if b.chance(2):
        scales = [1.0, 1.0] + [b.pick([0.5, 1.0, 1.5, 2.0, 3.0]) for _ in range(2)]
        out = [math.floor(d * s) for d, s in zip(x.shape, scales)]
        inputs = [x, None, b.constant(np.asarray(scales, np.float32))]
    else:
        out = list(x.shape[:2]) + [b.int(1, 9) for _ in range(2)]
        inputs = [x, None, None, b.ints(out)]
    if min(out[2:]) < 1 or math.prod(out) > 4096:
        return False
    b.node("Resize", inputs, [tuple(out)], mag=x.mag, special=x.special, terms=x.terms,
           **attrs)
    return True


# Families, element-wise first: hypothesis shrinks a choice toward the front of the list.
OPS = [unary, binary, where, matmul, gemm, conv, pool, reduction, softmax, normalization,
       layout, concat, split, slice_, gather, pad, resize]


@st.composite
def cases(draw, max_nodes: int = 15) -> Case:
    return _finish(build(draw, max_nodes))


def build(draw, max_nodes: int) -> Builder:
    b = Builder(draw, opset=draw(st.sampled_from(OPSETS)), dynamic=draw(st.booleans()),
                zero_size=draw(st.integers(0, 7)) == 0, specials=draw(st.integers(0, 3)) == 0)
    b.input(tuple(draw(st.sampled_from(SIZES)) for _ in range(draw(st.integers(1, 4)))),
            empty=True)
    target = draw(st.integers(3, max_nodes))
    for _ in range(4 * target):  # an op may find nothing to work on
        if len(b.nodes) >= target:
            break
        draw(st.sampled_from(OPS))(b)
    return b


def _finish(b: Builder) -> Case:
    """The model: every tensor no node reads is an output, and a few that are read."""
    made = [v for v in b.values if v.name not in b.feeds]
    outputs = [v for v in made if v.name not in b.read or b.chance(6)] or made[-1:]
    graph = helper.make_graph(b.nodes, "fuzz", b.inputs,
                              [helper.make_tensor_value_info(v.name, TensorProto.FLOAT, None)
                               for v in outputs], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", b.opset)],
                              ir_version=IR_VERSION)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    known = {i.name: i for i in [*inferred.graph.value_info, *inferred.graph.output]}
    del model.graph.output[:]
    model.graph.output.extend(known[v.name] for v in outputs)
    onnx.checker.check_model(model, full_check=True)
    return Case(model, dict(b.feeds), {v.name: v.terms for v in outputs})
