"""Running a compiled graph: argument checks, the memory plan and the kernel list.

The graph's tensors are slots. A step either runs a kernel on slots (plus scratch
workspaces) or makes a slot a reshaped view of another (reshape-like operators cost
nothing). Intermediate tensors and workspaces live in one arena, placed by a first-fit
plan over their lifetimes, so memory is reused once a tensor is dead. Sizes may depend on
symbols, so the plan is computed per distinct set of symbol values and cached, the
``TREADLE_PLAN_CACHE`` most recently used ones (a model called at every sequence length
would otherwise keep a plan for each forever). Each
calling thread has an arena of its own, kept between its calls, so a compiled model may
be called from several threads.

The kernels run in one call of the step runner (``runtime.step_runner``) where it is given;
``profile`` and kernels the runner cannot call go through ctypes one step at a time, as do
models with sizes found in the data, and models with host steps: Python functions over
arrays (a Loop calling its compiled body), whose results, and the tensors sized by how
many times a loop ran, which no bound limits, are arrays of their own outside the arena.
"""
from __future__ import annotations

import ctypes
import platform
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from treadle.config import config
from treadle.errors import ArgumentError, DTypeError, KernelError, ShapeError
from treadle.ir.dtypes import DataType, int64
from treadle.ir.expr import Dim, Expr, Var
from treadle.ir.functor import evaluate, free_vars
from treadle.runtime.step_runner import MAX_ARITY, load_runner
from treadle.runtime.module import CompiledFunction

ALIGN = 64


@dataclass(frozen=True)
class Slot:
    name: str
    dtype: DataType
    shape: tuple[Dim, ...]
    # An int64 scalar a kernel writes the value of a size symbol into (how many elements
    # NonZero found), at most ``bound``, an expression of the inputs' sizes; no bound
    # limits how many times a Loop runs.
    holds: Optional[Var] = None
    bound: Optional[Expr] = None


# A step run by Python: the arrays of its arguments -> new arrays for its outputs.
HostFunction = Callable[[list[np.ndarray]], list[np.ndarray]]


@dataclass(frozen=True)
class Step:
    """``kernel`` over ``args`` (slot ids; negative -k-1 means workspace k of this step);
    or ``host`` over the arrays of ``args``, its results new arrays, outside the arena (a
    Loop calling its compiled body); or with neither, ``outputs[0]`` as a view of
    ``args[0]``."""
    name: str
    kernel: Optional[CompiledFunction]
    args: tuple[int, ...]
    outputs: tuple[int, ...]
    workspaces: tuple[Slot, ...] = ()
    host: Optional[HostFunction] = None

    @property
    def is_view(self) -> bool:
        return self.kernel is None and self.host is None


@dataclass
class _Plan:
    shapes: dict[int, tuple[int, ...]]
    offsets: dict[object, int]  # slot id or (step, workspace) -> arena offset
    arena_bytes: int
    # For the step runner: the words that are arena addresses, their offsets, and the
    # bytes each runner step copies (views into graph outputs).
    arena_words: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    arena_offsets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    copy_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    copy_bytes_address: int = 0
    # The runner's words with the arena's addresses filled in, for the arena at ``base``
    # (a thread keeps its arena, so this is computed once per plan and thread).
    filled: tuple[int, np.ndarray] | None = None


@dataclass
class _Call:
    """A call whose steps run one at a time from Python: its plan and arena, the arrays
    of the graph's inputs and outputs, the sizes bound so far, where each tensor written
    outside the arena lies, and the arrays holding them for the call."""
    plan: _Plan
    base: int
    values: dict[int, np.ndarray]
    symbols: dict[Var, int]
    address: dict[int, int]
    held: list[np.ndarray] = field(default_factory=list)


def _mentions(shape: Sequence[Dim], symbols: set[Var]) -> bool:
    return any(isinstance(d, Expr) and free_vars(d) & symbols for d in shape)


