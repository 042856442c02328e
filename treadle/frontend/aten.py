"""ATen operators as treadle operators: one converter per op, keyed by overload.

Each converter spells an ATen op with the registered (ONNX-semantics) operators, so no op's
meaning is defined twice: arguments are translated (PyTorch's padding order, its scalar
type promotion, its keyword defaults) and the operator definitions do the rest. Sizes come
from the node's fake tensor where ATen gives them as values (``view``, ``expand``).
``TABLE`` holds every overload with a converter; the torch.compile backend runs other
nodes in eager. In-place overloads (``relu_``, ``add_``) have none: the graphs arrive
functional, and converting one as its out-of-place twin would lose its write into the
tensors it aliases.
"""
from __future__ import annotations

import contextlib
import math
import operator
import re
from dataclasses import dataclass
from typing import Callable, Collection, Optional, Sequence

import numpy as np
import torch

from treadle.errors import TreadleError, UnsupportedOpError
from treadle.frontend.torch import CHECKS, Importer, numpy_of, torch_dtype
from treadle.graph.operator import apply
from treadle.graph.ops import unique
from treadle.graph.ops.shape import dims_tensor
from treadle.graph.tensor import Dim, Tensor, constant, num_elements
from treadle.ir import dtypes
from treadle.ir.dtypes import DataType
from treadle.ir.expr import as_expr, maximum, minimum

Converter = Callable[..., object]
TABLE: dict[object, Converter] = {}
# Which nodes of an overload its converter takes, where not all (a result whose size it
# cannot know): the others run in eager alone, rather than with the piece around them.
CLAIMS: dict[object, Callable[[torch.fx.Node], bool]] = {}
INT64_MAX = 2 ** 63 - 1


def aten(*overloads: str, claims: Optional[Callable[[torch.fx.Node], bool]] = None
         ) -> Callable[[Converter], Converter]:
    """Registers a converter for ``aten.<op>.<overload>`` names that this torch has (those
    of another namespace written ``namespace::<op>.<overload>``), for the nodes ``claims``
    accepts where given."""
    def wrap(convert: Converter) -> Converter:
        for name in overloads:
            namespace, _, qualified = name.rpartition("::")
            op_name, _, overload = qualified.partition(".")
            packet = getattr(getattr(torch.ops, namespace or "aten"), op_name, None)
            target = getattr(packet, overload or "default", None) if packet else None
            if target is not None:
                TABLE[target] = convert
                if claims is not None:
                    CLAIMS[target] = claims
        return convert
    return wrap


class Call:
    """One FX node being converted: builds its operators, named after the node."""

    def __init__(self, importer: Importer, node: torch.fx.Node):
        self.importer = importer
        self.node = node
        self.count = 0
        value = node.meta.get("val")
        first = value[0] if isinstance(value, (list, tuple)) and value else value
        self.value = first if isinstance(first, torch.Tensor) else None

    @property
    def dtype(self) -> DataType:
        return torch_dtype(self.value.dtype)

    @property
    def shape(self) -> tuple[Dim, ...]:
        return self.importer.shape(self.value)

    def op(self, op_type: str, *inputs: Optional[Tensor], outputs: int = 1, **attrs):
        name = self.node.name if self.count == 0 else f"{self.node.name}/{self.count}"
        self.count += 1
        names = [name] if outputs == 1 else [f"{name}:{k}" for k in range(outputs)]
        results = apply(op_type, list(inputs), attrs, name=name, output_names=names)
        return results[0] if outputs == 1 else results[:outputs]

    def const(self, value, dtype: DataType) -> Tensor:
        return constant(held(value, dtype), f"{self.node.name}/const", dtype)

    def ints(self, values: Sequence[int]) -> Tensor:
        return self.const(np.asarray(list(values), np.int64), dtypes.int64)

    def first_only(self, first: Tensor, rest: str) -> tuple[Tensor, None]:
        """A two-result op's first result, refused when the graph reads the second (which
        ``rest`` names: max pooling's indices, attention's log-sum-exp)."""
        if self.reads_rest:
            raise UnsupportedOpError(f"{self.where}: {rest} are not supported")
        return first, None

    @property
    def reads_rest(self) -> bool:
        """Whether the graph reads any result of the node but its first."""
        return any(u.target is not operator.getitem or u.args[1] != 0 for u in self.node.users)

    def reshape(self, x: Tensor, shape: Sequence[Dim]) -> Tensor:
        """``x`` in PyTorch sizes, where 0 is a size (ONNX's Reshape reads it as 'keep')."""
        return self.op("Reshape", x, self.dims(shape), allowzero=1)

    def dims(self, dims: Sequence[Dim]) -> Tensor:
        """Sizes as an int64 vector, symbolic ones through the Dims operator."""
        name = f"{self.node.name}/{self.count}"
        self.count += 1
        return dims_tensor(list(dims), name)

    def tensor(self, value, dtype: DataType) -> Tensor:
        """A tensor argument cast to ``dtype``, or a Python number as a constant of it."""
        if isinstance(value, Tensor):
            return value if value.dtype == dtype else self.op("Cast", value, to=_onnx(dtype))
        if isinstance(value, (bool, int, float)):
            return self.const(value, dtype)
        raise UnsupportedOpError(f"{self.where}: expected a tensor or a number, got "
                                 f"{type(value).__name__}")

    @property
    def where(self) -> str:
        return f"node {self.node.name!r} ({self.node.target})"

    def arg_value(self, k: int):
        """The fake value (tensor or number) of the node's ``k``-th positional argument."""
        arg = self.node.args[k]
        return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg


def held(value, dtype: DataType) -> np.ndarray:
    """``value`` as treadle holds a ``dtype`` tensor: converted by torch's rounding, so
    bfloat16 becomes its raw bits."""
    return numpy_of(torch.as_tensor(np.asarray(value), dtype=getattr(torch, dtype.name)))


def _onnx(dtype: DataType) -> int:
    from treadle.graph.ops.common import ONNX_DTYPES
    return next(code for code, d in ONNX_DTYPES.items() if d == dtype)


def convert_node(importer: Importer, node: torch.fx.Node):
    """The imported value of a call_function node."""
    if node.target is operator.getitem:
        return importer.arg(node.args[0])[node.args[1]]
    value = node.meta.get("val")
    if not isinstance(node.target, torch._ops.OpOverload) or _size_query(node):
        # Size arithmetic, already evaluated by the tracer, or a guard's condition, which
        # only checks read.
        if isinstance(value, (torch.SymInt, int)) and not isinstance(value, bool):
            return importer.dim(value)
        return None
    if getattr(node.target, "_opname", None) in CHECKS:
        return None
    convert = TABLE.get(node.target) or _custom_converter(node.target)
    if convert is None:
        raise UnsupportedOpError(f"node {node.name!r}: ATen operator {node.target} is not "
                                 f"supported{_shape_from_contents(value)}")
    call = Call(importer, node)
    args, kwargs = importer.arg(node.args), importer.arg(node.kwargs)
    try:
        return convert(call, *args, **kwargs)
    except TreadleError:
        raise
    except (TypeError, ValueError, IndexError, KeyError, AttributeError) as err:
        raise UnsupportedOpError(f"{call.where}: cannot be converted: {err}") from err


def _size_query(node: torch.fx.Node) -> bool:
    """Whether the node asks a tensor's size, which the tracer has evaluated."""
    return node.target in (torch.ops.aten.sym_size.int, torch.ops.aten.sym_numel.default)


def _shape_from_contents(value) -> str:
    """Why an op like ``nonzero`` (``torch.where(mask)``) has no converter: a graph's
    shapes follow from its inputs' shapes, not from their values."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    shapes = [v.shape for v in (value if isinstance(value, (list, tuple)) else [value])
              if isinstance(v, torch.Tensor)]
    if any(free_unbacked_symbols(s) for s in shapes):
        return " (its result's shape depends on its input's values)"
    return ""


def is_supported(node: torch.fx.Node) -> bool:
    """Whether a call_function node has a converter that claims it (its arguments may
    still be refused)."""
    if node.target is operator.getitem or getattr(node.target, "_opname", None) in CHECKS:
        return True
    if not isinstance(node.target, torch._ops.OpOverload) or _size_query(node):
        return True  # size arithmetic
    if node.target in TABLE:
        return node.target not in CLAIMS or CLAIMS[node.target](node)
    return _custom_converter(node.target) is not None


def decompositions(among: Optional[Collection] = None) -> dict:
    """torch's own decompositions (``torch.export.default_decompositions``) of the ATen
    operators without a converter, of those in ``among`` where given: applied before
    import, they turn einsum, roll or trace into operators that have one."""
    return {op: rule for op, rule in torch.export.default_decompositions().items()
            if (among is None or op in among) and op not in TABLE
            and _custom_converter(op) is None}


def _custom_converter(target) -> Optional[Converter]:
    """Kernels written in treadle.lang and registered as torch custom ops
    (``torch.ops.treadle_lang.<name>``) become their graph operators again."""
    if getattr(target, "namespace", None) != "treadle_lang":
        return None
    from treadle.lang import OPS
    spec = OPS.get(target._opname)
    if spec is None:
        return None

    def convert(call: Call, *args):
        outputs = spec.apply(list(args), name=call.node.name)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)
    return convert


# ---- element-wise ----------------------------------------------------------------------

def _promoted(call: Call, *values) -> list[Tensor]:
    """Operands cast to the node's result dtype (PyTorch's promotion already decided it)."""
    return [call.tensor(v, call.dtype) for v in values]


def _compared(call: Call, a, b) -> list[Tensor]:
    """Comparison operands cast to their common dtype (the result is bool)."""
    common = torch_dtype(torch.result_type(call.arg_value(0), call.arg_value(1)))
    return [call.tensor(a, common), call.tensor(b, common)]


def _binary(op_type: str):
    def convert(call: Call, a, b, alpha=1):
        a, b = _promoted(call, a, b)
        if alpha != 1:
            b = call.op("Mul", b, call.const(alpha, call.dtype))
        return call.op(op_type, a, b)
    return convert


aten("add.Tensor", "add.Scalar")(_binary("Add"))
aten("sub.Tensor", "sub.Scalar")(_binary("Sub"))
aten("mul.Tensor", "mul.Scalar")(_binary("Mul"))
aten("maximum.default")(_binary("Max"))
aten("minimum.default")(_binary("Min"))
aten("pow.Tensor_Tensor", "pow.Tensor_Scalar", "pow.Scalar")(_binary("Pow"))
aten("fmod.Tensor", "fmod.Scalar")(
    lambda call, a, b: call.op("Mod", *_promoted(call, a, b), fmod=1))
aten("remainder.Tensor", "remainder.Scalar")(
    lambda call, a, b: call.op("Mod", *_promoted(call, a, b)))  # the divisor's sign


@aten("rsub.Scalar", "rsub.Tensor")
def _rsub(call: Call, a, b, alpha=1):
    return _binary("Sub")(call, b, a) if alpha == 1 else \
        call.op("Sub", *_promoted(call, b, call.op("Mul", *_promoted(call, a, alpha))))


@aten("div.Tensor", "div.Scalar", "div.Tensor_mode", "div.Scalar_mode", "true_divide.Tensor",
      "floor_divide.default", "floor_divide.Scalar")
def _div(call: Call, a, b, rounding_mode=None):
    if call.node.target in (torch.ops.aten.floor_divide.default,
                            getattr(torch.ops.aten.floor_divide, "Scalar", None)):
        rounding_mode = "floor"
    a, b = _promoted(call, a, b)
    if rounding_mode is None or rounding_mode == "trunc" and not call.dtype.is_float:
        return call.op("Div", a, b)
    if not call.dtype.is_float:
        return _quotient(call, a, b)
    q = call.op("Div", a, b)
    if rounding_mode == "floor":
        return call.op("Floor", q)
    zero = call.const(0, call.dtype)
    return call.op("Where", call.op("Less", q, zero), call.op("Ceil", q), call.op("Floor", q))


def _quotient(call: Call, a: Tensor, b: Tensor) -> Tensor:
    """``a / b`` as PyTorch divides the node's dtype: integers round down (divide the
    multiple of b below a, exactly), where ONNX's Div truncates."""
    if call.dtype.is_float:
        return call.op("Div", a, b)
    return call.op("Div", call.op("Sub", a, call.op("Mod", a, b)), b)


