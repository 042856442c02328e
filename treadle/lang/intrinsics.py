"""What a kernel's body calls besides arithmetic: loop ranges, buffer declarations,
barriers and the IR's primitive functions.

These run while the kernel is parsed. A loop range or a buffer declaration is a value the
parser turns into a loop or a named buffer (``for t in parallel(4)``, ``acc = buffer(...)``);
``barrier()`` emits into the function being built; the math functions build IR calls.
"""
from __future__ import annotations

import builtins
import math
from dataclasses import dataclass
from typing import Sequence

from treadle.ir.builder import current_builder
from treadle.ir.dtypes import DataType
from treadle.ir.expr import Expr, as_expr, call, ceil_div, maximum, minimum
from treadle.ir.primitives import PRIMITIVES
from treadle.lang.types import ScalarType, as_dtype


@dataclass(frozen=True)
class LoopRange:
    """``range(start, stop, step)`` as a run-time loop of one of the IR's loop kinds."""
    start: object
    stop: object
    step: int
    kind: str

    @staticmethod
    def of(bounds: Sequence, kind: str) -> LoopRange:
        if not 1 <= len(bounds) <= 3:
            raise TypeError(f"a loop range takes 1 to 3 bounds (stop, or start, stop[, step]), "
                            f"got {len(bounds)}")
        start, stop, step = (0, bounds[0], 1) if len(bounds) == 1 else (*bounds, 1)[:3]
        if isinstance(step, bool) or not isinstance(step, int) or step <= 0:
            raise ValueError(f"a loop's step must be a positive int known when compiling, "
                             f"got {step}")
        return LoopRange(start, stop, step, kind)

    @property
    def extent(self):
        """How many iterations: ceil((stop - start) / step), none when stop <= start."""
        if isinstance(self.start, int) and isinstance(self.stop, int):
            return max(0, ceil_div(self.stop - self.start, self.step))
        # A negative extent runs no iterations: loops test `i < extent`.
        span = self.stop if isinstance(self.start, int) and self.start == 0 \
            else as_expr(self.stop) - self.start
        return span if self.step == 1 else ceil_div(span, self.step)


def parallel(*bounds) -> LoopRange:
    """Iterations spread over the thread pool (the loop's iterations are workers)."""
    return LoopRange.of(bounds, "parallel")


def unroll(*bounds) -> LoopRange:
    """A loop the C compiler is asked to unroll."""
    return LoopRange.of(bounds, "unroll")


def vectorize(*bounds) -> LoopRange:
    """A loop whose iterations become SIMD lanes."""
    return LoopRange.of(bounds, "vectorize")


@dataclass(frozen=True)
class StaticRange:
    """A loop unrolled while parsing: its variable is a Python int in each copy."""
    values: range


def static_range(*bounds: int) -> StaticRange:
    """``range(...)`` over ints known when compiling, unrolled into copies of the body."""
    if not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds):
        raise TypeError(f"static_range takes ints known when compiling, got "
                        f"{', '.join(map(str, bounds))}")
    return StaticRange(range(*bounds))


@dataclass(frozen=True)
class BufferDecl:
    """A buffer to declare under the name it is assigned to."""
    dtype: DataType
    shape: tuple
    scope: str


def buffer(dtype, shape: Sequence, scope: str = "local") -> BufferDecl:
    """``acc = buffer(f32, [4, 2])``: an array private to a worker (``local``), or shared
    by the workers of the enclosing parallel loop (``scope="shared"``)."""
    if scope not in ("local", "shared"):
        raise ValueError(f"a kernel declares local or shared buffers, not {scope!r}; global "
                         "buffers are parameters")
    return BufferDecl(as_dtype(dtype), tuple(shape), scope)


def barrier() -> None:
    """Every worker of the enclosing parallel loop gets here before any goes on."""
    current_builder().barrier()


def cast(value, dtype) -> Expr:
    """``value`` converted to ``dtype`` (``f32``, a DataType or a name)."""
    return ScalarType(as_dtype(dtype))(value)


def _primitive(name: str):
    def apply(*args) -> Expr:
        return call(name, *args)
    apply.__name__ = apply.__qualname__ = name
    apply.__doc__ = f"The IR primitive {name!r} (treadle.ir.primitives)."
    return apply


# lang.exp, lang.sqrt, lang.fma ...: one per IR primitive.
PRIMITIVE_CALLS = {name: _primitive(name) for name in PRIMITIVES}


def _any_expr(args) -> bool:
    return any(isinstance(a, Expr) for a in args)


def _fold(combine, python):
    def apply(*args):
        if len(args) < 2 or not _any_expr(args):
            return python(*args)
        result = args[0]
        for a in args[1:]:
            # A Python number takes the dtype of the expression it meets, so it goes second.
            result = combine(result, a) if isinstance(result, Expr) else combine(a, result)
        return result
    return apply


def _unary(name: str, python):
    return lambda x: call(name, x) if isinstance(x, Expr) else python(x)


def _convert(dtype_name: str, python):
    return lambda x: cast(x, dtype_name) if isinstance(x, Expr) else python(x)


# Python callables that mean an IR operation when given run-time values: builtins, and
# math functions the IR has as primitives (math.exp(x) is lang.exp(x)).
BUILTIN_CALLS = {
    builtins.min: _fold(minimum, builtins.min),
    builtins.max: _fold(maximum, builtins.max),
    builtins.abs: _unary("abs", builtins.abs),
    builtins.float: _convert("float32", builtins.float),
    builtins.int: _convert("int64", builtins.int),
    builtins.range: lambda *bounds: LoopRange.of(bounds, "serial"),
    **{getattr(math, name): _unary(name, getattr(math, name))
       for name in PRIMITIVES if PRIMITIVES[name].arity == 1 and hasattr(math, name)},
}