def _size_bytes(dtype: DataType, shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.numpy.itemsize


class Executable:
    def __init__(self, slots: Sequence[Slot], inputs: Sequence[int], outputs: Sequence[int],
                 constants: Mapping[int, np.ndarray], steps: Sequence[Step],
                 runner: Optional[Path] = None):
        """``runner``: the step runner's shared object (``runtime.step_runner``), or None to
        call every kernel from Python."""
        self.slots = tuple(slots)
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.constants = {slot: _aligned(array) for slot, array in constants.items()}
        self.steps = tuple(steps)
        self._returned = set(self.outputs)
        # Symbols whose values kernels find in the data, by the slot holding each.
        self.found = {s.holds: k for k, s in enumerate(self.slots) if s.holds is not None}
        self.symbols = sorted({v for s in self.slots for d in s.shape if isinstance(d, Expr)
                               for v in free_vars(d)} - set(self.found), key=lambda v: v.name)
        self._data_shaped = {k for k, s in enumerate(self.slots)
                             if _mentions(s.shape, set(self.found))}
        # A size no bound limits (how many times a Loop ran) is planned for by no plan:
        # the tensors it sizes, and those a host step returns, are arrays of their own,
        # made as they are written.
        unbounded = {v for v, k in self.found.items() if self.slots[k].bound is None}
        self._unplanned = {k for k in self._data_shaped
                           if _mentions(self.slots[k].shape, unbounded)}
        self._loose = self._unplanned | {o for s in steps if s.host for o in s.outputs}
        self._loose_workspaces = {(index, k) for index, step in enumerate(steps)
                                  for k, w in enumerate(step.workspaces)
                                  if _mentions(w.shape, unbounded)}
        self._plans: OrderedDict[tuple, _Plan] = OrderedDict()  # least recently used first
        self._bound: dict[tuple, dict[Var, int]] = {}  # input shapes -> their symbols' values
        self._lock = threading.Lock()
        self._arenas = threading.local()  # each calling thread's arena, kept between calls
        self._constant_addresses = {slot: array.ctypes.data
                                    for slot, array in self.constants.items()}
        self._step_symbols = [() if step.kernel is None else
                              step.kernel.function.params[len(step.args):]
                              for step in self.steps]
        self.runner = runner
        # The runner runs every step in one call: sizes found in the data need a stop
        # after the kernel finding each, so such models run their steps from Python.
        self._table = None if runner is None or self.found or self._loose else \
            _RunnerTable.of(self, load_runner(runner))
        # Inputs of constant shapes (most models) are checked by one comparison each.
        shapes = [self.slots[i].shape for i in self.inputs]
        self._static_shapes = (None if any(isinstance(d, Expr) for s in shapes for d in s)
                               else [tuple(s) for s in shapes])

    @property
    def input_names(self) -> list[str]:
        return [self.slots[i].name for i in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [self.slots[i].name for i in self.outputs]

    def __call__(self, *args, **named) -> list[np.ndarray]:
        return self._run(self._arguments(args, named))

    def profile(self, *args, **named) -> list[tuple[str, float]]:
        """Runs once and returns (step name, seconds) for every kernel or host step, in
        order."""
        times: list[tuple[str, float]] = []
        self._run(self._arguments(args, named),
                  lambda step, seconds, written: times.append((step.name, seconds)))
        return times

    def trace(self, *args, **named) -> list[tuple[Step, dict[int, np.ndarray]]]:
        """Runs once and returns, for every kernel or host step in order, a copy of each
        tensor it wrote (by slot) as it was right after the step: a later step may reuse
        the memory. Checking a model against a reference walks these."""
        steps: list[tuple[Step, dict[int, np.ndarray]]] = []
        self._run(self._arguments(args, named), lambda step, seconds, written: steps.append(
            (step, {s: a.copy() for s, a in written.items()})))
        return steps

    def reads_before_writes(self) -> list[tuple[str, str]]:
        """(step, tensor) for every step that reads a tensor no earlier step wrote and
        that is neither an input nor a constant: a step order that computes garbage."""
        ready = set(self.inputs) | set(self.constants)
        found = []
        for step in self.steps:
            found += [(step.name, self.slots[a].name) for a in step.args
                      if a >= 0 and a not in ready and a not in step.outputs]
            ready.update(step.outputs)
        return found

    def output_shapes(self, *args) -> list[tuple[int, ...]]:
        """The outputs' shapes for these inputs, without running; an output that a size
        found in the data sizes has its shape at the size's bound."""
        symbols = self._bind(self._arguments(args, {}))
        symbols = {**symbols, **self._bounds(symbols)}
        return [evaluate_shape(self.slots[s].shape, symbols) for s in self.outputs]

    def _run(self, arrays: list[np.ndarray], watch: Optional[Callable] = None
             ) -> list[np.ndarray]:
        """``watch(step, seconds, {slot: array})``, if given, sees each kernel or host step
        run."""
        symbols = self._bind(arrays)
        try:
            return self._run_bound(arrays, symbols, watch)
        except KernelError as err:
            raise _with_sizes(err, symbols) from None

    def _run_bound(self, arrays: list[np.ndarray], symbols: dict[Var, int],
                   watch: Optional[Callable]) -> list[np.ndarray]:
        plan = self._plan(symbols)
        base = self._arena(plan.arena_bytes)
        values: dict[int, np.ndarray] = dict(zip(self.inputs, arrays))
        for slot in self.outputs:
            if slot not in values and slot not in self.constants and slot not in self._loose:
                values[slot] = np.empty(plan.shapes[slot], self.slots[slot].dtype.numpy)
        if watch is None and self._table is not None:
            self._table.run(plan, base, values, symbols)
            return [self._owned(s, values) for s in self.outputs]
        # A size found in the data stands at its bound until its kernel has run.
        symbols = {**symbols, **self._bounds(symbols)} if self.found else symbols
        call = _Call(plan, base, values, symbols, dict(self._constant_addresses))
        # Kernels take addresses: those of arrays, or the arena's base plus the planned
        # offset; a view's address is its source's, so no array is made for either.
        call.address.update((slot, array.ctypes.data) for slot, array in values.items())
        for index, step in enumerate(self.steps):
            if step.is_view:
                self._view(step, call)
            elif step.host is not None:
                self._run_host(step, call, watch)
            else:
                self._run_kernel(index, step, call, watch)
        return [self._written(s, values, plan, call.symbols).copy() if s in self._data_shaped
                else self._owned(s, values) for s in self.outputs]

    def _view(self, step: Step, call: _Call) -> None:
        source, out = step.args[0], step.outputs[0]
        pointer = self._pointer(call, -1, source)
        if out not in self._returned:
            call.address[out] = pointer
            return
        if out not in call.values:  # a graph output outside any plan
            self._fresh(call, out, self.slots[out])
        # A graph output: the caller's array gets a copy.
        self._written(out, call.values, call.plan, call.symbols)[...] = self._array(
            pointer, source, call.plan, call.symbols).reshape(
            self._shape(out, call.plan, call.symbols))

    def _run_kernel(self, index: int, step: Step, call: _Call,
                    watch: Optional[Callable]) -> None:
        pointers = [self._pointer(call, index, a) for a in step.args]
        scalars = [call.symbols[v] for v in self._step_symbols[index]]
        begin = time.perf_counter()
        step.kernel.call_unchecked(pointers + scalars)
        if self.found:
            self._read_found(step, dict(zip(step.args, pointers)), call.symbols)
        if watch is not None:
            seconds = time.perf_counter() - begin
            watch(step, seconds, {s: self._array(pointers[step.args.index(s)], s, call.plan,
                                                 call.symbols) for s in step.outputs})

    def _run_host(self, step: Step, call: _Call, watch: Optional[Callable]) -> None:
        """A host step over arrays of its arguments; its results are kept for the call."""
        arrays = [self._array(self._pointer(call, -1, a), a, call.plan, call.symbols)
                  for a in step.args]
        begin = time.perf_counter()
        results = step.host(arrays)
        seconds = time.perf_counter() - begin
        for slot, array in zip(step.outputs, results):
            if slot in self._returned:
                call.values[slot] = array
            else:
                call.held.append(array)
            call.address[slot] = data_address(array)
        self._read_found(step, {s: call.address[s] for s in step.outputs}, call.symbols)
        if watch is not None:
            watch(step, seconds, dict(zip(step.outputs, results)))

    def _pointer(self, call: _Call, index: int, arg: int) -> int:
        """Where argument ``arg`` of step ``index`` lies in this call."""
        if arg in call.address:
            return call.address[arg]
        key = arg if arg >= 0 else (index, -arg - 1)
        if arg in self._loose or key in self._loose_workspaces:
            return self._fresh(call, key, self.slots[arg] if arg >= 0
                               else self.steps[index].workspaces[-arg - 1])
        return call.base + call.plan.offsets[key]

    def _fresh(self, call: _Call, key: object, slot: Slot) -> int:
        """The address of a new array for a tensor (or workspace) outside the plan, at
        this call's sizes."""
        array = np.empty(evaluate_shape(slot.shape, call.symbols), slot.dtype.numpy)
        if key in self._returned:
            call.values[key] = array
        else:
            call.held.append(array)
        if isinstance(key, int):
            call.address[key] = data_address(array)
        return array.ctypes.data

    def _bounds(self, symbols: Mapping[Var, int]) -> dict[Var, int]:
        """The bound of each size found in the data, at the inputs' sizes: what memory
        is planned for."""
        bounds: dict[Var, int] = {}
        for var, slot in self.found.items():  # in graph order: a bound may use earlier ones
            if self.slots[slot].bound is not None:
                bounds[var] = int(evaluate(self.slots[slot].bound, {**symbols, **bounds}))
        return bounds

    def _read_found(self, step: Step, pointers: Mapping[int, int],
                    symbols: dict[Var, int]) -> None:
        """Binds the sizes ``step`` has found in the data (``pointers``: the address of
        each slot it wrote), checked against their bounds."""
        for slot in step.outputs:
            var = self.slots[slot].holds
            if var is None:
                continue
            value = ctypes.c_int64.from_address(pointers[slot]).value
            limit = self.slots[slot].bound
            bound = value if limit is None else int(evaluate(limit, symbols))
            if limit is None and value < 0:
                raise KernelError(f"step {step.name}: found a negative count for "
                                  f"{var.name} in the data")
            if not 0 <= value <= bound:
                raise KernelError(f"step {step.name}: found {value} elements for "
                                  f"{var.name}, outside 0..{bound}")
            symbols[var] = value

    def _shape(self, slot: int, plan: _Plan, symbols: Mapping[Var, int]) -> tuple[int, ...]:
        """The slot's shape in this call: the plan's, or where a size is found in the
        data, at the size found."""
        if slot not in self._data_shaped:
            return plan.shapes[slot]
        return evaluate_shape(self.slots[slot].shape, symbols)

    def _written(self, slot: int, values: dict[int, np.ndarray], plan: _Plan,
                 symbols: Mapping[Var, int]) -> np.ndarray:
        """The part of graph output ``slot``'s array that this call fills: all of it, or
        where a size is found in the data, the first elements of the bound's (the
        caller gets a copy of those alone, not the bound's memory)."""
        array = values[slot]
        if slot not in self._data_shaped:
            return array
        shape = self._shape(slot, plan, symbols)
        return array.reshape(-1)[:int(np.prod(shape, dtype=np.int64))].reshape(shape)

    def _array(self, pointer: int, slot: int, plan: _Plan, symbols: Mapping[Var, int]
               ) -> np.ndarray:
        """Slot ``slot`` of this call, at ``pointer``, as an array (to copy a view)."""
        dtype, shape = self.slots[slot].dtype.numpy, self._shape(slot, plan, symbols)
        count = int(np.prod(shape, dtype=np.int64))
        buffer = (ctypes.c_char * (count * dtype.itemsize)).from_address(pointer)
        return np.frombuffer(buffer, dtype, count).reshape(shape)

    def _arena(self, nbytes: int) -> int:
        """The ALIGN-aligned address of this thread's arena of at least ``nbytes``, kept
        for its next call: allocating one right after a 128 x 768 x 768 GEMM's kernel
        (numpy's allocator and ctypes cold in the caches) took 14-20 us, finding the kept
        one 3-4.5 us. No result points into it: outputs are arrays of their own."""
        arena = getattr(self._arenas, "buffer", None)
        if arena is None or arena.nbytes < nbytes + ALIGN:
            arena = self._arenas.buffer = np.empty(nbytes + ALIGN, np.uint8)
            self._arenas.base = arena.ctypes.data + (-arena.ctypes.data) % ALIGN
        return self._arenas.base

    def _owned(self, slot: int, values: dict[int, np.ndarray]) -> np.ndarray:
        # Inputs and constants returned as outputs are copied: the caller owns the result.
        if slot in values and slot not in self.inputs:
            return values[slot]
        return (values[slot] if slot in values else self.constants[slot]).copy()

    # ---- arguments -----------------------------------------------------------------------
    def _arguments(self, args, named) -> list[np.ndarray]:
        names = self.input_names
        if args and named:
            raise ArgumentError("pass inputs either by position or by name, not both")
        if named:
            unknown = set(named) - set(names)
            missing = [n for n in names if n not in named]
            if unknown or missing:
                raise ArgumentError(f"inputs are {names}; unknown {sorted(unknown)}, "
                                    f"missing {missing}")
            args = [named[n] for n in names]
        if len(args) == 1 and isinstance(args[0], dict):
            return self._arguments((), args[0])
        if len(args) != len(names):
            raise ArgumentError(f"the model takes {len(names)} inputs {names}, got {len(args)}")
        return [self._as_array(a, self.slots[i]) for a, i in zip(args, self.inputs)]

    @staticmethod
    def _as_array(value, slot: Slot) -> np.ndarray:
        if not isinstance(value, np.ndarray) and hasattr(value, "detach") \
                and hasattr(value, "numpy"):  # a torch tensor
            value = value.detach().cpu().numpy()
        if isinstance(value, np.generic):  # a numpy scalar for a rank-0 input
            value = np.asarray(value)
        if not isinstance(value, np.ndarray):
            raise ArgumentError(f"input {slot.name!r}: expected a numpy array, got "
                                f"{type(value).__name__}")
        if value.dtype != slot.dtype.numpy:
            if value.dtype.name != "bfloat16" or slot.dtype.scalar.name != "bfloat16":
                raise DTypeError(f"input {slot.name!r}: expected dtype {slot.dtype}, "
                                 f"got {value.dtype}")
            value = value.view(np.uint16)  # ml_dtypes' bfloat16 (ONNX's tools): its bits
        if value.ndim != len(slot.shape):
            raise ShapeError(f"input {slot.name!r}: expected rank {len(slot.shape)} "
                             f"{_format(slot.shape)}, got shape {value.shape}")
        return value if value.flags.c_contiguous else np.ascontiguousarray(value)

    def _bind(self, arrays: Sequence[np.ndarray]) -> dict[Var, int]:
        if self._static_shapes is not None and all(
                a.shape == s for a, s in zip(arrays, self._static_shapes)):
            return {}
        # Checked shapes are kept: evaluating them again took 20 us of a 17 x 17
        # attention product's 75 us call.
        shapes = tuple(a.shape for a in arrays)
        known = self._bound.get(shapes)
        if known is not None:
            return known
        symbols: dict[Var, int] = {}
        for array, i in zip(arrays, self.inputs):
            for dim, actual in zip(self.slots[i].shape, array.shape):
                if isinstance(dim, Var) and dim not in symbols:
                    symbols[dim] = int(actual)
        for array, i in zip(arrays, self.inputs):
            slot = self.slots[i]
            try:
                expected = evaluate_shape(slot.shape, symbols)
            except KeyError as err:
                raise ArgumentError(f"input {slot.name!r}: {err}") from None
            if tuple(array.shape) != expected:
                raise ShapeError(f"input {slot.name!r}: expected shape {_format(slot.shape)} = "
                                 f"{list(expected)}, got {list(array.shape)}")
        with self._lock:
            if len(self._bound) >= config.plan_cache:
                del self._bound[next(iter(self._bound))]
            self._bound[shapes] = symbols
        return symbols

    # ---- memory plan ---------------------------------------------------------------------
    def _plan(self, symbols: dict[Var, int]) -> _Plan:
        key = tuple(map(symbols.get, self.symbols))
        plan = self._plans.get(key)  # a lookup needs no lock; making a plan does
        if plan is None:
            with self._lock:
                plan = self._plans.get(key)
                if plan is None:
                    plan = self._plans[key] = self._make_plan({**symbols,
                                                               **self._bounds(symbols)})
                    while len(self._plans) > config.plan_cache:
                        self._plans.popitem(last=False)
        elif key:  # a static model has one plan, and nothing to reorder on its calls
            try:
                self._plans.move_to_end(key)
            except KeyError:  # another thread has just evicted it
                pass
        return plan

    def _make_plan(self, symbols: dict[Var, int]) -> _Plan:
        shapes = {i: evaluate_shape(s.shape, symbols) for i, s in enumerate(self.slots)
                  if i not in self._unplanned}
        for i, shape in shapes.items():
            if any(d < 0 for d in shape):
                raise ShapeError(f"tensor {self.slots[i].name!r} would have negative shape "
                                 f"{list(shape)} for {dict((v.name, x) for v, x in symbols.items())}")
        intervals = self._lifetimes(shapes, symbols)
        offsets, total = _first_fit(intervals)
        plan = _Plan(shapes, offsets, total)
        if self._table is not None:
            self._table.prepare(plan, self)
        return plan

    def _lifetimes(self, shapes, symbols) -> list[tuple[object, int, int, int]]:
        """(key, first step, last step, bytes) of everything that lives in the arena."""
        external = set(self.inputs) | set(self.constants) | set(self.outputs) | self._loose
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        root: dict[int, int] = {}
        workspaces = []
        for index, step in enumerate(self.steps):
            for a in step.args:
                if a >= 0:
                    last[root.get(a, a)] = index
            for out in step.outputs:
                if step.is_view:
                    root[out] = root.get(step.args[0], step.args[0])
                else:
                    first.setdefault(out, index)
                    last.setdefault(out, index)
            for k, w in enumerate(step.workspaces):
                if (index, k) not in self._loose_workspaces:
                    workspaces.append(((index, k), index, index, _size_bytes(
                        w.dtype, evaluate_shape(w.shape, symbols))))
        arena = [(s, first[s], last[s], _size_bytes(self.slots[s].dtype, shapes[s]))
                 for s in first if s not in external]
        return arena + workspaces


class _RunnerTable:
    """The kernel steps as the step runner's table. Each call fills one array of words:
    a word per slot (its address), per step workspace (its address) and per symbol (its
    value); each step's arguments are gathered from it. A view that is not a graph
    output is its root's address, resolved here once."""

    def __init__(self, exe: "Executable", runner):
        self.runner = runner
        slots = len(exe.slots)
        self.workspace_word: dict[tuple[int, int], int] = {}
        for index, step in enumerate(exe.steps):
            for k in range(len(step.workspaces)):
                self.workspace_word[(index, k)] = slots + len(self.workspace_word)
        self.symbols = sorted({v for names in exe._step_symbols for v in names},
                              key=lambda v: v.name)
        first_symbol = slots + len(self.workspace_word)
        self.symbol_words = np.arange(first_symbol, first_symbol + len(self.symbols))
        self.template = np.zeros(first_symbol + len(self.symbols), np.int64)
        for slot, address in exe._constant_addresses.items():
            self.template[slot] = address
        outputs = set(exe.outputs)
        root: dict[int, int] = {}
        entries, arity, first, args = [], [], [], []
        self.kernels: list[Optional[CompiledFunction]] = []
        self.copies: list[tuple[int, int]] = []  # (runner step, output slot)
        for index, step in enumerate(exe.steps):
            if step.kernel is None:
                source, out = root.get(step.args[0], step.args[0]), step.outputs[0]
                if out not in outputs:
                    root[out] = source
                    continue
                self.copies.append((len(arity), out))
                words, entry, count = [source, out], 0, -1
            else:
                words = [root.get(a, a) if a >= 0 else self.workspace_word[(index, -a - 1)]
                         for a in step.args]
                words += [first_symbol + self.symbols.index(v)
                          for v in exe._step_symbols[index]]
                entry, count = step.kernel.address, len(words)
            self.kernels.append(step.kernel)
            entries.append(entry)
            arity.append(count)
            first.append(len(args))
            args.extend(words)
        self.entries = np.array(entries, np.uint64)
        self.arity = np.array(arity, np.int32)
        self.first = np.array(first, np.int64)
        self.args = np.array(args, np.int64)
        # Taken once: numpy makes an object for each ``.ctypes`` (2 us apiece per call).
        self.table_addresses = (self.entries.ctypes.data, self.arity.ctypes.data,
                                self.first.ctypes.data)

    @classmethod
    def of(cls, exe: "Executable", runner) -> Optional["_RunnerTable"]:
        """The table, or None where a kernel takes a parameter the runner cannot pass
        (more than MAX_ARITY, or a scalar that is no int64)."""
        for step, symbols in zip(exe.steps, exe._step_symbols):
            if step.kernel is not None and (len(step.args) + len(symbols) > MAX_ARITY or
                                            any(v.dtype != int64 for v in symbols)):
                return None
        return cls(exe, runner)

    def prepare(self, plan: _Plan, exe: "Executable") -> None:
        """The plan's arena words and copy sizes."""
        words = [key if isinstance(key, int) else self.workspace_word[key]
                 for key in plan.offsets]
        plan.arena_words = np.array(words, np.int64)
        plan.arena_offsets = np.array(list(plan.offsets.values()), np.int64)
        plan.copy_bytes = np.zeros(len(self.arity), np.int64)
        for step, out in self.copies:
            plan.copy_bytes[step] = _size_bytes(exe.slots[out].dtype, plan.shapes[out])
        plan.copy_bytes_address = plan.copy_bytes.ctypes.data

    def run(self, plan: _Plan, base: int, values: dict[int, np.ndarray],
            symbols: Mapping[Var, int]) -> None:
        filled = plan.filled
        if filled is None or filled[0] != base:
            words = self.template.copy()
            words[plan.arena_words] = plan.arena_offsets + base
            filled = plan.filled = (base, words)
        words = filled[1].copy()
        for slot, array in values.items():
            words[slot] = data_address(array)
        if self.symbols:
            words[self.symbol_words] = [symbols[v] for v in self.symbols]
        args = words[self.args]
        failed = ctypes.c_int64(-1)
        status = self.runner(len(self.arity), *self.table_addresses, data_address(args),
                             plan.copy_bytes_address, ctypes.byref(failed))
        if status != 0:
            self.kernels[failed.value].check_status(status)


def _with_sizes(err: KernelError, symbols: Mapping[Var, int]) -> KernelError:
    """``err`` with this call's values of the sizes its message names: a check over
    symbolic sizes states the condition in their names ("dimension 0 must match for
    broadcasting (B vs A)")."""
    message = str(err)
    named = [f"{v.name} = {n}" for v, n in sorted(symbols.items(), key=lambda s: s[0].name)
             if re.search(rf"(?<![\w.]){re.escape(v.name)}(?![\w.])", message)]
    if not named:
        return err
    return type(err)(f"{message}; in this call {', '.join(named)}")


def _data_offset() -> int | None:
    """Where an ndarray object holds the address of its data: right after the object
    header, as numpy's C headers lay it out; checked on a probe array, None where it is
    not so (another Python implementation or build)."""
    if platform.python_implementation() != "CPython":
        return None
    probe = np.empty(3)
    offset = object.__basicsize__
    found = ctypes.c_void_p.from_address(id(probe) + offset).value
    return offset if found == probe.ctypes.data else None


_DATA_OFFSET = _data_offset()


def data_address(array: np.ndarray) -> int:
    """The address of ``array``'s data. ``array.ctypes.data`` builds an object on every
    use (1.3 us, three times per call of a model); reading the field takes 0.4 us."""
    if _DATA_OFFSET is None:
        return array.ctypes.data
    return ctypes.c_void_p.from_address(id(array) + _DATA_OFFSET).value or 0


def _aligned(array: np.ndarray) -> np.ndarray:
    """``array`` at an ALIGN-byte boundary (a copy where it is not): numpy places large
    arrays 16 bytes past a page, and half the vector loads of such a weight would cross a
    cache line."""
    if array.ctypes.data % ALIGN == 0 and array.flags.c_contiguous:
        return array
    raw = np.empty(array.nbytes + ALIGN, np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    aligned = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    aligned[...] = array
    return aligned


def _first_fit(intervals) -> tuple[dict[object, int], int]:
    """Offsets such that tensors alive at the same time never overlap; largest first."""
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    offsets: dict[object, int] = {}
    total = 0
    for key, start, stop, size in sorted(intervals, key=lambda x: -x[3]):
        size = -(-size // ALIGN) * ALIGN
        offset = 0
        for o, e, s, t in sorted((p for p in placed if not (p[3] < start or stop < p[2]))):
            if offset + size <= o:
                break
            offset = max(offset, e)
        placed.append((offset, offset + size, start, stop))
        offsets[key] = offset
        total = max(total, offset + size)
    return offsets, total


def evaluate_shape(shape: Sequence[Dim], symbols: Mapping[Var, int]) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else int(evaluate(d, symbols)) for d in shape)


def _format(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"