UNARY = {"abs": "Abs", "neg": "Neg", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
         "sin": "Sin", "cos": "Cos", "tan": "Tan", "tanh": "Tanh", "sigmoid": "Sigmoid",
         "relu": "Relu", "erf": "Erf", "floor": "Floor", "ceil": "Ceil", "round": "Round",
         "reciprocal": "Reciprocal", "asin": "Asin", "acos": "Acos",
         "atan": "Atan", "sinh": "Sinh", "cosh": "Cosh", "asinh": "Asinh", "acosh": "Acosh",
         "atanh": "Atanh", "hardswish": "HardSwish", "mish": "Mish", "isnan": "IsNaN",
         "logical_not": "Not"}


def _unary(op_type: str):
    def convert(call: Call, x):
        if op_type != "IsNaN":  # in the result's dtype: exp(int) is a float,
            x = call.tensor(x, call.dtype)  # logical_not(float) a bool
        return call.op(op_type, x)
    return convert


for _name, _op_type in UNARY.items():
    aten(f"{_name}.default")(_unary(_op_type))


@aten("sign.default")
def _sign(call: Call, x):
    # PyTorch's sign of NaN is 0 where ONNX Sign's is NaN.
    y = call.op("Sign", x)
    if not call.dtype.is_float:
        return y
    return call.op("Where", call.op("IsNaN", x), call.const(0, call.dtype), y)


@aten("bitwise_not.default")
def _bitwise_not(call: Call, x):
    return call.op("Not" if call.dtype == dtypes.boolean else "BitwiseNot", x)


@aten("rsqrt.default")
def _rsqrt(call: Call, x):
    return call.op("Reciprocal", call.op("Sqrt", call.tensor(x, call.dtype)))


# Abramowitz and Stegun 9.8.1 and 9.8.2: I0(x) as a polynomial in (x / 3.75)^2 below 3.75,
# and sqrt(x) e^-x I0(x) (0.4 and more) as one in 3.75 / x from there on, each within 2e-7;
# evaluated in float32, within 1e-6 relative of I0 and of PyTorch's float32.
I0_BELOW = (1.0, 3.5156229, 3.0899424, 1.2067492, 0.2659732, 0.0360768, 0.0045813)
I0_ABOVE = (0.39894228, 0.01328592, 0.00225319, -0.00157565, 0.00916281, -0.02057706,
            0.02635537, -0.01647633, 0.00392377)


@aten("i0.default", "special_i0.default")
def _i0(call: Call, x):
    """The modified Bessel function of order 0, in float32 (half precision's too). As
    PyTorch's float32 does, the large branch multiplies by e^|x|, so it overflows to inf
    from |x| = 88.7 on (NaN at infinity)."""
    if call.dtype == dtypes.float64:  # the polynomials hold float32's accuracy only
        raise UnsupportedOpError(f"{call.where}: float64 i0")
    a = call.op("Abs", call.tensor(x, dtypes.float32))
    knee = call.const(3.75, dtypes.float32)
    t = call.op("Div", a, knee)
    below = _polynomial(call, I0_BELOW, call.op("Mul", t, t))
    above = call.op("Div", call.op("Mul", _polynomial(call, I0_ABOVE, call.op(
        "Reciprocal", t)), call.op("Exp", a)), call.op("Sqrt", a))
    y = call.op("Where", call.op("Less", a, knee), below, above)
    return call.tensor(y, call.dtype)


def _polynomial(call: Call, coefficients: Sequence[float], t: Tensor) -> Tensor:
    """The sum of coefficients[k] * t^k, by Horner's rule."""
    y = call.const(coefficients[-1], t.dtype)
    for c in reversed(coefficients[:-1]):
        y = call.op("Add", call.op("Mul", y, t), call.const(c, t.dtype))
    return y


@aten("silu.default")
def _silu(call: Call, x):
    return call.op("Mul", x, call.op("Sigmoid", x))


@aten("gelu.default")
def _gelu(call: Call, x, approximate="none"):
    return call.op("Gelu", x, approximate=approximate)


@aten("leaky_relu.default")
def _leaky_relu(call: Call, x, negative_slope=0.01):
    return call.op("LeakyRelu", x, alpha=float(negative_slope))


@aten("elu.default")
def _elu(call: Call, x, alpha=1.0, scale=1.0, input_scale=1.0):
    """scale * (x if x > 0 else alpha * (exp(input_scale * x) - 1)): selu's scales."""
    if input_scale == 1.0:
        y = call.op("Elu", x, alpha=float(alpha))
    else:
        scaled = call.op("Elu", call.op("Mul", x, call.const(input_scale, x.dtype)),
                         alpha=float(alpha))
        y = call.op("Where", call.op("Greater", x, call.const(0, x.dtype)), x, scaled)
    return y if scale == 1.0 else call.op("Mul", y, call.const(scale, x.dtype))


@aten("hardsigmoid.default")
def _hardsigmoid(call: Call, x):
    return call.op("HardSigmoid", x, alpha=1 / 6, beta=0.5)


@aten("softplus.default")
def _softplus(call: Call, x, beta=1.0, threshold=20.0):
    scaled = x if beta == 1.0 else call.op("Mul", x, call.const(beta, call.dtype))
    y = call.op("Softplus", scaled)
    if beta != 1.0:
        y = call.op("Div", y, call.const(beta, call.dtype))
    # Where beta * x passes the threshold PyTorch returns the input itself.
    return call.op("Where", call.op("Greater", scaled, call.const(threshold, call.dtype)),
                   x, y)


@aten("clamp.default", "clamp.Tensor", "hardtanh.default", "clamp_min.default",
      "clamp_max.default", "relu6.default")
def _clamp(call: Call, x, low=None, high=None):
    target = call.node.target
    if target is torch.ops.aten.clamp_max.default:
        low, high = None, low
    elif target is torch.ops.aten.hardtanh.default:
        low, high = (-1.0 if low is None else low), (1.0 if high is None else high)
    elif target._opname == "relu6":
        low, high = 0.0, 6.0
    x = call.tensor(x, call.dtype)
    low, high = [None if v is None else call.tensor(v, call.dtype) for v in (low, high)]
    if all(b is not None and b.rank == 0 for b in (low, high)):
        return call.op("Clip", x, low, high)
    # Bounds per element, or one missing (ONNX's Clip would clip an infinity to the type's
    # largest value there): raise to the lower first, so an upper one below it wins.
    y = x if low is None else call.op("Max", x, low)
    return y if high is None else call.op("Min", y, high)


COMPARISONS = {"eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater",
               "ge": "GreaterOrEqual"}
for _name, _op_type in COMPARISONS.items():
    aten(f"{_name}.Tensor", f"{_name}.Scalar")(
        (lambda t: lambda call, a, b: call.op(t, *_compared(call, a, b)))(_op_type))


@aten("ne.Tensor", "ne.Scalar")
def _ne(call: Call, a, b):
    return call.op("Not", call.op("Equal", *_compared(call, a, b)))


LOGICAL = {"logical_and": "And", "logical_or": "Or", "logical_xor": "Xor"}
BITWISE = {"bitwise_and": ("And", "BitwiseAnd"), "__and__": ("And", "BitwiseAnd"),
           "bitwise_or": ("Or", "BitwiseOr"), "__or__": ("Or", "BitwiseOr"),
           "bitwise_xor": ("Xor", "BitwiseXor"), "__xor__": ("Xor", "BitwiseXor")}
for _name, _op_type in LOGICAL.items():
    aten(f"{_name}.default")(
        (lambda t: lambda call, a, b: call.op(t, *[call.tensor(v, dtypes.boolean)
                                                   for v in (a, b)]))(_op_type))
for _name, (_logical, _bits) in BITWISE.items():
    aten(f"{_name}.Tensor", f"{_name}.Scalar")(
        (lambda lo, bi: lambda call, a, b: call.op(
            lo if call.dtype == dtypes.boolean else bi, *_promoted(call, a, b)))(_logical, _bits))


@aten("where.self", "where.ScalarOther", "where.ScalarSelf", "where.Scalar")
def _where(call: Call, cond, a, b):
    return call.op("Where", call.tensor(cond, dtypes.boolean), *_promoted(call, a, b))


