"""An executable as the tables of an exported model: every tensor C must size, and what
each step passes its kernel.

Each kernel argument is a word: the address of a slot (``Executable.slots``, by index),
of a step's workspace (after the slots) or, for a symbolic size, its value. A view that
no output is becomes its source's word here, once; a view that an output is becomes a
copy into the caller's buffer at its step. Every dimension any tensor has is one entry
of ``dims`` (an int, or an expression of the symbols, which C evaluates per run); a
tensor's shape is a list of indices into it.

What C cannot run is refused here, with the reason: CUDA kernels, host steps (a Loop
or If running compiled subgraphs from Python), sizes found in the data (NonZero), a
symbol that no input dimension gives, a scalar parameter that is no int64 size.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import numpy as np

from treadle.deploy.header import DTYPES
from treadle.errors import ExportError
from treadle.ir.dtypes import DataType, int64
from treadle.ir.expr import Const, Expr, Var
from treadle.ir.functor import free_vars
from treadle.runtime.cuda_executor import CudaExecutable
from treadle.runtime.executor import Executable, Slot, evaluate_shape
from treadle.runtime.module import CompiledFunction

# Symbols take this value while finding lifetimes, which do not depend on sizes.
PROBE_SIZE = 7


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: int  # a position in DTYPES
    word: int
    shape: tuple[int, ...]  # indices into Layout.dims


@dataclass(frozen=True)
class KernelCall:
    step: str
    kernel: CompiledFunction
    words: tuple[int, ...]
    symbols: tuple[int, ...]  # indices into Layout.symbols


@dataclass(frozen=True)
class Copy:
    """A view that is a graph output: ``source``'s bytes into output ``output``."""
    output: int
    source: int  # a word
    target: int  # a word


@dataclass
class Layout:
    symbols: list[Var]
    binds: list[tuple[int, int]]  # (input, axis) that gives each symbol
    dims: list[Union[int, Expr]] = field(default_factory=list)
    tensors: list[Tensor] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)  # tensor indices
    outputs: list[int] = field(default_factory=list)
    arena: list[tuple[int, int, int]] = field(default_factory=list)  # (tensor, first, last)
    constants: dict[int, np.ndarray] = field(default_factory=dict)  # by word
    output_sources: list[int] = field(default_factory=list)  # a word to copy from, or -1
    steps: list[Union[KernelCall, Copy]] = field(default_factory=list)
    words: int = 0

    def dim(self, value: Union[int, Expr]) -> int:
        value = value.value if isinstance(value, Const) else value
        if value not in self.dims:
            self.dims.append(value)
        return self.dims.index(value)

    def tensor(self, name: str, dtype: DataType, word: int, shape) -> int:
        if dtype.name not in DTYPES:
            raise ExportError(f"tensor {name!r} has dtype {dtype}, which the C export has "
                              f"no code for (it has {', '.join(DTYPES)})")
        self.tensors.append(Tensor(name, DTYPES.index(dtype.name), word,
                                   tuple(self.dim(d) for d in shape)))
        return len(self.tensors) - 1


def layout(ex: Executable) -> Layout:
    """The tables of ``ex``; ExportError where C cannot run it."""
    _check_exportable(ex)
    symbols = list(ex.symbols)
    out = Layout(symbols, _binds(ex, symbols))
    out.inputs = [out.tensor(ex.slots[i].name, ex.slots[i].dtype, i, ex.slots[i].shape)
                  for i in ex.inputs]
    out.outputs = [out.tensor(ex.slots[i].name, ex.slots[i].dtype, i, ex.slots[i].shape)
                   for i in ex.outputs]
    written = {o for step in ex.steps for o in step.outputs}
    out.output_sources = [-1 if i in written else i for i in ex.outputs]
    out.constants = dict(ex.constants)
    workspace_words = _workspace_words(ex)
    out.words = len(ex.slots) + len(workspace_words)
    out.steps = _steps(ex, symbols, workspace_words)
    _arena(ex, out, workspace_words)
    return out


