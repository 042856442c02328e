"""What the GEMM template recognises: a sum of products of two operands, and the roles of
its axes.

``match_gemm`` reads the roles off the compute definition: output axes that only the left
factor uses are M, only the right factor N, both "batch"; the reduce axes are K. The
template never learns which operator it serves (MatMul, Gemm, batched matmul,
convolution): it evaluates the factors at unravelled positions, so a convolution's im2col
addressing happens where panels are packed and no im2col buffer exists.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Collection, Sequence

from treadle.ir.builder import FunctionBuilder
from treadle.ir.compute import Compute, producer_of, reachable
from treadle.ir.dtypes import DataType, float32, int8, int32, uint8
from treadle.ir.expr import Binary, Buffer, Cast, Const, Expr, Load, Var, cast, maximum, minimum
from treadle.ir.functor import free_vars, rewrite, substitute, walk
from treadle.ir.tabulate import tabulable
from treadle.schedule.rules import Inliner

if TYPE_CHECKING:
    from treadle.schedule.templates.gemm.words import Words

ROLES = ("batch", "m", "n", "k")


@dataclass(frozen=True)
class GemmPattern:
    compute: Compute
    left: Expr
    right: Expr
    batch_axes: tuple[Var, ...]
    m_axes: tuple[Var, ...]
    n_axes: tuple[Var, ...]
    # An element-wise compute applied to each result before it is stored (a bias, a
    # rounding cast), which reads the product at its own index.
    epilogue: Compute | None = None
    # The right factor reads only constants (weights): its panels are laid out once, at
    # compile time, instead of packed by every call (see with_constants).
    constant_right: bool = False
    # The operator's input buffers (None where an input is not a tensor) and its run-time
    # conditions on symbolic sizes, which the kernel asserts before any work.
    inputs: tuple[Buffer | None, ...] = ()
    checks: tuple[tuple[Expr, str], ...] = ()
    # For an integer product, how its factors are packed into words along K (see words.py).
    words: Words | None = None

    def axes(self, role: str) -> tuple[Var, ...]:
        return {"batch": self.batch_axes, "m": self.m_axes, "n": self.n_axes,
                "k": self.compute.reduce_axes}[role]

    @property
    def output(self) -> Compute:
        return self.epilogue or self.compute

    @property
    def accumulator(self) -> DataType:
        """The type products are summed in: float32, or int32 for 8-bit factors."""
        return self.compute.dtype

    def element(self, e: Expr) -> Expr:
        """A factor's value as the accumulator's type."""
        return cast(e, self.accumulator)

    def store_value(self, acc: Expr, index: tuple) -> Expr:
        if self.epilogue is None:
            return acc
        value = substitute(self.epilogue.value, dict(zip(self.epilogue.axes, index)))
        return rewrite(value, lambda n: acc if isinstance(n, Load)
                       and n.buffer == self.compute.buffer else None)


def match_gemm(c: Compute, integer: bool = False) -> GemmPattern | None:
    """The GEMM roles of a float32 ``sum(left * right)`` compute, or None; with
    ``integer``, also of an int32 sum of products of 8-bit factors."""
    if c.reduce_op != "sum" or c.dtype not in ((float32, int32) if integer else (float32,)):
        return None
    value = c.value
    if not (isinstance(value, Binary) and value.op == "*"):
        return None
    left, right = value.a, value.b
    if c.dtype == int32 and not (byte_factor(left) is not None
                                 and byte_factor(right) is not None):
        return None
    used_left, used_right = free_vars(left), free_vars(right)
    if not (_loads_only_inputs(left) and _loads_only_inputs(right)):
        return None
    batch = tuple(a for a in c.axes if a in used_left and a in used_right)
    m = tuple(a for a in c.axes if a in used_left and a not in used_right)
    n = tuple(a for a in c.axes if a not in used_left)
    if not m and not n:
        return None
    return GemmPattern(c, left, right, batch, m, n)


def match_gemm_output(out: Compute, integer: bool = False) -> GemmPattern | None:
    """A GEMM for ``out`` itself, or for the one product ``out`` maps element-wise (see
    match_gemm for ``integer``)."""
    if out.is_reduction:
        return match_gemm(out, integer)
    value = Inliner(reachable([out]))(out.value)
    products = {n.buffer for n in walk(value) if isinstance(n, Load)
                and producer_of(n.buffer) is not None}
    if len(products) != 1:
        return None
    product = producer_of(products.pop())
    loads = [n for n in walk(value) if isinstance(n, Load) and n.buffer == product.buffer]
    if product.shape != out.shape or any(n.indices != out.axes for n in loads):
        return None
    pattern = match_gemm(product, integer)
    if pattern is None:
        return None
    epilogue = Compute(out.buffer, out.axes, value)
    return replace(pattern, epilogue=epilogue)


def with_constants(pattern: GemmPattern, constants: Collection[Buffer]) -> GemmPattern:
    """``pattern``, its right factor marked constant when it reads only ``constants``, in
    expressions ``tabulate`` evaluates, over static K and N and no batch axis (the panels
    are one matrix of static size)."""
    right, c = pattern.right, pattern.compute
    loads = {n.buffer for n in walk(right) if isinstance(n, Load)}
    sizes = axis_extents(c, pattern.n_axes) + [static(e) for e in c.reduce_extents]
    constant = (bool(loads) and loads <= set(constants) and tabulable(right)
                and not free_vars(right) & set(pattern.batch_axes)
                and all(isinstance(v, int) for v in sizes))
    return replace(pattern, constant_right=constant)


def _loads_only_inputs(e: Expr) -> bool:
    return all(producer_of(n.buffer) is None for n in walk(e) if isinstance(n, Load))


def axis_extents(c: Compute, axes: Sequence[Var]) -> list[Expr | int]:
    return [static(c.shape[c.axes.index(a)]) for a in axes]


def role_extents(pattern: GemmPattern) -> dict[str, list[Expr | int]]:
    """The extents of each role's axes (see ROLES), constants as Python ints."""
    c = pattern.compute
    return {"batch": axis_extents(c, pattern.batch_axes), "m": axis_extents(c, pattern.m_axes),
            "n": axis_extents(c, pattern.n_axes), "k": [static(e) for e in c.reduce_extents]}


