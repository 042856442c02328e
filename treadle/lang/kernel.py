"""``@kernel``: a Python function parsed into a tensor program when it is defined, and
compiled at its first call.

A call takes one argument per parameter, by position or by the parameter's name: numpy
arrays or CPU torch tensors for tensor parameters, numbers for scalar ones (a real number
for a float, an integer for an int, a bool for a bool; numpy scalars too). The kernel
writes its outputs in place into the arrays it is given (a torch tensor's memory is used,
not a copy), as a compiled builder function does, and the call returns None. Symbols take
their values from the arguments' shapes; one that is no whole dimension of any parameter
is passed by keyword (``k(x, n=4)``). Every argument is checked before any C code runs,
and a wrong dtype, rank, size or scalar type raises an error naming the parameter.
"""
from __future__ import annotations

import functools
import numbers
import threading
from typing import TYPE_CHECKING, Sequence

import numpy as np

from treadle.errors import ArgumentError, DTypeError, KernelError
from treadle.ir.expr import Var
from treadle.lang.parse import InlineFunction, parse_kernel
from treadle.lang.types import Param
from treadle.runtime.build import compile_function
from treadle.runtime.module import CompiledFunction

if TYPE_CHECKING:
    from treadle.lang.registry import OpSpec


class LangKernel:
    def __init__(self, fn, checked: bool | None = None):
        self.name = fn.__name__
        self.function, self.params = parse_kernel(fn)
        self.checked = checked  # None: as TREADLE_CHECK_BOUNDS says at the first call
        self._compiled: CompiledFunction | None = None
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    @property
    def compiled(self) -> CompiledFunction:
        """The compiled function, built once (through the on-disk kernel cache)."""
        with self._lock:
            if self._compiled is None:
                self._compiled = compile_function(self.function, self.checked)
        return self._compiled

    def __call__(self, *args, **kwargs) -> None:
        values, symbols = self._bind(args, kwargs)
        arrays, scalars = [], {}
        for param, value in zip(self.params, values):
            if param.is_tensor:
                arrays.append(as_array(value, param, self.name))
            else:
                scalars[param.name] = as_scalar(value, param, self.name)
        try:
            self.compiled(*arrays, **scalars, **symbols)
        except KernelError as err:  # a check failed: its message names sizes by symbol
            raise type(err)(f"{err}{self._sizes(arrays, symbols)}") from None

    def _sizes(self, arrays: Sequence[np.ndarray], symbols: dict) -> str:
        """The size symbols' values in a call, as `` (M = 4, N = 3)``; empty if none."""
        values = dict(symbols)
        for param, array in zip([p for p in self.params if p.is_tensor], arrays):
            for axis, dim in enumerate(param.type.shape):
                if isinstance(dim, Var):
                    values.setdefault(dim.name, array.shape[axis])
        return f" ({', '.join(f'{k} = {v}' for k, v in values.items())})" if values else ""

    def _bind(self, args: Sequence, kwargs: dict) -> tuple[list, dict]:
        """The arguments in parameter order, each given by position or by name, and the
        keywords left over, which name size symbols."""
        names = [p.name for p in self.params]
        takes = f"{self.name} takes {len(names)} arguments ({', '.join(names)})"
        if len(args) > len(names):
            raise ArgumentError(f"{takes}, got {len(args)}")
        given = dict(zip(names, args))
        sizes = {v.name for v in self.function.symbols} - set(names)
        symbols = {}
        for name, value in kwargs.items():
            if name in given:
                raise ArgumentError(f"{self.name}: argument {name!r} is given twice, by "
                                    "position and by name")
            if name not in names and name not in sizes:
                raise ArgumentError(f"{self.name} has no parameter or size symbol {name!r}; "
                                    f"its parameters are {', '.join(names)}, its symbols "
                                    f"{', '.join(sorted(sizes)) or 'none'}")
            (given if name in names else symbols)[name] = value
        missing = [n for n in names if n not in given]
        if missing:
            raise ArgumentError(f"{takes}, got {len(given)}: missing {', '.join(missing)}")
        return [given[n] for n in names], symbols

    def register_op(self, name: str, outputs: str | Sequence[str]) -> OpSpec:
        """Makes the kernel the operator ``name`` of treadle graphs and of torch
        (``torch.ops.treadle_lang.<name>``), computing the tensor parameters named in
        ``outputs`` from the others (``treadle.lang.registry``)."""
        from treadle.lang.registry import register_op
        return register_op(self, name, outputs)

    def __repr__(self) -> str:
        params = ", ".join(f"{p.name}: {p.type!r}" for p in self.params)
        return f"<treadle.lang kernel {self.name}({params})>"


def as_array(value, param: Param, kernel: str) -> np.ndarray:
    """A tensor argument as a numpy array over the same memory."""
    if isinstance(value, np.ndarray):
        return value
    where = f"argument {param.name!r} of {kernel}"
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        if value.device.type != "cpu":
            raise ArgumentError(f"{where}: a tensor on {value.device}; treadle runs on the CPU")
        try:
            return value.detach().numpy()
        except TypeError as err:  # a dtype numpy lacks (bfloat16)
            raise DTypeError(f"{where}: {err}") from None
    raise ArgumentError(f"{where}: expected a numpy array or a torch tensor, got "
                        f"{type(value).__name__}")


# The Python values each kind of scalar parameter takes (numbers' abstract classes hold
# numpy's scalars too); a bool is refused where a number is meant.
_SCALAR_KINDS = {"float": (numbers.Real, "a real number"), "int": (numbers.Integral, "an integer"),
                 "uint": (numbers.Integral, "an integer"), "bool": ((bool, np.bool_), "a bool")}


def as_scalar(value, param: Param, kernel: str):
    """A scalar argument, checked against its parameter's dtype."""
    dtype = param.type.dtype
    kinds, expected = _SCALAR_KINDS[dtype.kind]
    flag = isinstance(value, (bool, np.bool_))
    if not isinstance(value, kinds) or (flag and not dtype.is_bool):
        raise DTypeError(f"argument {param.name!r} of {kernel} ({dtype} scalar): "
                         f"expected {expected}, got {type(value).__name__} {value!r}")
    return value


def kernel(fn=None, *, checked: bool | None = None):
    """Parses ``fn`` into a tensor program (see ``treadle.lang``). ``@kernel(checked=True)``
    checks every load and store against its tensor's size when the kernel runs, failing
    the call with a KernelError (``ir.passes.check_bounds``); by default kernels are
    checked where TREADLE_CHECK_BOUNDS=1."""
    if fn is None:
        return functools.partial(LangKernel, checked=checked)
    return LangKernel(fn, checked)


def inline(fn) -> InlineFunction:
    """A helper parsed into each kernel that calls it, in place of the call."""
    return InlineFunction(fn)