def _check_exportable(ex: Executable) -> None:
    if isinstance(ex, CudaExecutable):
        raise ExportError("the model is compiled for CUDA; the C export runs CPU kernels: "
                          "compile it with target='cpu'")
    for step in ex.steps:
        if step.host is not None:
            raise ExportError(f"step {step.name!r} runs on the host (a Loop or If running "
                              "compiled subgraphs from Python), which the C export cannot")
    for var, slot in ex.found.items():
        raise ExportError(f"the size {var.name} is found in the data (tensor "
                          f"{ex.slots[slot].name!r}, as NonZero finds its count); the C export "
                          "needs every size decided by the input shapes")
    if len(set(ex.outputs)) != len(ex.outputs):
        raise ExportError("one tensor is returned as two outputs, which the C export cannot")


def _binds(ex: Executable, symbols: list[Var]) -> list[tuple[int, int]]:
    """Where each symbol is read from: the first input dimension that is it alone."""
    given: dict[Var, tuple[int, int]] = {}
    for k, slot in enumerate(ex.inputs):
        for axis, dim in enumerate(ex.slots[slot].shape):
            if isinstance(dim, Var):
                given.setdefault(dim, (k, axis))
    missing = [v.name for v in symbols if v not in given]
    if missing:
        raise ExportError(f"the sizes {', '.join(missing)} are no input's dimension, so no "
                          "input shape gives them")
    wide = [v.name for v in symbols if v.dtype != int64]
    if wide:
        raise ExportError(f"the sizes {', '.join(wide)} are not int64")
    return [given[v] for v in symbols]


def _workspace_words(ex: Executable) -> dict[tuple[int, int], int]:
    words: dict[tuple[int, int], int] = {}
    for index, step in enumerate(ex.steps):
        for k in range(len(step.workspaces)):
            words[(index, k)] = len(ex.slots) + len(words)
    return words


def _steps(ex: Executable, symbols: list[Var], workspace_words: dict
           ) -> list[Union[KernelCall, Copy]]:
    """The kernel calls and output copies, in order; views that are no output vanish
    into their source's word."""
    outputs = list(ex.outputs)
    root: dict[int, int] = {}
    steps: list[Union[KernelCall, Copy]] = []
    for index, step in enumerate(ex.steps):
        if step.is_view:
            source, out = root.get(step.args[0], step.args[0]), step.outputs[0]
            if out in outputs:
                steps.append(Copy(outputs.index(out), source, out))
            else:
                root[out] = source
            continue
        params = step.kernel.function.params[len(step.args):]
        scalars = [p for p in params if not isinstance(p, Var) or p not in symbols]
        if scalars:
            raise ExportError(f"step {step.name!r}: its kernel takes {scalars[0]}, which is no "
                              "symbolic size of the model")
        words = tuple(root.get(a, a) if a >= 0 else workspace_words[(index, -a - 1)]
                      for a in step.args)
        steps.append(KernelCall(step.name, step.kernel, words,
                                tuple(symbols.index(p) for p in params)))
    return steps


def _arena(ex: Executable, out: Layout, workspace_words: dict) -> None:
    """The tensors in the arena with their lifetimes, as the executor plans them."""
    probe = {v: PROBE_SIZE for v in ex.symbols}
    shapes = {i: evaluate_shape(s.shape, probe) for i, s in enumerate(ex.slots)}
    for key, first, last, _ in ex._lifetimes(shapes, probe):
        slot = _keyed(ex, key)
        word = key if isinstance(key, int) else workspace_words[key]
        name = slot.name if isinstance(key, int) else f"{ex.steps[key[0]].name}/{slot.name}"
        out.arena.append((out.tensor(name, slot.dtype, word, slot.shape), first, last))


def _keyed(ex: Executable, key) -> Slot:
    """The slot, or step workspace, an arena key names."""
    return ex.slots[key] if isinstance(key, int) else ex.steps[key[0]].workspaces[key[1]]


def symbols_of(dim: Union[int, Expr]) -> set[Var]:
    return set() if isinstance(dim, int) else free_vars(dim)