def static(e: Expr) -> Expr | int:
    """A constant extent as a Python int, so that block sizes can be clamped to it."""
    return e.value if isinstance(e, Const) else e


def product(values: Sequence) -> Expr | int:
    total = 1
    for v in values:
        total = total * v
    return total


def static_min(a, b):
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else minimum(a, b)


def static_max(a, b):
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else maximum(a, b)


def round_up(x: int, multiple: int) -> int:
    return -(-max(x, 1) // multiple) * multiple


def right_row(pattern: GemmPattern) -> Load | None:
    """The right factor where it is a scalar load whose last index is the (only) N axis,
    so that consecutive columns are one vector load; None otherwise."""
    right, n_axes = pattern.right, pattern.n_axes
    if not (isinstance(right, Load) and right.lanes == 1 and len(n_axes) == 1
            and right.indices[-1] == n_axes[0]
            and all(n_axes[0] not in free_vars(i) for i in right.indices[:-1])):
        return None
    return right


def left_value(pattern: GemmPattern) -> Expr:
    """The left factor without the cast to float32 that a half-precision input adds."""
    return pattern.left.value if isinstance(pattern.left, Cast) else pattern.left


def plain_left(pattern: GemmPattern) -> bool:
    """Whether the left factor is a matrix read at its axes (each index one axis or a
    constant), not a window over an image (a convolution's im2col addressing)."""
    left = left_value(pattern)
    return isinstance(left, Load) and all(isinstance(i, (Var, Const)) for i in left.indices)


def interleaved_batch(pattern: GemmPattern) -> bool:
    """Whether the batch axes index the left factor's innermost dimension, so that the
    batches share its rows in memory (a channels-last grouped convolution's groups, side
    by side in each pixel), rather than each owning rows of its own (attention's heads)."""
    loads = [n for n in walk(left_value(pattern)) if isinstance(n, Load)]
    return bool(pattern.batch_axes) and any(
        free_vars(n.indices[-1]) & set(pattern.batch_axes) for n in loads if n.indices)


def byte_factor(e: Expr) -> Expr | None:
    """The 8-bit value an int32 factor widens, or None."""
    if isinstance(e, Cast) and e.dtype == int32 and e.value.dtype in (uint8, int8):
        return e.value
    return None


def f32(e: Expr) -> Expr:
    return e if e.dtype == float32 else Cast(e, float32)


def declare_parameters(fb: FunctionBuilder, pattern: GemmPattern, reads_right: bool,
                       buffers: list[Buffer]) -> list[Buffer]:
    """Declares a product's kernel parameters: the inputs its factors and epilogue read
    (the right factor's only where ``reads_right``: laid out at compile time, the kernel
    reads the layout), the output, ``buffers``, then the symbols of their shapes and of
    the checks, which it asserts. Returns the output and ``buffers``."""
    sources = [pattern.left] + ([pattern.right] if reads_right else [])
    if pattern.epilogue is not None:
        sources.append(pattern.epilogue.value)
    used = {n.buffer for e in sources for n in walk(e) if isinstance(n, Load)}
    for buffer in pattern.inputs:
        if buffer is not None and buffer in used:
            fb.add_param(buffer)
    declared = [fb.add_param(b) for b in (pattern.output.buffer, *buffers)]
    symbols = {v for p in fb.params for d in p.shape for v in free_vars(d)}
    symbols |= {v for cond, _ in pattern.checks for v in free_vars(cond)}
    for var in sorted(symbols, key=lambda v: v.name):
        fb.add_param(var)
    for cond, message in pattern.checks:
        fb.assert_(cond, message)
    return declared