@aten("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(call: Call, x, mask, value):
    return call.op("Where", mask, call.tensor(value, call.dtype), x)


@aten("isinf.default")
def _isinf(call: Call, x):
    return call.op("IsInf", x)


@aten("_to_copy.default", "to.dtype", "to.dtype_layout", "to.device", "to.other",
      "type_as.default", "clone.default", "contiguous.default", "alias.default",
      "detach.default", "lift_fresh_copy.default", "dropout.default", "native_dropout.default",
      "_unsafe_view.default", "view.dtype", "copy.default")
def _copy(call: Call, x, *args, **kwargs):
    target = call.node.target
    if target._opname in ("dropout", "native_dropout") and args[1] and args[0]:
        raise UnsupportedOpError(f"{call.where}: dropout in training mode (call eval())")
    if target is torch.ops.aten.copy.default:
        x = args[0]  # copy(self, src): the result holds src in self's dtype and shape
        x = call.op("Expand", x, call.dims(call.shape))
    if target is torch.ops.aten.view.dtype and x.dtype != call.dtype:
        raise UnsupportedOpError(f"{call.where}: reinterpreting {x.dtype} as {call.dtype} "
                                 "(a bit cast) is not supported")
    if target is torch.ops.aten._unsafe_view.default:
        return call.reshape(x, call.shape)
    y = call.tensor(x, call.dtype)
    if target is torch.ops.aten.native_dropout.default:
        return y, call.op("ConstantOfShape", call.dims(call.shape),
                          value=np.ones(1, np.bool_))
    return y if y is not x else call.op("Identity", x)


# ---- shapes and indexing ---------------------------------------------------------------

@aten("view.default", "reshape.default", "_reshape_alias.default", "flatten.using_ints",
      "unflatten.int", "squeeze.dim", "squeeze.dims", "squeeze.default", "unsqueeze.default",
      "view_as.default", "reshape_as.default")
def _reshape(call: Call, x, *args):
    return call.reshape(x, call.shape)


@aten("permute.default")
def _permute(call: Call, x, dims):
    return call.op("Transpose", x, perm=[d % max(x.rank, 1) for d in dims])


@aten("transpose.int", "swapaxes.default")
def _transpose(call: Call, x, a, b):
    perm = list(range(x.rank))
    if perm:
        a, b = a % x.rank, b % x.rank
        perm[a], perm[b] = perm[b], perm[a]
    return call.op("Transpose", x, perm=perm)


@aten("t.default", "numpy_T.default")
def _t(call: Call, x):
    return call.op("Transpose", x, perm=list(reversed(range(x.rank))))


@aten("expand.default", "expand_as.default", "broadcast_to.default")
def _expand(call: Call, x, *args, **kwargs):
    return call.op("Expand", x, call.dims(call.shape))


@aten("repeat.default")
def _repeat(call: Call, x, repeats):
    extra = len(repeats) - x.rank
    if extra > 0:
        x = call.reshape(x, [1] * extra + list(x.shape))
    return call.op("Tile", x, call.dims([call.importer.dim(r) for r in repeats]))


@aten("repeat_interleave.Tensor")
def _repeat_interleave(call: Call, repeats, *, output_size=None):
    """Each position k of ``repeats`` as many times as it says: output position j holds
    the count of running totals of ``repeats`` at or below j. The output's size is the
    sum of the repeats: given as ``output_size`` or traced, or else found in the data
    (FoundSum), which no input's size bounds, so the tensors it sizes are allocated once
    it is known."""
    flat = call.reshape(repeats, [-1])
    if _shape_from_contents(call.value):
        call.importer.bind_found(call.value.shape[0], call.op("FoundSum", flat).producer)
    totals = call.op("CumSum", flat, call.const(0, dtypes.int64))
    positions = call.op("Unsqueeze", _counting(call, call.shape[0]), call.ints([1]))
    passed = call.op("LessOrEqual", call.op("Unsqueeze", call.tensor(totals, dtypes.int64),
                                            call.ints([0])), positions)
    counts = call.op("ReduceSum", call.tensor(passed, dtypes.int64), call.ints([1]),
                     keepdims=0)
    return call.tensor(counts, call.dtype)


@aten("cat.default", "concat.default")
def _cat(call: Call, tensors, dim=0):
    # PyTorch allows empty 1-D tensors beside others of any rank; they add nothing.
    kept = [t for t in tensors if not (t.rank == 1 and t.shape[0] == 0)] or tensors[:1]
    kept = [call.tensor(t, call.dtype) for t in kept]
    if len(kept) == 1:
        return call.op("Identity", kept[0])
    return call.op("Concat", *kept, axis=dim)


@aten("stack.default")
def _stack(call: Call, tensors, dim=0):
    axis = dim % (tensors[0].rank + 1)
    parts = [call.op("Unsqueeze", call.tensor(t, call.dtype), call.ints([axis]))
             for t in tensors]
    return parts[0] if len(parts) == 1 else call.op("Concat", *parts, axis=axis)


def _split(call: Call, x, sizes: Sequence[Dim], dim: int):
    parts = call.op("Split", x, call.dims(sizes), axis=dim, outputs=len(sizes))
    return list(parts) if len(sizes) > 1 else [parts]


@aten("split.Tensor", "split_with_sizes.default", "split.sizes")
def _split_tensor(call: Call, x, size, dim=0):
    sizes = [call.importer.shape(v)[dim % x.rank] for v in call.node.meta["val"]]
    return _split(call, x, sizes, dim % x.rank)


@aten("chunk.default")
def _chunk(call: Call, x, chunks, dim=0):
    return _split_tensor(call, x, chunks, dim)


@aten("unbind.int")
def _unbind(call: Call, x, dim=0):
    dim %= x.rank
    parts = _split(call, x, [1] * len(call.node.meta["val"]), dim)
    return [call.op("Squeeze", p, call.ints([dim])) for p in parts]


def _bound(value) -> Dim:
    """A slice's end as ONNX reads it: PyTorch's 'to the end' is INT64_MAX or None."""
    return INT64_MAX if value is None else value


@aten("slice.Tensor")
def _slice(call: Call, x, dim=0, start=None, end=None, step=1):
    dim %= x.rank
    start = 0 if start is None else start
    if isinstance(start, Tensor) or isinstance(end, Tensor):
        return _slice_found(call, x, dim, start, _bound(end), step)
    return call.op("Slice", x, call.dims([start]), call.dims([_bound(end)]),
                   call.ints([dim]), call.ints([step]))


def _slice_found(call: Call, x: Tensor, dim: int, start, end, step: int) -> Tensor:
    """A slice whose bounds are computed at run time (``x[:, a.item():]``, how
    ``tensor_split`` with a tensor of indices is traced): its length is a size found in
    the data, at most the dimension's, so it is a gather of the positions that a mask
    over the dimension selects (NonZeroRows), its count the tracer's symbol."""
    size = x.shape[dim]
    positions = _counting(call, size)
    first, last = (_position(call, v, size) for v in (start, end))
    mask = call.op("And", call.op("GreaterOrEqual", positions, first),
                   call.op("Less", positions, last))
    if step != 1:
        offset = call.op("Mod", call.op("Sub", positions, first),
                         call.const(step, dtypes.int64))
        mask = call.op("And", mask, call.op("Equal", offset, call.const(0, dtypes.int64)))
    rows = _found_rows(call, mask, call.value.shape[dim])
    return call.op("Gather", x, call.op("Squeeze", rows, call.ints([1])), axis=dim)


def _position(call: Call, bound, size: Dim) -> Tensor:
    """A slice bound (a number, or an integer scalar tensor) as an int64 scalar, as
    PyTorch reads it: counted from the end where negative, then clamped to [0, size]."""
    if not isinstance(bound, Tensor):
        return call.op("Squeeze", call.dims([_first_index(size, bound)]), call.ints([0]))
    bound = call.tensor(bound, dtypes.int64)
    length = call.op("Squeeze", call.dims([size]), call.ints([0]))
    zero = call.const(0, dtypes.int64)
    wrapped = call.op("Where", call.op("Less", bound, zero), call.op("Add", bound, length),
                      bound)
    return call.op("Min", call.op("Max", wrapped, zero), length)


COMPARISONS = (operator.ge, operator.gt, operator.le, operator.lt, operator.eq)


def _slice_bound(node: torch.fx.Node) -> bool:
    """Whether ``.item()`` gives an integer that only slices (as a bound) and checks read:
    a size made from it elsewhere (``torch.zeros(n)``) could not be converted, and would
    take the piece around it to eager."""
    return isinstance(node.meta.get("val"), torch.SymInt) and all(
        u.target is torch.ops.aten.slice.Tensor or u.target in COMPARISONS
        for u in node.users)


@aten("_local_scalar_dense.default", claims=_slice_bound)
def _item(call: Call, x):
    """``x.item()`` of an integer tensor: the scalar itself, which a slice takes as a bound
    computed at run time (``_slice_found``)."""
    return call.reshape(x, [])


def _checked_only(node: torch.fx.Node) -> bool:
    """Whether only comparisons read the node's value (the checks of a traced view)."""
    return all(u.target in COMPARISONS for u in node.users)


@aten("sym_storage_offset.default", claims=_checked_only)
def _storage_offset(call: Call, x):
    """Where a view starts in its base's memory, which the graph reads only to check that
    it is not negative: treadle's results are tensors of their own, starting at 0."""
    return call.const(0, dtypes.int64)


@aten("narrow.default")
def _narrow(call: Call, x, dim, start, length):
    dim %= x.rank
    return call.op("Slice", x, call.dims([start]), call.dims([start + length]),
                   call.ints([dim]))


@aten("select.int")
def _select(call: Call, x, dim, index):
    dim %= x.rank
    return call.op("Gather", x, call.const(index, dtypes.int64), axis=dim)


@aten("slice_scatter.default")
def _slice_scatter(call: Call, x, src, dim=0, start=None, end=None, step=1):
    """``x`` with ``src`` written over ``x[start:end:step]`` along ``dim``: how a
    functional program spells a write through a slice (``y[:, :2].clamp_()``)."""
    dim %= x.rank
    return _written(call, x, call.tensor(src, call.dtype), dim,
                    _first_index(x.shape[dim], start), step)


@aten("select_scatter.default")
def _select_scatter(call: Call, x, src, dim, index):
    """``x`` with ``src`` written over ``x.select(dim, index)``: a slice of one."""
    dim %= x.rank
    src = call.op("Unsqueeze", call.tensor(src, call.dtype), call.ints([dim]))
    return _written(call, x, src, dim, _first_index(x.shape[dim], index), 1)


def _first_index(size: Dim, start) -> Dim:
    """Where PyTorch's slice from ``start`` begins: counted from the end where negative,
    clamped to the dimension."""
    start = 0 if start is None else start
    if isinstance(start, int) and start < 0:
        start = size + start
    if isinstance(start, int) and isinstance(size, int):
        return min(max(start, 0), size)
    return minimum(maximum(as_expr(start), 0), as_expr(size))


def _written(call: Call, x: Tensor, src: Tensor, dim: int, start: Dim, step: int) -> Tensor:
    """``x`` with the positions ``start + k * step`` along ``dim`` replaced by ``src``, whose
    length there is the count of ``k``. Contiguous positions are a concatenation of what
    surrounds them with ``src``; strided ones pick from ``src`` or ``x`` by a mask."""
    size, count = x.shape[dim], src.shape[dim]
    if count == 0:
        return call.op("Identity", x)
    if count == size:  # every position (``y[:]`` around a write into ``y[:, 1:]``)
        return call.op("Identity", src)
    if step == 1 or count == 1:
        before = call.op("Slice", x, call.ints([0]), call.dims([start]), call.ints([dim]))
        after = call.op("Slice", x, call.dims([start + count]), call.ints([INT64_MAX]),
                        call.ints([dim]))
        return call.op("Concat", before, src, after, axis=dim)
    if not all(isinstance(v, int) for v in (size, start, count)):
        raise UnsupportedOpError(f"{call.where}: a strided write along a dimension of "
                                 f"symbolic size {size}")
    offset = np.arange(size) - start
    hit = (offset >= 0) & (offset < count * step) & (offset % step == 0)
    picked = call.op("Gather", src, call.ints(np.clip(offset // step, 0, count - 1)),
                     axis=dim)
    along = [1] * dim + [size] + [1] * (x.rank - dim - 1)
    return call.op("Where", call.const(hit.reshape(along), dtypes.boolean), picked, x)


def _along(call: Call, index: Tensor, dim: int, shape: Sequence[Dim]) -> Tensor:
    """A vector ``index`` laid along ``dim`` and expanded to ``shape``: the element-wise
    indices of ScatterElements for ops that name whole slices by their position."""
    along = [1] * dim + [-1] + [1] * (len(shape) - dim - 1)
    return call.op("Expand", call.reshape(index, along), call.dims(shape))


@aten("index_fill.int_Scalar", "index_fill.int_Tensor")
def _index_fill(call: Call, x, dim, index, value):
    """``value`` written at ``index`` (a vector) along ``dim``: a scatter of updates shaped
    as ``x`` with ``dim`` as long as ``index``. A scalar ``x`` fills as a one-element
    vector."""
    if x.rank == 0:
        filled = _index_fill(call, call.reshape(x, [1]), 0, index, value)
        return call.reshape(filled, [])
    dim %= x.rank
    shape = list(x.shape)
    shape[dim] = index.shape[0] if index.rank else 1
    fill = call.op("Expand", call.tensor(value, call.dtype), call.dims(shape))
    return call.op("ScatterElements", x, _along(call, index, dim, shape), fill, axis=dim)


@aten("index_add.default", "index_copy.default")
def _index_add(call: Call, x, dim, index, source, *, alpha=1):
    """``source``'s slices along ``dim`` added to (index_copy: written over) those of ``x``
    at ``index``."""
    source = call.tensor(source, call.dtype)
    if alpha != 1:
        source = call.op("Mul", source, call.const(alpha, call.dtype))
    reduction = "add" if call.node.target._opname == "index_add" else "none"
    # A scalar as a one-element vector.
    x, source = (call.reshape(t, [1]) if t.rank == 0 else t for t in (x, source))
    dim %= x.rank
    y = call.op("ScatterElements", x, _along(call, index, dim, source.shape), source,
                axis=dim, reduction=reduction)
    return call.reshape(y, call.shape) if y.rank != len(call.shape) else y


# PyTorch's scatter reductions as ScatterElements' (a mean is a sum divided by a count).
SCATTER_REDUCE = {"sum": "add", "add": "add", "mean": "add", "prod": "mul",
                  "multiply": "mul", "amax": "max", "amin": "min"}


@aten("scatter.src", "scatter.value", "scatter.reduce", "scatter.value_reduce",
      "scatter_add.default")
def _scatter(call: Call, x, dim, index, src, reduce=None):
    if call.node.target._opname == "scatter_add":
        reduce = "sum"
    reduction = "none" if reduce is None else SCATTER_REDUCE[reduce]
    return _scattered(call, x, dim, index, src, reduction)


@aten("scatter_reduce.two")
def _scatter_reduce(call: Call, x, dim, index, src, reduce, *, include_self=True):
    """Each position of ``x`` that ``index`` names combined with the values aimed at it;
    without ``include_self`` those positions first hold the reduction's identity, so that
    only the values count."""
    if reduce not in SCATTER_REDUCE:
        raise UnsupportedOpError(f"{call.where}: reduction {reduce!r}")
    base = x if include_self else _scattered(call, x, dim, index,
                                             _identity(reduce, call.dtype), "none")
    total = _scattered(call, base, dim, index, src, SCATTER_REDUCE[reduce])
    if reduce != "mean":
        return total
    counted = call.op("Expand", call.const(int(include_self), call.dtype), call.dims(x.shape))
    count = _scattered(call, counted, dim, index, 1, "add")
    # A position nothing was aimed at keeps its value: its count is 0 without include_self.
    return _quotient(call, total, call.op("Max", count, call.const(1, call.dtype)))


def _identity(reduce: str, dtype: DataType):
    """The value that a reduction's result does not change by."""
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    low = -np.inf if dtype.is_float else np.iinfo(dtype.numpy).min
    high = np.inf if dtype.is_float else np.iinfo(dtype.numpy).max
    return low if reduce == "amax" else high


def _scattered(call: Call, x: Tensor, dim: int, index: Tensor, src, reduction: str):
    """ScatterElements of ``src`` (a number, or a tensor at least as large as ``index``)
    into ``x``: PyTorch reads the part of ``src`` that ``index`` covers, where ONNX takes
    the two of one shape. An empty ``index`` writes nothing, whatever its rank; scalars
    scatter as one-element vectors."""
    src = call.tensor(src, call.dtype)
    if 0 in index.shape:
        return call.op("Identity", x)
    if x.rank == 0 or index.rank == 0:
        x_vector, index = (call.reshape(t, [1]) if t.rank == 0 else t for t in (x, index))
        return call.reshape(_scattered(call, x_vector, dim, index, src, reduction), x.shape)
    if src.rank == 0:
        src = call.op("Expand", src, call.dims(index.shape))
    elif list(src.shape) != list(index.shape):
        src = call.op("Slice", src, call.ints([0] * index.rank), call.dims(index.shape),
                      call.ints(range(index.rank)))
    return call.op("ScatterElements", x, index, src, axis=dim % max(x.rank, 1),
                   reduction=reduction)


@aten("masked_scatter.default")
def _masked_scatter(call: Call, x, mask, source):
    """``x`` where ``mask`` holds taking ``source``'s elements in order: the k-th position
    set (counted along the flattened mask) reads ``source``'s k-th element."""
    if 0 in source.shape:  # then no position may be set
        return call.op("Identity", x)
    mask = call.op("Expand", mask, call.dims(call.shape))
    flat = call.tensor(call.reshape(mask, [-1]), dtypes.int64)
    count = call.op("CumSum", flat, call.const(0, dtypes.int64))
    position = call.op("Max", call.op("Sub", count, call.const(1, dtypes.int64)),
                       call.const(0, dtypes.int64))
    picked = call.op("Gather", call.reshape(call.tensor(source, call.dtype), [-1]), position,
                     axis=0)
    return call.op("Where", mask, call.reshape(picked, call.shape), x)


@aten("nonzero.default")
def _nonzero(call: Call, x):
    """The coordinates of ``x``'s non-zero elements, a row each. Their count is a size
    the tracer cannot know (an unbacked symbol): it becomes the symbol that NonZeroRows'
    kernel binds, wherever a later node's shape holds it."""
    return _found_rows(call, x, call.value.shape[0])


def _found_rows(call: Call, mask: Tensor, size) -> Tensor:
    """NonZeroRows of ``mask``, its count standing for ``size``, the tracer's symbol."""
    rows = call.op("NonZeroRows", mask)
    call.importer.bind_found(size, rows.producer)
    return rows


def _masked(call: Call, x: Tensor, at: int, mask: Tensor) -> Tensor:
    """``x[..., mask]`` with the mask over dimensions ``at`` on: the elements (or slices)
    where it is true, in row-major order, their count in place of its dimensions."""
    rows = _found_rows(call, mask, call.value.shape[at])
    covered = list(range(at, at + mask.rank))
    rest = [d for d in range(x.rank) if d not in covered]
    front = x if at == 0 else call.op("Transpose", x, perm=covered + rest)
    picked = call.op("GatherND", front, rows)
    if at == 0:
        return picked
    return call.op("Transpose", picked, perm=[*range(1, at + 1), 0,
                                              *range(at + 1, picked.rank)])


@aten("_unique2.default")
def _unique2(call: Call, x, sorted=True, return_inverse=False, return_counts=False):
    """``torch.unique`` without ``dim``, over the flattened elements. Their order for
    ``sorted=False`` is PyTorch's to choose; ascending is what its CPU kernel gives."""
    return _unique(call, x, None, False, return_inverse, return_counts)


@aten("unique_dim.default")
def _unique_dim(call: Call, x, dim, sorted=True, return_inverse=False, return_counts=False):
    return _unique(call, x, dim, False, return_inverse, return_counts)


@aten("unique_consecutive.default")
def _unique_consecutive(call: Call, x, return_inverse=False, return_counts=False, dim=None):
    return _unique(call, x, dim, True, return_inverse, return_counts)


def _unique(call: Call, x: Tensor, dim: Optional[int], consecutive: bool, inverse: bool,
            counts: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(values, inverse indices, counts) as ATen gives them: a result not asked for is
    empty; over the flattened elements, the inverse indices take ``x``'s shape. The
    count is the tracer's unbacked symbol, which UniqueRows' kernel binds."""
    found = unique.unique(x, dim, True, f"{call.node.name}/unique", consecutive=consecutive)
    size = call.value.shape[0 if dim is None else dim % x.rank]
    call.importer.bind_found(size, found[3].producer)
    empty = call.const(np.zeros(0, np.int64), dtypes.int64)
    where = call.reshape(found[2], x.shape) if dim is None else found[2]
    return found[0], where if inverse else empty, found[3] if counts else empty


@aten("masked_select.default")
def _masked_select(call: Call, x, mask):
    """The elements of ``x`` where ``mask`` is true, both broadcast, as a vector."""
    common = torch.broadcast_shapes(*(a.meta["val"].shape for a in call.node.args[:2]))
    shape = call.dims([call.importer.dim(d) for d in common] or [1])  # scalars as vectors
    return _masked(call, call.op("Expand", x, shape), 0, call.op("Expand", mask, shape))


@aten("index_select.default")
def _index_select(call: Call, x, dim, index):
    # A scalar index selects as a one-element list: the dimension stays.
    index = call.reshape(index, [-1]) if index.rank == 0 else index
    if x.rank > 0:
        return call.op("Gather", x, index, axis=dim % x.rank)
    # From a scalar as from a one-element vector, giving a scalar.
    picked = call.op("Gather", call.reshape(x, [1]), index, axis=0)
    return call.reshape(picked, call.shape)


@dataclass
class Advanced:
    """Advanced indexing ``x[indices]`` as GatherND and ScatterND see it: ``front`` is ``x``
    with the indexed dimensions (``given``) moved to the front, ``where`` the index tensors
    broadcast together (to ``common``) and stacked in a last dimension. PyTorch's
    ``x[indices]`` has the broadcast dimensions in front too, except where the indexed
    dimensions are adjacent and not the first: then they stay in their place (``inside``)."""
    front: Tensor
    where: Tensor
    given: list[int]
    common: list[Dim]

    @property
    def inside(self) -> bool:
        first, last = self.given[0], self.given[-1]
        return first > 0 and self.given == list(range(first, last + 1))

    def torch_perm(self, rank: int) -> list[int]:
        """GatherND's [broadcast..., before, after] as PyTorch's [before, broadcast...,
        after] (for a rank-``rank`` result)."""
        b, p = len(self.common), self.given[0]
        return list(range(b, b + p)) + list(range(b)) + list(range(b + p, rank))


def _advanced(call: Call, x: Tensor, indices: Sequence[Optional[Tensor]]) -> Advanced:
    given = [k for k, t in enumerate(indices) if t is not None]
    if any(indices[k].dtype == dtypes.boolean for k in given):
        raise UnsupportedOpError(f"{call.where}: indexing with a mask beside other "
                                 "indices")
    rest = [k for k in range(x.rank) if k not in given]
    front = x if given == list(range(len(given))) else \
        call.op("Transpose", x, perm=given + rest)
    common = torch.broadcast_shapes(*(call.node.args[1][k].meta["val"].shape for k in given))
    common = [call.importer.dim(d) for d in common]
    columns = [call.op("Unsqueeze", call.op("Expand", indices[k], call.dims(common)),
                       call.ints([-1])) for k in given]
    return Advanced(front, call.op("Concat", *columns, axis=-1), given, common)


@aten("index.Tensor", "_unsafe_index.Tensor")
def _index(call: Call, x, indices):
    """Advanced indexing: elements picked with GatherND (or Gather, for one index)."""
    given = [k for k, t in enumerate(indices) if t is not None]
    if len(given) == 1 and indices[given[0]].dtype == dtypes.boolean:
        return _masked(call, x, given[0], indices[given[0]])
    if len(given) == 1:
        return call.op("Gather", x, indices[given[0]], axis=given[0])
    advanced = _advanced(call, x, indices)
    y = call.op("GatherND", advanced.front, advanced.where)
    if not advanced.inside:
        return y
    return call.op("Transpose", y, perm=advanced.torch_perm(y.rank))


@aten("index_put.default", "_unsafe_index_put.default")
def _index_put(call: Call, x, indices, values, accumulate=False):
    """``x`` with ``values`` written over (or, ``accumulate``, added to) ``x[indices]``:
    ScatterND into ``x`` with the indexed dimensions in front, of the values broadcast to
    ``x[indices]``'s shape and laid out as GatherND would have picked them."""
    values = call.tensor(values, call.dtype)
    if any(t is not None and t.dtype == dtypes.boolean for t in indices):
        return _masked_put(call, x, indices, values, accumulate)
    advanced = _advanced(call, x, indices)
    kept = [x.shape[k] for k in range(x.rank) if k not in advanced.given]
    p = advanced.given[0] if advanced.inside else 0
    picked = kept[:p] + advanced.common + kept[p:]  # x[indices]'s shape
    values = call.op("Expand", _leading(call, values, len(picked)), call.dims(picked))
    if advanced.inside:
        values = call.op("Transpose", values,
                         perm=list(np.argsort(advanced.torch_perm(len(picked)))))
    y = call.op("ScatterND", advanced.front, advanced.where, values,
                reduction="add" if accumulate else "none")
    if advanced.front is x:
        return y
    rest = [k for k in range(x.rank) if k not in advanced.given]
    return call.op("Transpose", y, perm=list(np.argsort(advanced.given + rest)))


def _leading(call: Call, values: Tensor, rank: int) -> Tensor:
    """``values`` with size-1 dimensions added or taken away in front to make ``rank``
    (PyTorch drops leading ones from the values an index assignment writes)."""
    if values.rank <= rank:
        return values
    return call.reshape(values, list(values.shape[values.rank - rank:]))


def _masked_put(call: Call, x: Tensor, indices, values: Tensor, accumulate: bool) -> Tensor:
    """``x[mask] = values`` where the mask is the only index: how many positions it
    selects depends on its contents, so the values must be the same at each of them, and
    the write is a Where."""
    given = [k for k, t in enumerate(indices) if t is not None]
    if len(given) != 1:
        raise UnsupportedOpError(f"{call.where}: a mask beside other index tensors")
    p, mask = given[0], indices[given[0]]
    after = x.rank - p - mask.rank
    # Against x[mask]'s shape [*x.shape[:p], count, *x.shape[p + mask.rank:]].
    values = _leading(call, values, p + 1 + after)
    shape = [1] * (p + 1 + after - values.rank) + list(values.shape)
    if shape[p] != 1:
        raise UnsupportedOpError(f"{call.where}: writing {shape[p]} different values "
                                 "through a mask (only one value per position is supported)")
    values = call.reshape(values, shape[:p] + [1] * mask.rank + shape[p + 1:])
    mask = call.reshape(mask, list(mask.shape) + [1] * after)
    if not accumulate:
        return call.op("Where", mask, values, x)
    return call.op("Add", x, call.op("Where", mask, values, call.const(0, call.dtype)))


@aten("take_along_dim.default")
def _take_along_dim(call: Call, x, index, dim=None):
    """GatherElements after broadcasting ``x`` and ``index`` in all but ``dim`` (without
    one, along the flattened tensors)."""
    if dim is None:
        return call.op("Gather", call.reshape(x, [-1]), call.reshape(index, [-1]), axis=0)
    dim %= x.rank
    given = [list(call.arg_value(k).shape) for k in (0, 1)]
    common = list(torch.broadcast_shapes(*(s[:dim] + [1] + s[dim + 1:] for s in given)))
    x, index = (call.op("Expand", t, call.dims([call.importer.dim(d) for d in
                                                 common[:dim] + [s[dim]] + common[dim + 1:]]))
                for t, s in zip((x, index), given))
    return call.op("GatherElements", x, index, axis=dim)


@aten("diagonal.default", "diagonal_copy.default")
def _diagonal(call: Call, x, offset=0, dim1=0, dim2=1):
    """``x[..., i, i + offset]`` over ``dim1`` and ``dim2``, which become one last
    dimension: GatherND of those two moved to the front."""
    front, where, _ = _diagonal_front(call, x, offset, dim1, dim2, call.shape[-1])
    y = call.op("GatherND", front, where)
    return call.op("Transpose", y, perm=list(range(1, y.rank)) + [0])


@aten("diagonal_scatter.default")
def _diagonal_scatter(call: Call, x, src, offset=0, dim1=0, dim2=1):
    """``x`` with ``src`` written over its diagonal: a write through ``x.diagonal()``."""
    src = call.tensor(src, call.dtype)
    front, where, perm = _diagonal_front(call, x, offset, dim1, dim2, src.shape[-1])
    y = call.op("ScatterND", front, where,
                call.op("Transpose", src, perm=[src.rank - 1] + list(range(src.rank - 1))))
    return call.op("Transpose", y, perm=list(np.argsort(perm)))


def _diagonal_front(call: Call, x: Tensor, offset: int, dim1: int, dim2: int,
                    length: Dim) -> tuple[Tensor, Tensor, list[int]]:
    """``x`` with ``dim1`` and ``dim2`` in front, the [length, 2] positions in them of its
    diagonal, and the permutation that moved them."""
    dim1, dim2 = dim1 % x.rank, dim2 % x.rank
    perm = [dim1, dim2] + [d for d in range(x.rank) if d not in (dim1, dim2)]
    step = _counting(call, length)
    columns = [call.op("Unsqueeze", call.op("Add", step, call.const(start, dtypes.int64)),
                       call.ints([-1])) for start in (max(-offset, 0), max(offset, 0))]
    return (call.op("Transpose", x, perm=perm), call.op("Concat", *columns, axis=-1), perm)


def _counting(call: Call, n: Dim) -> Tensor:
    """The int64 vector 0, 1, ..., n - 1."""
    if isinstance(n, int):
        return call.ints(range(n))
    end = call.op("Squeeze", call.dims([n]), call.ints([0]))
    return call.op("Range", call.const(0, dtypes.int64), end, call.const(1, dtypes.int64))


@aten("flip.default")
def _flip(call: Call, x, dims):
    axes = sorted({d % max(x.rank, 1) for d in dims})
    if not axes or x.rank == 0:
        return call.op("Identity", x)
    # From the last element (-1) back past the first (an end below -size clamps to -1).
    ends = [-INT64_MAX] * len(axes)
    return call.op("Slice", x, call.ints([-1] * len(axes)), call.ints(ends), call.ints(axes),
                   call.ints([-1] * len(axes)))


@aten("gather.default")
def _gather(call: Call, x, dim, index, sparse_grad=False):
    if 0 in index.shape:  # nothing to read, whatever the ranks
        return _filled(call, 0)
    if x.rank and index.rank:
        return call.op("GatherElements", x, index, axis=dim % x.rank)
    # A scalar gathers as a one-element vector.
    x, index = (t if t.rank else call.reshape(t, [1]) for t in (x, index))
    return call.reshape(call.op("GatherElements", x, index, axis=0), call.shape)


@aten("embedding.default")
def _embedding(call: Call, weight, indices, *args):
    return call.op("Gather", weight, indices, axis=0)


@aten("embedding_renorm.default")
def _embedding_renorm(call: Call, weight, indices, max_norm, norm_type):
    """``weight`` with each row that ``indices`` looks up and whose ``norm_type``-norm
    exceeds ``max_norm`` scaled by max_norm / (norm + 1e-7), PyTorch's rule (how
    ``F.embedding(..., max_norm=...)`` writes into its weight): the scales of the rows
    looked up are scattered over ones, so rows not looked up keep theirs."""
    norms = _row_norms(call, weight, norm_type)
    limit = call.const(max_norm, call.dtype)
    ratio = call.op("Div", limit, call.op("Add", norms, call.const(1e-7, call.dtype)))
    factor = call.op("Where", call.op("Greater", norms, limit), ratio,
                     call.const(1, call.dtype))
    rows = call.reshape(indices, [-1])
    ones = call.op("Expand", call.const(1, call.dtype), call.dims(weight.shape[:1]))
    scale = _scattered(call, ones, 0, rows, call.op("Gather", factor, rows, axis=0), "none")
    return call.op("Mul", weight, call.op("Unsqueeze", scale, call.ints([1])))


def _row_norms(call: Call, x: Tensor, p: float) -> Tensor:
    """The ``p``-norm of each row of a matrix, as a vector."""
    axes = call.ints([1])
    if p in (1, 2):
        return call.op(f"ReduceL{int(p)}", x, axes, keepdims=0)
    if p == math.inf:
        return call.op("ReduceMax", call.op("Abs", x), axes, keepdims=0)
    if not p > 0:
        raise UnsupportedOpError(f"{call.where}: norm type {p}")
    powers = call.op("Pow", call.op("Abs", x), call.const(p, x.dtype))
    return call.op("Pow", call.op("ReduceSum", powers, axes, keepdims=0),
                   call.const(1 / p, x.dtype))


@aten("tril.default", "triu.default")
def _triangle(call: Call, x, diagonal=0):
    upper = int(call.node.target is torch.ops.aten.triu.default)
    return call.op("Trilu", x, call.const(diagonal, dtypes.int64), upper=upper)


@aten("cumsum.default", "cumprod.default")
def _running(call: Call, x, dim, dtype=None):
    y = call.tensor(x, call.dtype)
    if y.rank == 0:  # a scalar is its own running sum and product
        return y if y is not x else call.op("Identity", x)
    op = "CumSum" if call.node.target is torch.ops.aten.cumsum.default else "CumProd"
    return call.op(op, y, call.const(dim, dtypes.int64))


@aten("sort.default", "sort.stable")
def _sort(call: Call, x, *args, stable=None, dim=-1, descending=False):
    if call.node.target is torch.ops.aten.sort.default:  # sort(x, dim, descending)
        dim, descending = (list(args) + [dim, descending][len(args):])[:2]
    return _top(call, x, None, dim, descending)


@aten("topk.default")
def _topk(call: Call, x, k, dim=-1, largest=True, sorted=True):
    return _top(call, x, k, dim, largest)


def _top(call: Call, x: Tensor, k, dim: int, largest: bool) -> tuple[Tensor, Tensor]:
    """The ``k`` largest (or smallest) along ``dim``, all of them for k None, and where
    they came from: TopK orders ties by index (a stable sort) and NaN above every number,
    as PyTorch does."""
    if x.rank == 0:
        return call.op("Identity", x), call.const(0, dtypes.int64)
    dim %= x.rank
    count = call.dims([x.shape[dim] if k is None else k])
    return tuple(call.op("TopK", x, count, outputs=2, axis=dim, largest=int(largest)))


@aten("constant_pad_nd.default")
def _constant_pad(call: Call, x, pad, value=0):
    return _pad(call, x, pad, "constant", value)


@aten("pad.default", "reflection_pad1d.default",
      "reflection_pad2d.default", "reflection_pad3d.default", "replication_pad1d.default",
      "replication_pad2d.default", "replication_pad3d.default")
def _pad(call: Call, x, pad, mode="constant", value=None):
    name = call.node.target._opname
    if name.startswith("reflection"):
        mode = "reflect"
    elif name.startswith("replication"):
        mode = "replicate"
    modes = {"constant": "constant", "reflect": "reflect", "replicate": "edge",
             "circular": "wrap"}
    if mode not in modes:
        raise UnsupportedOpError(f"{call.where}: padding mode {mode!r}")
    # PyTorch lists (begin, end) pairs from the last dimension backwards.
    count = len(pad) // 2
    begins = [0] * (x.rank - count) + [pad[2 * k] for k in reversed(range(count))]
    ends = [0] * (x.rank - count) + [pad[2 * k + 1] for k in reversed(range(count))]
    if mode == "replicate" and any(isinstance(p, int) and p < 0 for p in begins + ends):
        return _replicated(call, x, begins, ends)
    inputs = [x, call.dims(begins + ends)]
    if mode == "constant" and value:
        inputs.append(call.const(value, x.dtype))
    return call.op("Pad", *inputs, mode=modes[mode])


def _replicated(call: Call, x: Tensor, begins: Sequence[Dim], ends: Sequence[Dim]) -> Tensor:
    """Replicate padding where a pad is negative (that side cropped), which ONNX's edge
    mode refuses: output position j of a dimension reads the input at j - begin clamped
    into it, PyTorch's rule, as one Gather per padded dimension."""
    for axis, (begin, end) in enumerate(zip(begins, ends)):
        if begin == 0 and end == 0:
            continue
        size = x.shape[axis]
        if not all(isinstance(v, int) for v in (size, begin, end)):
            raise UnsupportedOpError(f"{call.where}: negative replicate padding of a "
                                     f"symbolic size {size}")
        reads = np.clip(np.arange(size + begin + end) - begin, 0, size - 1)
        x = call.op("Gather", x, call.ints(reads), axis=axis)
    return x


# ---- creation --------------------------------------------------------------------------

def _filled(call: Call, value):
    if all(isinstance(d, int) for d in call.shape):
        return constant(held(np.full(call.shape, value), call.dtype), call.node.name,
                        call.dtype)
    if call.dtype == dtypes.bfloat16:  # ConstantOfShape reads its dtype off numpy's
        filled = call.op("ConstantOfShape", call.dims(call.shape),
                         value=np.full(1, value, np.float32))
        return call.op("Cast", filled, to=_onnx(call.dtype))
    return call.op("ConstantOfShape", call.dims(call.shape),
                   value=np.full(1, value, call.dtype.numpy))


@aten("zeros.default", "zeros_like.default", "new_zeros.default", "empty.memory_format",
      "empty_like.default", "new_empty.default")
def _zeros(call: Call, *args, **kwargs):
    return _filled(call, 0)


@aten("ones.default", "ones_like.default", "new_ones.default")
def _ones(call: Call, *args, **kwargs):
    return _filled(call, 1)


@aten("full.default", "full_like.default", "new_full.default")
def _full(call: Call, *args, **kwargs):
    position = 2 if call.node.target._opname == "new_full" else 1  # new_full(x, size, value)
    value = args[position] if len(args) > position else kwargs["fill_value"]
    if isinstance(value, Tensor):
        raise UnsupportedOpError(f"{call.where}: a fill value computed at run time")
    return _filled(call, value)


@aten("fill.Scalar", "zero.default")
def _fill(call: Call, x, value=0):
    return _filled(call, value)


@aten("fill.Tensor")
def _fill_tensor(call: Call, x, value):
    """Every element set to a scalar tensor's value, known or computed."""
    return call.op("Expand", call.tensor(value, call.dtype), call.dims(call.shape))


@aten("scalar_tensor.default")
def _scalar_tensor(call: Call, value, **kwargs):
    return call.const(value, call.dtype)


@aten("arange.default", "arange.start", "arange.start_step")
def _arange(call: Call, *args, **kwargs):
    args = list(args) + [kwargs[k] for k in ("start", "end", "step") if k in kwargs]
    start, end, step = (0, args[0], 1) if len(args) == 1 else \
        (args[0], args[1], args[2] if len(args) > 2 else 1)
    if all(isinstance(v, (int, float)) for v in (start, end, step)):
        return call.const(np.arange(start, end, step), call.dtype)
    return call.op("Range", *(_range_bound(call, v) for v in (start, end, step)))


def _range_bound(call: Call, value) -> Tensor:
    """A bound of ``arange`` as a scalar of its dtype: a number, a symbolic size, or an
    int64 scalar holding a size (one found in the data before the graph)."""
    if isinstance(value, Tensor):
        return call.tensor(call.reshape(value, []), call.dtype)
    if isinstance(value, (int, float)):
        return call.const(value, call.dtype)
    return call.op("Squeeze", call.op("Cast", call.dims([value]), to=_onnx(call.dtype)),
                   call.ints([0]))


# ---- reductions ------------------------------------------------------------------------

def _axes(x: Tensor, dim) -> list[int]:
    if dim is None or dim == []:
        return list(range(x.rank))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return [d % max(x.rank, 1) for d in dims]


def _reduce(op_type: str):
    def convert(call: Call, x, dim=None, keepdim=False, *, dtype=None):
        x = call.tensor(x, call.dtype)
        if x.rank == 0:
            return call.op("Identity", x)
        return call.op(op_type, x, call.ints(_axes(x, dim)), keepdims=int(keepdim))
    return convert


aten("sum.dim_IntList", "sum.default")(_reduce("ReduceSum"))
aten("mean.dim", "mean.default")(_reduce("ReduceMean"))
aten("amax.default")(_reduce("ReduceMax"))
aten("amin.default")(_reduce("ReduceMin"))
aten("prod.dim_int", "prod.default")(_reduce("ReduceProd"))


@aten("any.default", "any.dim", "any.dims", "all.default", "all.dim", "all.dims")
def _any(call: Call, x, dim=None, keepdim=False):
    """Whether any (all) element is true (non-zero): the largest (smallest) of them as
    0 or 1, where the reductions take no bools."""
    flags = call.tensor(call.tensor(x, dtypes.boolean), dtypes.uint8)
    if flags.rank:
        op_type = "ReduceMax" if call.node.target._opname == "any" else "ReduceMin"
        flags = call.op(op_type, flags, call.ints(_axes(flags, dim)), keepdims=int(keepdim))
    return call.tensor(flags, call.dtype)


@aten("max.dim", "min.dim")
def _extreme_dim(call: Call, x, dim, keepdim=False):
    biggest = call.node.target is torch.ops.aten.max.dim
    if x.rank == 0:  # a scalar is its own extreme, at index 0
        x, dim, keepdim = call.reshape(x, [1]), 0, False
    axes = call.ints([dim % x.rank])
    values = call.op("ReduceMax" if biggest else "ReduceMin", x, axes, keepdims=int(keepdim))
    index = call.op("ArgMax" if biggest else "ArgMin", x, axis=dim % x.rank,
                    keepdims=int(keepdim), select_last_index=0)
    return values, index


@aten("max.default", "min.default")
def _extreme(call: Call, x):
    biggest = call.node.target is torch.ops.aten.max.default
    return call.op("ReduceMax" if biggest else "ReduceMin", x, call.ints(_axes(x, None)),
                   keepdims=0)


@aten("argmax.default", "argmin.default")
def _arg_extreme(call: Call, x, dim=None, keepdim=False):
    op_type = "ArgMax" if call.node.target is torch.ops.aten.argmax.default else "ArgMin"
    if dim is None or x.rank == 0:  # over every element, the index shaped as the result
        flat = call.reshape(x, [-1])
        return call.reshape(call.op(op_type, flat, axis=0, keepdims=0), call.shape)
    return call.op(op_type, x, axis=dim % x.rank, keepdims=int(keepdim))


@aten("var.correction", "var.dim", "std.correction", "std.dim")
def _variance(call: Call, x, dim=None, *args, correction=None, keepdim=False):
    if args:  # var.dim(x, dim, unbiased, keepdim)
        unbiased = args[0]
        keepdim = args[1] if len(args) > 1 else keepdim
        correction = 1 if unbiased else 0
    correction = 1 if correction is None else correction
    axes = call.ints(_axes(x, dim))
    mean = call.op("ReduceMean", x, axes, keepdims=1)
    centred = call.op("Sub", x, mean)
    squares = call.op("ReduceSum", call.op("Mul", centred, centred), axes, keepdims=int(keepdim))
    count = math.prod(x.shape[a] for a in _axes(x, dim))
    if not isinstance(count, int):
        raise UnsupportedOpError(f"{call.where}: variance over a symbolic count")
    var = call.op("Div", squares, call.const(max(count - correction, 0), x.dtype))
    std = call.node.target._opname == "std"
    return call.op("Sqrt", var) if std else var


def _window(values, spatial: int) -> list[int]:
    values = [values] if isinstance(values, int) else list(values)
    return values * spatial if len(values) == 1 else values


# ---- linear algebra --------------------------------------------------------------------

@aten("mm.default", "bmm.default", "matmul.default", "mv.default", "dot.default")
def _matmul(call: Call, a, b):
    return call.op("MatMul", a, b)


@aten("addmm.default")
def _addmm(call: Call, bias, a, b, *, beta=1, alpha=1):
    return call.op("Gemm", a, b, bias, alpha=float(alpha), beta=float(beta))


@aten("baddbmm.default")
def _baddbmm(call: Call, bias, a, b, *, beta=1, alpha=1):
    product = call.op("MatMul", a, b)
    if alpha != 1:
        product = call.op("Mul", product, call.const(alpha, call.dtype))
    if beta == 0:
        return product
    if beta != 1:
        bias = call.op("Mul", bias, call.const(beta, call.dtype))
    return call.op("Add", product, bias)


@aten("linear.default")
def _linear(call: Call, x, weight, bias=None):
    if x.rank == 2:
        return call.op("Gemm", x, weight, *([bias] if bias is not None else []), transB=1)
    y = call.op("MatMul", x, call.op("Transpose", weight, perm=[1, 0]))
    return y if bias is None else call.op("Add", y, bias)


@aten("linalg_inv_ex.default")
def _inverse(call: Call, a, *, check_errors=False):
    """Each matrix's inverse and LAPACK's info (0 where it is invertible)."""
    if check_errors:  # an exception from a singular matrix's info, which kernels lack
        raise UnsupportedOpError(f"{call.where}: check_errors")
    return tuple(call.op("Inverse", a, outputs=2))


@aten("convolution.default", "conv1d.default", "conv2d.default", "conv3d.default",
      "_convolution.default")
def _convolution(call: Call, x, weight, bias=None, stride=1, padding=0, dilation=1,
                 *rest):
    transposed, output_padding, groups = False, 0, 1
    if call.node.target._opname in ("convolution", "_convolution"):
        transposed, output_padding, groups = rest[:3]
    elif rest:
        groups = rest[0]
    return _conv(call, x, weight, bias, stride, padding, dilation, groups,
                 output_padding if transposed else None)


@aten("conv_transpose1d.default", "conv_transpose2d.input", "conv_transpose3d.input")
def _conv_transpose(call: Call, x, weight, bias=None, stride=1, padding=0, output_padding=0,
                    groups=1, dilation=1):
    return _conv(call, x, weight, bias, stride, padding, dilation, groups, output_padding)


def _conv(call: Call, x, weight, bias, stride, padding, dilation, groups, output_padding):
    """Conv, or ConvTranspose where ``output_padding`` is given (torch's transposed
    convolution takes away ``padding`` from both ends of its output, as ONNX's pads do)."""
    spatial = x.rank - 2
    if isinstance(padding, str):
        raise UnsupportedOpError(f"{call.where}: padding {padding!r} (give sizes)")
    pads = _window(padding, spatial)
    inputs = [x, weight] + ([bias] if bias is not None else [])
    attrs = dict(strides=_window(stride, spatial), pads=pads + pads,
                 dilations=_window(dilation, spatial), group=groups)
    if output_padding is None:
        return call.op("Conv", *inputs, **attrs)
    return call.op("ConvTranspose", *inputs, output_padding=_window(output_padding, spatial),
                   **attrs)


# ---- normalisation ---------------------------------------------------------------------

def _ones_if_none(call: Call, value: Optional[Tensor], size: Dim, fill: float) -> Tensor:
    if value is not None:
        return value
    if not isinstance(size, int):
        raise UnsupportedOpError(f"{call.where}: a symbolic channel count without weights")
    return call.const(np.full(size, fill), call.dtype)


@aten("native_layer_norm.default", "layer_norm.default")
def _layer_norm(call: Call, x, shape, weight=None, bias=None, eps=1e-5, *rest):
    if weight is None and all(isinstance(d, int) for d in shape):
        weight = call.const(np.ones(shape), call.dtype)
    outputs = 3 if call.node.target._opname == "native_layer_norm" else 1
    results = call.op("LayerNormalization", x, weight, bias, axis=x.rank - len(shape),
                      epsilon=float(eps), outputs=outputs)
    return results if outputs == 1 else tuple(results)  # (y, mean, 1 / std)


@aten("_native_batch_norm_legit_no_training.default", "batch_norm.default",
      "_native_batch_norm_legit.default", "native_batch_norm.default")
def _batch_norm(call: Call, x, weight, bias, mean, var, *args):
    name = call.node.target._opname
    if name == "batch_norm":  # (training, momentum, eps, cudnn)
        training, eps = args[0], args[2]
    elif name == "_native_batch_norm_legit_no_training":  # (momentum, eps)
        training, eps = False, args[1]
    else:  # (training, momentum, eps)
        training, eps = args[0], args[2]
    if training and mean is None and var is None:
        y, mean, _, inv = _batch_stats(call, x, weight, bias, eps)
        return y if name == "batch_norm" else (y, mean, inv)
    if training:  # a functional graph has the _functional overload for this
        raise UnsupportedOpError(f"{call.where}: batch normalization in training mode "
                                 "writing its running statistics")
    channels = x.shape[1]
    y = call.op("BatchNormalization", x, _ones_if_none(call, weight, channels, 1.0),
                _ones_if_none(call, bias, channels, 0.0), mean, var, epsilon=float(eps))
    if name == "batch_norm":
        return y
    empty = call.const(np.zeros(0), call.dtype)
    return y, empty, empty


@aten("instance_norm.default")
def _instance_norm(call: Call, x, weight, bias, mean, var, use_input_stats, momentum, eps,
                   *rest):
    if not use_input_stats:
        return _batch_norm(call, x, weight, bias, mean, var, False, momentum, eps)
    channels = x.shape[1]
    return call.op("InstanceNormalization", x, _ones_if_none(call, weight, channels, 1.0),
                   _ones_if_none(call, bias, channels, 0.0), epsilon=float(eps))


@aten("_native_batch_norm_legit.no_stats")
def _instance_stats(call: Call, x, weight, bias, training, momentum, eps):
    """Batch statistics without running ones: per channel over batch and space. Export
    writes instance normalization this way after folding the batch into channels."""
    y, mean, _, inv = _batch_stats(call, x, weight, bias, eps)
    return y, mean, inv


@aten("_native_batch_norm_legit_functional.default")
def _batch_norm_functional(call: Call, x, weight, bias, running_mean, running_var,
                           training, momentum, eps):
    """Batch normalization whose running statistics' update is a result rather than a
    write: (y, save_mean, save_invstd, new running_mean, new running_var). Training
    normalises by the batch's statistics and moves the running ones ``momentum`` of the
    way towards them, the variance there unbiased (times n / (n - 1), n elements a
    channel) as ATen's is."""
    if not training:
        y, empty, _ = _batch_norm(call, x, weight, bias, running_mean, running_var, False,
                                  momentum, eps)
        return y, empty, empty, running_mean, running_var
    y, mean, var, inv = _batch_stats(call, x, weight, bias, eps)
    count = call.op("Cast", call.dims([num_elements([x.shape[0], *x.shape[2:]])]),
                    to=_onnx(var.dtype))
    unbiased = call.op("Div", call.op("Mul", var, count),
                       call.op("Sub", count, call.const(1, var.dtype)))
    return (y, mean, inv, _momentum(call, running_mean, mean, momentum),
            _momentum(call, running_var, unbiased, momentum))


def _momentum(call: Call, running: Tensor, batch: Tensor, momentum: float) -> Tensor:
    """The running statistic moved ``momentum`` of the way towards the batch's."""
    return call.op("Add", call.op("Mul", batch, call.const(momentum, batch.dtype)),
                   call.op("Mul", running, call.const(1 - momentum, running.dtype)))


def _batch_stats(call: Call, x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                 eps: float) -> tuple[Tensor, ...]:
    """``x`` normalised per channel by its statistics over batch and space, then the
    channels' means, biased variances and reciprocal standard deviations."""
    mean, var = _mean_var(call, x, [0] + list(range(2, x.rank)))
    inv = _inverse_std(call, var, eps)
    y = _affine(call, call.op("Mul", call.op("Sub", x, mean), inv), weight, bias)
    return (y, *(call.reshape(t, [-1]) for t in (mean, var, inv)))


def _moments(call: Call, x: Tensor, axes: list[int], eps: float) -> tuple[Tensor, Tensor]:
    """The mean of ``x`` over ``axes`` and its reciprocal (biased) standard deviation,
    both with the axes kept as size 1."""
    mean, var = _mean_var(call, x, axes)
    return mean, _inverse_std(call, var, eps)


def _mean_var(call: Call, x: Tensor, axes: list[int]) -> tuple[Tensor, Tensor]:
    """The mean of ``x`` over ``axes`` and its biased variance, the axes kept as size 1."""
    axes = call.ints(axes)
    mean = call.op("ReduceMean", x, axes, keepdims=1)
    centred = call.op("Sub", x, mean)
    return mean, call.op("ReduceMean", call.op("Mul", centred, centred), axes, keepdims=1)


def _inverse_std(call: Call, var: Tensor, eps: float) -> Tensor:
    eps = call.const(eps, var.dtype)
    return call.op("Reciprocal", call.op("Sqrt", call.op("Add", var, eps)))


def _affine(call: Call, y: Tensor, weight: Optional[Tensor], bias: Optional[Tensor]):
    """``y`` scaled and shifted per channel (its dimension 1) where weights are given."""
    shape = [-1] + [1] * (y.rank - 2)
    if weight is not None:
        y = call.op("Mul", y, call.reshape(weight, shape))
    if bias is not None:
        y = call.op("Add", y, call.reshape(bias, shape))
    return y


@aten("group_norm.default", "native_group_norm.default")
def _group_norm(call: Call, x, *args):
    if call.node.target._opname == "group_norm":  # (groups, weight, bias, eps, cudnn)
        groups, weight, bias = args[0], *(list(args[1:3]) + [None, None])[:2]
        eps = args[3] if len(args) > 3 else 1e-5
    else:  # (weight, bias, N, C, HxW, groups, eps)
        weight, bias, groups, eps = args[0], args[1], args[5], args[6]
    channels = x.shape[1]
    weight, bias = (call.const(np.full(channels, v), x.dtype) if t is None else t
                    for t, v in ((weight, 1.0), (bias, 0.0)))
    # PyTorch normalises [N, C] too, ONNX from rank 3: a trailing axis of one element.
    flat = x.rank == 2
    y = call.op("GroupNormalization", call.reshape(x, [*x.shape, 1]) if flat else x, weight,
                bias, num_groups=int(groups), epsilon=float(eps))
    y = call.reshape(y, x.shape) if flat else y
    if call.node.target._opname == "group_norm":
        return y
    # The statistics per [N, G] (dropped with the graph's unread tensors when unused), of
    # rows [N, G, C/G * spatial].
    rows = call.reshape(x, [x.shape[0], groups, channels // groups * math.prod(x.shape[2:])])
    mean, inv = _moments(call, rows, [2], eps)
    stats = [x.shape[0], groups]
    return y, call.reshape(mean, stats), call.reshape(inv, stats)


def _softmax_like(op_type: str):
    def convert(call: Call, x, dim, *rest, **kwargs):
        x = call.tensor(x, call.dtype)
        if x.rank:
            return call.op(op_type, x, axis=dim % x.rank)
        # A scalar as a one-element vector.
        return call.reshape(call.op(op_type, call.reshape(x, [1]), axis=0), [])
    return convert


aten("_softmax.default", "softmax.int")(_softmax_like("Softmax"))
aten("_log_softmax.default", "log_softmax.int")(_softmax_like("LogSoftmax"))


@aten("_safe_softmax.default")
def _safe_softmax(call: Call, x, dim, dtype=None):
    """Softmax whose rows of only -inf give zeros (masked-out queries) rather than NaN."""
    x = call.tensor(x, call.dtype)
    axis = dim % max(x.rank, 1)
    y = call.op("Softmax", x, axis=axis)
    peak = call.op("ReduceMax", x, call.ints([axis]), keepdims=1)
    masked = call.op("Equal", peak, call.const(-np.inf, x.dtype))
    return call.op("Where", masked, call.const(0, x.dtype), y)


# torch defines the chunked ``F.linear_cross_entropy`` ops in Python and imports the
# module at their first call; a torch without it has no such ops.
with contextlib.suppress(ImportError):
    import torch.nn.modules.linear_cross_entropy  # noqa: F401


@aten("torch_nn::_linear_cross_entropy_batch_chunked.default")
def _chunked_cross_entropy(call: Call, x, linear_weight, target, linear_bias, weight,
                           reduction, ignore_index, label_smoothing, chunk_size, acc_policy,
                           acc_dtype, retain_graph, *gradients):
    """``F.linear_cross_entropy`` with chunking options and a mean or sum: the loss, and
    the gradients it computes ahead where ``gradients`` asks (then they are empty, where
    the graph serves inference, or the op is refused). Chunks only bound eager's memory:
    the loss is linear then cross entropy, as one graph."""
    if label_smoothing or any(gradients):
        raise UnsupportedOpError(f"{call.where}: label smoothing or gradients precomputed "
                                 "for training")
    loss = _class_cross_entropy(call, x, linear_weight, target, linear_bias, weight,
                                reduction, ignore_index)
    empty = [call.const(np.zeros(v.shape), call.dtype) for v in call.node.meta["val"][1:]]
    return (loss, *empty)


@aten("torch_nn::_linear_cross_entropy_batch_chunked_no_reduction.default")
def _chunked_cross_entropy_none(call: Call, x, linear_weight, target, linear_bias, weight,
                                ignore_index, *options):
    """The chunked op's per-sample losses (``reduction='none'``); the chunking ``options``
    change only eager's memory."""
    return _class_cross_entropy(call, x, linear_weight, target, linear_bias, weight, "none",
                                ignore_index)


def _class_cross_entropy(call: Call, x: Tensor, linear_weight: Tensor, target: Tensor,
                         bias: Optional[Tensor], weight: Optional[Tensor], reduction: str,
                         ignore_index: int) -> Tensor:
    """Cross entropy of ``x @ linear_weight.T + bias`` ([N, C]) against class indices
    ([N]): row n loses -log_softmax[n, target[n]] times its class's weight, 0 where the
    target is ``ignore_index``; a mean divides by the weights counted (0 / 0 = NaN where
    none is)."""
    logits = call.tensor(_linear(call, x, linear_weight, bias), call.dtype)
    ignored = call.op("Equal", target, call.const(ignore_index, target.dtype))
    classes = call.op("Where", ignored, call.const(0, target.dtype), target)
    picked = call.op("GatherElements", call.op("LogSoftmax", logits, axis=1),
                     call.op("Unsqueeze", classes, call.ints([1])), axis=1)
    counted = call.op("Gather", call.tensor(weight, call.dtype), classes, axis=0) \
        if weight is not None else call.op("Expand", call.const(1, call.dtype),
                                           call.dims(target.shape))
    counted = call.op("Where", ignored, call.const(0, call.dtype), counted)
    losses = call.op("Mul", call.op("Neg", call.op("Squeeze", picked, call.ints([1]))),
                     counted)
    if reduction == "none":
        return losses
    total = call.op("ReduceSum", losses, call.ints([0]), keepdims=0)
    if reduction == "sum":
        return total
    return call.op("Div", total, call.op("ReduceSum", counted, call.ints([0]), keepdims=0))


@aten("scaled_dot_product_attention.default")
def _attention(call: Call, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *,
               scale=None, enable_gqa=False):
    if dropout_p:
        raise UnsupportedOpError(f"{call.where}: attention dropout")
    if q.rank == 3:  # [batch, length, features] as one head, where Attention would split
        heads = [call.op("Unsqueeze", t, call.ints([0])) for t in (q, k, v)]
        y = _attention(call, *heads, attn_mask, dropout_p, is_causal, scale=scale)
        return call.op("Squeeze", y, call.ints([0]))
    if q.rank != 4:
        raise UnsupportedOpError(f"{call.where}: attention over rank-{q.rank} tensors")
    attrs = {"is_causal": int(is_causal)}
    if scale is not None:
        attrs["scale"] = float(scale)
    inputs = [q, k, v] + ([attn_mask] if attn_mask is not None else [])
    return call.op("Attention", *inputs, **attrs)


@aten("_scaled_dot_product_flash_attention_for_cpu.default")
def _cpu_flash_attention(call: Call, q, k, v, dropout_p=0.0, is_causal=False, *,
                         attn_mask=None, scale=None):
    """The kernel AOTAutograd picks for 4-D attention on CPU; its second result, the
    log-sum-exp per query, serves training."""
    y = _attention(call, q, k, v, attn_mask, dropout_p, is_causal, scale=scale)
    return call.first_only(y, "attention's log-sum-exp results")


# ---- pooling and resampling ------------------------------------------------------------

@aten("max_pool2d.default", "max_pool1d.default", "max_pool3d.default",
      "max_pool2d_with_indices.default", "max_pool3d_with_indices.default")
def _max_pool(call: Call, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    spatial = _spatial(call)
    kernel = _window(kernel, spatial)
    stride = _window(stride, spatial) if stride else kernel
    pads = _window(padding, spatial)
    attrs = dict(kernel_shape=kernel, strides=stride, pads=pads + pads,
                 dilations=_window(dilation, spatial), ceil_mode=int(ceil_mode))
    if "with_indices" not in call.node.target._opname:
        return _batched(call, x, lambda b: call.op("MaxPool", b, **attrs))
    # ONNX counts a maximum's position over the whole tensor, PyTorch within its plane.
    unbatched = x.rank == spatial + 1
    b = call.op("Unsqueeze", x, call.ints([0])) if unbatched else x
    y, flat = call.op("MaxPool", b, outputs=2, **attrs)
    indices = call.op("Mod", flat, call.dims([num_elements(x.shape[-spatial:])]))
    if unbatched:
        return tuple(call.op("Squeeze", t, call.ints([0])) for t in (y, indices))
    return y, indices


@aten("avg_pool2d.default", "avg_pool1d.default", "avg_pool3d.default")
def _avg_pool(call: Call, x, kernel, stride=(), padding=0, ceil_mode=False,
              count_include_pad=True, divisor_override=None):
    spatial = _spatial(call)
    kernel = _window(kernel, spatial)
    stride = _window(stride, spatial) if stride else kernel
    pads = _window(padding, spatial)
    if divisor_override is not None:  # each window's sum over the divisor
        y = _whole_window_means(call, x, kernel, stride, pads, ceil_mode)
        return call.op("Mul", y, call.const(math.prod(kernel) / divisor_override, x.dtype))
    return _batched(call, x, lambda b: call.op(
        "AveragePool", b, kernel_shape=kernel, strides=stride, pads=pads + pads,
        ceil_mode=int(ceil_mode), count_include_pad=int(count_include_pad)))


def _whole_window_means(call: Call, x: Tensor, kernel: list[int], stride: list[int],
                        pads: list[int], ceil_mode: bool) -> Tensor:
    """Each window's sum divided by the kernel's size, padding and all: ``x`` padded with
    zeros explicitly, so that no window is cut short. In ceil mode the last window may
    hang past the padding, so the right side takes stride - 1 more, and the result is cut
    to the node's size (where PyTorch drops a last window starting in the right padding)."""
    count = len(kernel)
    right = [p + (s - 1 if ceil_mode else 0) for p, s in zip(pads, stride)]

    def pool(b: Tensor) -> Tensor:
        lead = [0] * (b.rank - count)
        padded = call.op("Pad", b, call.ints(lead + pads + lead + right))
        return call.op("AveragePool", padded, kernel_shape=kernel, strides=stride)
    y = _batched(call, x, pool)
    if not ceil_mode:
        return y
    return call.op("Slice", y, call.ints([0] * count), call.dims(call.shape[-count:]),
                   call.ints(list(range(-count, 0))))


@aten("adaptive_avg_pool2d.default", "_adaptive_avg_pool2d.default",
      "adaptive_avg_pool1d.default", "adaptive_avg_pool3d.default",
      "_adaptive_avg_pool3d.default", "adaptive_max_pool2d.default",
      "adaptive_max_pool3d.default")
def _adaptive_pool(call: Call, x, output_size):
    biggest = call.node.target._opname.startswith("adaptive_max")
    indices = biggest and call.reads_rest
    count = _spatial(call)
    spatial, out = list(x.shape[-count:]), _window(output_size, count)
    if all(o == 1 for o in out) and not indices:
        y = _batched(call, x, lambda b: call.op(
            "GlobalMaxPool" if biggest else "GlobalAveragePool", b))
        return (y, None) if biggest else y
    if not all(isinstance(s, int) for s in spatial):
        raise UnsupportedOpError(f"{call.where}: adaptive pooling of symbolic sizes {spatial}")
    if indices or any(s % o for s, o in zip(spatial, out)):
        if biggest:
            return _adaptive_max(call, x, spatial, out)
        return _uneven_average(call, x, spatial, out)
    kernel = [s // o for s, o in zip(spatial, out)]
    y = _batched(call, x, lambda b: call.op(
        "MaxPool" if biggest else "AveragePool", b, kernel_shape=kernel, strides=kernel))
    return (y, None) if biggest else y


def _adaptive_windows(size: int, count: int) -> list[tuple[int, int]]:
    """PyTorch's adaptive pooling windows, (start, end): window i of ``count`` over
    ``size`` elements spans floor(i * size / count) to the ceiling of (i+1) * size / count."""
    return [(i * size // count, -(-(i + 1) * size // count)) for i in range(count)]


def _uneven_average(call: Call, x: Tensor, spatial: list[int], out: list[int]) -> Tensor:
    """Adaptive average pooling whose windows differ in size, one dimension at a time (a
    box's mean is the mean of its rows' means) as products with constant weights: the
    last dimension as x @ W, one before it as W^T @ x with the dimensions after it
    flattened into one."""
    for k, (size, count) in enumerate(zip(spatial, out)):
        weights = np.zeros((size, count))
        for i, (start, end) in enumerate(_adaptive_windows(size, count)):
            weights[start:end, i] = 1 / (end - start)
        if k == len(spatial) - 1:
            x = call.op("MatMul", x, call.const(weights, x.dtype))
            continue
        before, after = x.shape[:k - len(spatial)], x.shape[k + 1 - len(spatial):]
        rows = call.reshape(x, [*before, size, math.prod(after)])
        x = call.reshape(call.op("MatMul", call.const(weights.T, x.dtype), rows),
                         [*before, count, *after])
    return x


def _adaptive_max(call: Call, x: Tensor, spatial: list[int], out: list[int]
                  ) -> tuple[Tensor, Tensor]:
    """Adaptive max pooling and its indices as ATen has them, the position within the
    plane of each channel (the first of equal maxima): every window's elements gathered
    from the flattened plane, then their maximum and where it stands."""
    table = _window_table(spatial, out)
    lead = list(x.shape[:-len(spatial)])
    plane = call.reshape(x, [*lead, math.prod(spatial)])
    windows = call.op("Gather", plane, call.const(table, dtypes.int64), axis=len(lead))
    y = call.op("ReduceMax", windows, call.ints([-1]), keepdims=0)
    place = call.op("ArgMax", windows, axis=len(lead) + 1, keepdims=0)
    starts = call.const(np.arange(len(table)) * table.shape[1], dtypes.int64)
    indices = call.op("Gather", call.const(table.reshape(-1), dtypes.int64),
                      call.op("Add", place, starts), axis=0)
    return call.reshape(y, [*lead, *out]), call.reshape(indices, [*lead, *out])


def _window_table(spatial: list[int], out: list[int]) -> np.ndarray:
    """[windows, width]: the flat positions in the plane of each adaptive window's
    elements, windows and their elements in row-major order. A window narrower than the
    widest repeats its last element along each dimension: it changes neither the maximum
    nor where it first occurs, as a repeat comes after the element it repeats."""
    rank, flat = len(spatial), np.zeros((), np.int64)
    strides = [math.prod(spatial[d + 1:]) for d in range(rank)]
    for d, (size, count) in enumerate(zip(spatial, out)):
        windows = _adaptive_windows(size, count)
        width = max(end - start for start, end in windows)
        positions = np.array([[min(start + j, end - 1) for j in range(width)]
                              for start, end in windows])
        shape = [1] * (2 * rank)
        shape[d], shape[rank + d] = count, width
        flat = flat + positions.reshape(shape) * strides[d]
    return flat.reshape(math.prod(out), -1)


def _spatial(call: Call) -> int:
    """How many spatial dimensions a pooling op's name says it pools (max_pool2d: 2)."""
    return int(re.search(r"(\d)d", call.node.target._opname).group(1))


def _batched(call: Call, x: Tensor, pool: Callable[[Tensor], Tensor]) -> Tensor:
    """``pool`` applied to ``x``, which PyTorch also takes unbatched ([C, *spatial]) where
    ONNX's pools need [N, C, *spatial]."""
    if x.rank > _spatial(call) + 1:
        return pool(x)
    return call.op("Squeeze", pool(call.op("Unsqueeze", x, call.ints([0]))), call.ints([0]))


@aten("upsample_nearest2d.vec", "upsample_nearest2d.default", "upsample_nearest1d.vec",
      "upsample_bilinear2d.vec", "upsample_bilinear2d.default", "upsample_linear1d.vec",
      "_upsample_nearest_exact2d.vec")
def _upsample(call: Call, x, output_size, *args):
    name = call.node.target._opname
    attrs = {"mode": "nearest"}
    if "nearest" in name:
        exact = "exact" in name
        attrs["coordinate_transformation_mode"] = "half_pixel" if exact else "asymmetric"
        attrs["nearest_mode"] = "round_prefer_ceil" if exact else "floor"
    else:
        align = args[0]
        attrs["mode"] = "linear"
        attrs["coordinate_transformation_mode"] = "align_corners" if align \
            else "pytorch_half_pixel"
    scales = args[-1] if args and isinstance(args[-1], (list, tuple)) else None
    if output_size is None and scales:
        # Given factors (not sizes) map coordinates: PyTorch and ONNX both divide by them.
        factors = call.const([1.0, 1.0] + [float(f) for f in scales], dtypes.float32)
        return call.op("Resize", x, None, factors, **attrs)
    return call.op("Resize", x, None, None, call.dims(list(call.shape)), **attrs)


GRID_MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
GRID_PADDING = {0: "zeros", 1: "border", 2: "reflection"}


@aten("grid_sampler_2d.default", "grid_sampler.default")
def _grid_sample(call: Call, x, grid, mode, padding, align_corners):
    """``F.grid_sample``: ONNX's GridSample, whose modes and paddings torch numbers."""
    return call.op("GridSample", x, grid, mode=GRID_MODES.get(mode, str(mode)),
                   padding_mode=GRID_PADDING.get(padding, str(padding)),
                   align_corners=int(align_corners))


@aten("pixel_shuffle.default")
def _pixel_shuffle(call: Call, x, factor):
    return call.op("DepthToSpace", x, blocksize=factor, mode="CRD")


# ---- recurrent layers ------------------------------------------------------------------

@dataclass(frozen=True)
class Recurrent:
    """A torch recurrent layer as the ONNX operator: its op, the ONNX gate order as the
    positions of torch's gates (LSTM i f g o -> i o f c, GRU r z n -> z r h), and the
    attributes that differ from ONNX's defaults: torch's GRU resets R's product, not the
    state it multiplies."""
    op: str
    gates: tuple[int, ...]
    attrs: tuple[tuple[str, object], ...] = ()


RECURRENT = {"lstm": Recurrent("LSTM", (0, 3, 1, 2)),
             "gru": Recurrent("GRU", (1, 0, 2), (("linear_before_reset", 1),)),
             "rnn_tanh": Recurrent("RNN", (0,)),
             "rnn_relu": Recurrent("RNN", (0,), (("activations", ("Relu",)),))}


@aten("lstm.input", "gru.input", "rnn_tanh.input", "rnn_relu.input")
def _recurrent(call: Call, x, hx, params, has_biases, num_layers, dropout, train,
               bidirectional, batch_first):
    """A whole stack of layers, one ONNX node each (layout 1 when batch first), over the
    sequence length as it came (symbolic, where torch left it so); the states' [layers *
    directions, batch, hidden] are sliced into each layer's, and its final ones
    concatenated back. Packed sequences (``lstm.data``) have no converter."""
    kind = RECURRENT[call.node.target._opname]
    dirs = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    if train and dropout:
        raise UnsupportedOpError(f"{call.where}: dropout between layers in training mode")
    if len(params) != num_layers * dirs * per:
        raise UnsupportedOpError(f"{call.where}: {len(params)} weights for {num_layers} "
                                 f"layer(s); projections (proj_size) are not supported")
    states = list(hx) if isinstance(hx, (list, tuple)) else [hx]
    finals: list[list[Tensor]] = [[] for _ in states]
    for layer in range(num_layers):
        weights = params[layer * dirs * per:(layer + 1) * dirs * per]
        outputs = _recurrent_layer(call, kind, x, weights, per, [
            _layer_state(call, s, layer, dirs, batch_first) for s in states], batch_first)
        x = _layer_output(call, outputs[0], batch_first)
        for final, state in zip(finals, outputs[1:]):
            final.append(call.op("Transpose", state, perm=[1, 0, 2]) if batch_first else state)
    return (x, *(call.op("Concat", *final, axis=0) for final in finals))


def _recurrent_layer(call: Call, kind: Recurrent, x: Tensor, weights: Sequence[Tensor],
                     per: int, states: list[Tensor], batch_first: bool) -> list[Tensor]:
    """One layer's node: W, R and B stacked by direction in ONNX's gate order."""
    dirs = len(weights) // per
    hidden = weights[1].shape[1]

    def stacked(k: int) -> Tensor:
        return call.op("Concat", *(call.op("Unsqueeze", _onnx_gates(call, kind, w, hidden),
                                           call.ints([0]))
                                   for w in weights[k::per]), axis=0)
    bias = call.op("Concat", stacked(2), stacked(3), axis=1) if per == 4 else None
    direction = "bidirectional" if dirs == 2 else "forward"
    attrs = {key: list(value) * dirs if key == "activations" else value
             for key, value in kind.attrs}
    count = 3 if kind.op == "LSTM" else 2
    return call.op(kind.op, x, stacked(0), stacked(1), bias, None, *states, outputs=count,
                   hidden_size=hidden, direction=direction, layout=int(batch_first), **attrs)


def _onnx_gates(call: Call, kind: Recurrent, w: Tensor, hidden: int) -> Tensor:
    """Torch's rows of gates (weights or a bias) in ONNX's order."""
    if len(kind.gates) == 1:
        return w
    rows = [g * hidden + j for g in kind.gates for j in range(hidden)]
    return call.op("Gather", w, call.ints(rows), axis=0)


def _layer_state(call: Call, state: Tensor, layer: int, dirs: int, batch_first: bool
                 ) -> Tensor:
    """A layer's initial state from torch's [layers * directions, batch, hidden], batch
    first for layout 1."""
    own = call.op("Gather", state, call.ints(range(layer * dirs, (layer + 1) * dirs)), axis=0)
    return call.op("Transpose", own, perm=[1, 0, 2]) if batch_first else own


def _layer_output(call: Call, y: Tensor, batch_first: bool) -> Tensor:
    """ONNX's Y ([seq, directions, batch, hidden], or [batch, seq, directions, hidden]) as
    torch's output, the directions side by side in each row."""
    if not batch_first:
        y = call.op("Transpose", y, perm=[0, 2, 1, 3])
    return call.op("Reshape", y, call.ints([0, 0, -1]))
