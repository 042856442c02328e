"""``@kernel``: a Python function parsed into a tensor program when it is defined, and
compiled at its first call.

A call takes one argument per parameter, in order: numpy arrays or CPU torch tensors for
tensor parameters, numbers for scalar ones. The kernel writes its outputs in place into
the arrays it is given (a torch tensor's memory is used, not a copy), as a compiled
builder function does, and the call returns None. Symbols take their values from the
arguments' shapes; one that is no whole dimension of any parameter is passed by keyword
(``k(x, n=4)``). Every argument is checked before any C code runs, and a wrong dtype,
rank or size raises an error naming the parameter.
"""
from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Sequence

import numpy as np

from treadle.errors import ArgumentError, DTypeError
from treadle.lang.parse import InlineFunction, parse_kernel
from treadle.lang.types import Param
from treadle.runtime.module import CompiledFunction, compile_function

if TYPE_CHECKING:
    from treadle.lang.registry import OpSpec


class LangKernel:
    def __init__(self, fn):
        self.name = fn.__name__
        self.function, self.params = parse_kernel(fn)
        self._compiled: CompiledFunction | None = None
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    @property
    def compiled(self) -> CompiledFunction:
        """The compiled function, built once (through the on-disk kernel cache)."""
        with self._lock:
            if self._compiled is None:
                self._compiled = compile_function(self.function)
        return self._compiled

    def __call__(self, *args, **symbols) -> None:
        if len(args) != len(self.params):
            raise ArgumentError(f"{self.name} takes {len(self.params)} arguments "
                                f"({', '.join(p.name for p in self.params)}), got {len(args)}")
        arrays, scalars = [], {}
        for param, value in zip(self.params, args):
            if param.is_tensor:
                arrays.append(as_array(value, param, self.name))
            else:
                scalars[param.name] = value
        self.compiled(*arrays, **scalars, **symbols)

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


def kernel(fn) -> LangKernel:
    """Parses ``fn`` into a tensor program (see ``treadle.lang``)."""
    return LangKernel(fn)


def inline(fn) -> InlineFunction:
    """A helper parsed into each kernel that calls it, in place of the call."""
    return InlineFunction(fn)
