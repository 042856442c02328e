"""Loading compiled kernels with ctypes and calling them with numpy arrays.

A call binds its arguments first (``bind_arguments``: dtype, rank, shape, contiguity,
writeability, symbol values), so a bad call raises a Python error naming the argument
before any C code runs. Kernels take ``restrict`` pointers, so an array the kernel writes
may not overlap any other argument. ctypes releases the GIL during the call: several
Python threads may call kernels at once.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Sequence

import numpy as np

from treadle.backend.c import c_name, fault_symbol, messages_symbol
from treadle.backend.elf import open_library
from treadle.config import config
from treadle.errors import ArgumentError, IRError, KernelError
from treadle.ir.dtypes import DataType
from treadle.ir.expr import Buffer
from treadle.ir.functor import walk
from treadle.ir.stmt import Function, Store, fault_message
from treadle.runtime.arguments import bind_arguments
from treadle.runtime.pool import parallel_for_address

# ctypes types of scalar parameters, by dtype name.
CTYPES = {
    "float32": ctypes.c_float, "float64": ctypes.c_double,
    "int8": ctypes.c_int8, "int16": ctypes.c_int16, "int32": ctypes.c_int32,
    "int64": ctypes.c_int64, "uint8": ctypes.c_uint8, "uint16": ctypes.c_uint16,
    "uint32": ctypes.c_uint32, "uint64": ctypes.c_uint64, "bool": ctypes.c_bool,
}


def _scalar_ctype(func: Function, name: str, dtype: DataType):
    if dtype.name not in CTYPES:
        raise IRError(f"{func.name}: scalar parameter {name} has dtype {dtype}, which cannot "
                      f"be passed from Python (supported: {', '.join(CTYPES)})")
    return CTYPES[dtype.name]


class CompiledFunction:
    """One kernel: ``f(*arrays, **symbols)`` runs it on numpy arrays in place."""

    def __init__(self, library: ctypes.CDLL, func: Function, path: Path | None = None):
        self.function = func
        self.path = path  # the shared object it was loaded from
        self._entry = library[c_name(func)]  # a fresh pointer: its argtypes are ours alone
        self._entry.argtypes = [ctypes.c_void_p if isinstance(p, Buffer)
                                else _scalar_ctype(func, p.name, p.dtype) for p in func.params]
        self._entry.restype = ctypes.c_int32
        self._messages = _read_messages(library, messages_symbol(func))
        self._library = library
        stored = {s.buffer for s in walk(func.body) if isinstance(s, Store)}
        self._written = [b in stored for b in func.buffers]

    def __call__(self, *arrays: np.ndarray, **symbols) -> None:
        values = bind_arguments(self.function, arrays, symbols)
        self._check_overlap(arrays)
        buffers = iter(arrays)
        self.call_unchecked([next(buffers).ctypes.data if isinstance(p, Buffer) else values[p]
                             for p in self.function.params])

    def call_unchecked(self, args: Sequence) -> None:
        """Runs the kernel on raw arguments in parameter order (addresses for buffers),
        for executors that have already checked every shape and dtype."""
        self.check_status(self._entry(*args))

    def check_status(self, status: int) -> None:
        """Raises the KernelError that the kernel's return ``status`` stands for."""
        if status != 0:
            message = (self._messages[status - 1] if 0 < status <= len(self._messages)
                       else f"unexpected status {status}")
            if "{value}" in message:
                value = ctypes.c_int64.in_dll(self._library, fault_symbol(self.function))
                message = fault_message(message, value.value)
            raise KernelError(f"kernel {self.function.name}: {message}")

    @property
    def address(self) -> int:
        """The entry point's address, for the step runner (``runtime.step_runner``)."""
        return ctypes.cast(self._entry, ctypes.c_void_p).value

    def _check_overlap(self, arrays: Sequence[np.ndarray]) -> None:
        names = [b.name for b in self.function.buffers]
        for i, (array, written) in enumerate(zip(arrays, self._written)):
            for j, other in enumerate(arrays):
                if written and i != j and np.may_share_memory(array, other):
                    raise ArgumentError(f"argument {names[i]!r} of {self.function.name} is "
                                        f"written but shares memory with argument "
                                        f"{names[j]!r}; pass a separate array")

    def __repr__(self) -> str:
        return f"CompiledFunction({self.function.name})"


class CompiledModule:
    """The kernels of one shared object, by IR function name: ``module["matmul"]`` or
    ``module.matmul``."""

    def __init__(self, path: Path, functions: dict[str, CompiledFunction]):
        self.path = path
        self.functions = functions

    def __getitem__(self, name: str) -> CompiledFunction:
        try:
            return self.functions[name]
        except KeyError:
            raise KeyError(f"module {self.path.name} has no function {name!r}; it has "
                           f"{', '.join(map(repr, self.functions))}") from None

    def __getattr__(self, name: str) -> CompiledFunction:
        functions = self.__dict__.get("functions", {})
        if name not in functions:
            raise AttributeError(f"compiled module has no function {name!r}")
        return functions[name]

    def __repr__(self) -> str:
        return f"CompiledModule({self.path}, {list(self.functions)})"


def _read_messages(library: ctypes.CDLL, symbol: str) -> tuple[str, ...]:
    table = ctypes.cast(ctypes.addressof(ctypes.c_char_p.in_dll(library, symbol)),
                        ctypes.POINTER(ctypes.c_char_p))
    messages = []
    while table[len(messages)] is not None:
        messages.append(table[len(messages)].decode("utf-8", "replace"))
    return tuple(messages)


def exported_symbols(functions: Sequence[Function]) -> list[str]:
    """The symbols ``load`` looks up in a shared object built from ``generate(functions)``."""
    return ["treadle_set_num_threads", *(c_name(f) for f in functions),
            *(messages_symbol(f) for f in functions)]


def load(path: Path | str, functions: Sequence[Function]) -> CompiledModule:
    """Loads a shared object built from ``generate(functions)``; OSError where it is
    damaged or lacks a function (``backend.elf``)."""
    library = open_library(path, exported_symbols(functions))
    library.treadle_set_num_threads.argtypes = [ctypes.c_int]
    library.treadle_set_num_threads.restype = None
    library.treadle_set_num_threads(config.num_threads)
    # Kernels saved before the pool have OpenMP loops of their own and no such entry.
    set_parallel = getattr(library, "treadle_set_parallel", None)
    if set_parallel is not None:
        set_parallel.argtypes = [ctypes.c_void_p]
        set_parallel.restype = None
        set_parallel(parallel_for_address())
    return CompiledModule(Path(path), {f.name: CompiledFunction(library, f, Path(path))
                                          for f in functions})
