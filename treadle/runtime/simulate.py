"""A vectorised simulator of the CUDA execution model: the second executor of GPU kernels.

CI has no GPU, so kernels lowered for CUDA run here on small sizes and are compared with
numpy. A kernel in CUDA form is a ``blocks`` loop (the grid) whose body holds a
``threads`` loop (the threads of one block); every statement of the blocks loop's body
runs in each thread of the block.

Threads run in lockstep, SIMT style. A value is a numpy array over a lane axis, one lane per
(block, thread), and many blocks share one lane array, so a grid runs in a few passes of at
most ``PASS_LANES`` lanes with one numpy operation per IR node. Control flow that differs
between lanes becomes a mask of active lanes: an ``if`` runs each branch under the lanes
that take it, a loop runs to the largest extent with each lane masked off past its own.
Inactive lanes neither load nor store, so a guarded access past a buffer's end is fine.

A GPU corrupts memory silently where this simulator raises:

* an access outside its buffer's shape, in any dimension: ``KernelError``;
* a barrier reached by some but not all threads of a block: ``KernelError``;
* a data race in shared memory: within one block, between two barriers, two threads write
  one element, or one reads an element another writes: ``RaceError``;
* two threads (of any blocks) writing one element of global memory: ``RaceError``.

The race checks are what make lockstep order a faithful stand-in for a GPU's: a kernel
without races computes the same result in every interleaving of its threads. Expressions
mean what they mean in ``interpret``: C integer division, numpy's NaN-propagating min and
max, float32 arithmetic in float32.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NoReturn, Sequence, Union

import numpy as np

from treadle.errors import IRError, KernelError, RaceError
from treadle.ir import dtypes
from treadle.ir.compute import combine
from treadle.ir.dtypes import DataType
from treadle.ir.expr import (Binary, Buffer, Call, Cast, Const, Expr, Load, Select, Unary,
                             Var)
from treadle.ir.evaluate import NUMPY_BINARY, NUMPY_UNARY, lookup, numpy_type
from treadle.ir.functor import evaluate, walk
from treadle.ir.primitives import PRIMITIVES
from treadle.ir.stmt import (Accumulate, Assert, Barrier, DeclBuffer, Evaluate, For, ForTask,
                             Function, If, Let, Seq, Stmt, Store, fault_message)
from treadle.runtime.arguments import bind_arguments
from treadle.runtime.interpret import is_prefetch

# Lanes run in one pass: enough to fill numpy's vector loops, few enough that the per-lane
# copies of local buffers stay small. The shared memory of a pass's blocks, with its race
# records, is kept to as many elements.
PASS_LANES = 1 << 16
PASS_SHARED_ELEMENTS = 1 << 21
MAX_THREADS_PER_BLOCK = 1024

# Variables map to numpy scalars (a value every lane shares) or arrays over the lanes,
# buffers to their memory.
Env = dict[Union[Var, Buffer], Any]
Mask = np.ndarray  # bool per lane: the lanes that run the statement at hand


def simulate(func: Function, *arrays: np.ndarray, **symbols: int) -> None:
    """Runs the CUDA-form kernel ``func`` on ``arrays`` (its buffer parameters, updated in
    place), as ``interpret`` does; symbols not readable from the arrays' shapes are passed
    by keyword."""
    values = bind_arguments(func, arrays, symbols)
    kernel = _plan(func, values)
    env: Env = {var: _convert(value, var.dtype) for var, value in values.items()}
    env.update((b, _GlobalMemory(b, a)) for b, a in zip(func.buffers, arrays))
    # C arithmetic: float overflow gives inf and integers wrap, without warnings.
    with np.errstate(all="ignore"):
        if kernel.has_blocks_loop:
            launch = _Lanes.of(kernel, first=0, blocks=1, threads=1)
            _block((func.body,), launch, env, np.ones(1, bool))
        else:  # a grid of one block, whose loop simplify removed
            _run_grid(kernel, func.body, None, 1, env)


# ---- the kernel's shape, checked before it runs ----------------------------------------

@dataclass
class _Kernel:
    """What running a kernel needs to know besides its statements."""
    name: str
    has_blocks_loop: bool
    threads: int  # per block; 1 when the kernel has no threads loop
    shared_elements: int  # per block, as far as known at launch
    barriers: dict[int, str] = field(default_factory=dict)  # id of a Barrier -> where it is

    @property
    def blocks_per_pass(self) -> int:
        return max(1, min(PASS_LANES // self.threads,
                          PASS_SHARED_ELEMENTS // max(self.shared_elements, 1)))


# Where a statement runs: once per launch (outside the blocks loop), in every thread of a
# block outside the threads loop, or inside it.
LAUNCH, BLOCK, THREAD = "launch", "block", "thread"


def _plan(func: Function, symbols: dict[Var, Any]) -> _Kernel:
    _check_types(func)
    loops = [n for n in walk(func.body) if isinstance(n, For)]
    blocks = [loop for loop in loops if loop.kind == "blocks"]
    if len(blocks) > 1:
        raise IRError(f"{func.name} has {len(blocks)} blocks loops; a kernel is one grid")
    scan = _Scan(func, symbols, has_threads=any(loop.kind == "threads" for loop in loops))
    scan.stmt(func.body, LAUNCH if blocks else BLOCK, ())
    threads = scan.threads.pop() if scan.threads else 1
    if scan.threads:
        raise IRError(f"{func.name}: threads loops of different extents; a block has one size")
    if threads > MAX_THREADS_PER_BLOCK:
        raise KernelError(f"{func.name} launches {threads} threads per block; CUDA allows at "
                          f"most {MAX_THREADS_PER_BLOCK}")
    return _Kernel(func.name, bool(blocks), max(threads, 0), scan.shared_elements,
                   scan.barriers)


def _check_types(func: Function) -> None:
    for node in walk(func.body):
        dtype = node.buffer.dtype if isinstance(node, DeclBuffer) else getattr(node, "dtype", None)
        if dtype is None:
            continue
        if dtype.is_vector:
            raise IRError(f"{func.name}: {node} is a {dtype} vector; the simulator runs scalar "
                          "CUDA code")
        numpy_type(dtype)  # refuses bfloat16


class _Scan:
    """Checks that each statement sits where CUDA code can have it, and collects the
    threads loops' extents and the barriers' positions."""

    def __init__(self, func: Function, symbols: dict[Var, Any], has_threads: bool):
        self.func = func
        self.symbols = symbols
        self.has_threads = has_threads
        self.threads: set[int] = set()
        self.shared_elements = 0
        self.barriers: dict[int, str] = {}

    def stmt(self, s: Stmt, level: str, path: tuple[str, ...]) -> None:
        rule = getattr(self, f"_{type(s).__name__.lower()}", None)
        if rule is not None:
            rule(s, level, path)

    def _fail(self, what: str, s: Stmt) -> NoReturn:
        raise IRError(f"{self.func.name}: {what}:\n{s}")

    def _seq(self, s: Seq, level: str, path: tuple[str, ...]) -> None:
        for item in s.stmts:
            self.stmt(item, level, path)

    def _if(self, s: If, level: str, path: tuple[str, ...]) -> None:
        self.stmt(s.then, level, path + (f"if {s.cond}",))
        if s.otherwise is not None:
            self.stmt(s.otherwise, level, path + (f"else of if {s.cond}",))

    def _for(self, s: For, level: str, path: tuple[str, ...]) -> None:
        if s.kind == "blocks":
            if level != LAUNCH or path:
                self._fail("the blocks loop must be a top-level statement of the kernel", s)
            self.stmt(s.body, BLOCK, ())
        elif s.kind == "threads":
            if level != BLOCK:
                self._fail("a threads loop must sit in the blocks loop, outside other "
                           "threads loops", s)
            self.threads.add(self._constant(s))
            self.stmt(s.body, THREAD, path + (f"threads loop {s.var.name}",))
        elif s.kind == "parallel":
            self._fail("a parallel loop in CUDA code; GPU workers are blocks and threads loops", s)
        else:
            self.stmt(s.body, level, path + (f"loop {s.var.name}",))

    def _constant(self, s: For) -> int:
        try:
            return int(evaluate(s.extent, self.symbols))
        except (KeyError, TypeError):
            self._fail(f"threads loop extent {s.extent} is not fixed at launch", s)

    def _size(self, buffer: Buffer) -> int:
        """Elements of a buffer whose shape is known at launch, else 0."""
        try:
            return _count([evaluate(d, self.symbols) for d in buffer.shape])
        except (KeyError, TypeError):
            return 0

    def _fortask(self, s: ForTask, level: str, path: tuple[str, ...]) -> None:
        self._fail("a task-mapping loop is left; lower the kernel for CUDA first", s)

    def _store(self, s: Stmt, level: str, path: tuple[str, ...]) -> None:
        if not (level == THREAD or (level == BLOCK and not self.has_threads)):
            self._fail("a store outside the threads loop would run in every thread", s)

    _accumulate = _store

    def _declbuffer(self, s: DeclBuffer, level: str, path: tuple[str, ...]) -> None:
        if s.buffer.scope == "shared" and level != BLOCK:
            self._fail(f"shared buffer {s.buffer.name} must be declared in the blocks loop's "
                       "body, outside the threads loop, where there is one per block", s)
        if s.buffer.scope == "shared":
            self.shared_elements += self._size(s.buffer)
        if level == LAUNCH:
            self._fail(f"buffer {s.buffer.name} is declared outside the blocks loop", s)

    def _barrier(self, s: Barrier, level: str, path: tuple[str, ...]) -> None:
        if level == LAUNCH:
            self._fail("a barrier outside the blocks loop", s)
        where = f" (in {' > '.join(path)})" if path else ""
        self.barriers.setdefault(id(s), f"barrier {len(self.barriers) + 1}{where}")


# ---- lanes and passes over the grid ------------------------------------------------------

@dataclass
class _Lanes:
    """The threads one pass runs: ``blocks`` consecutive blocks of the grid, all threads of
    each; lane = (block in the pass) * threads + thread."""
    kernel: _Kernel
    blocks: int
    threads: int
    block: np.ndarray  # per lane: its block's number in the grid
    thread: np.ndarray  # per lane: its thread's number in the block
    local_block: np.ndarray  # per lane: its block's number in this pass
    shared: dict[Buffer, _SharedMemory] = field(default_factory=dict)

    @classmethod
    def of(cls, kernel: _Kernel, first: int, blocks: int, threads: int) -> _Lanes:
        local = np.repeat(np.arange(blocks, dtype=np.int64), threads)
        thread = np.tile(np.arange(threads, dtype=np.int64), blocks)
        return cls(kernel, blocks, threads, local + first, thread, local)

    @property
    def count(self) -> int:
        return self.block.size

    def where(self, lane: int) -> str:
        return f"block {self.block[lane]} thread {self.thread[lane]}"


def _run_grid(kernel: _Kernel, body: Stmt, var: Var | None, blocks: int, env: Env) -> None:
    if kernel.threads == 0:
        return
    per_pass = kernel.blocks_per_pass
    for first in range(0, blocks, per_pass):
        lanes = _Lanes.of(kernel, first, min(per_pass, blocks - first), kernel.threads)
        scope = dict(env)
        if var is not None:
            scope[var] = _convert(lanes.block, var.dtype)
        _block((body,), lanes, scope, np.ones(lanes.count, bool))


# ---- statements --------------------------------------------------------------------------

def _execute(stmt: Stmt, lanes: _Lanes, env: Env, mask: Mask) -> None:
    run = STMT_RUN.get(type(stmt))
    if run is None:
        raise IRError(f"simulator table STMT_RUN has no entry for {type(stmt).__name__}")
    run(stmt, lanes, env, mask)


def _block(stmts: Sequence[Stmt], lanes: _Lanes, env: Env, mask: Mask) -> None:
    """Runs statements in a fresh scope: their declarations vanish at the end."""
    scope = dict(env)
    for stmt in stmts:
        _execute(stmt, lanes, scope, mask)


def _grid(s: For, lanes: _Lanes, env: Env, mask: Mask) -> None:
    blocks = _uniform_int(s.extent, lanes, env, mask, "grid size")
    _run_grid(lanes.kernel, s.body, s.var, blocks, env)


def _threads(s: For, lanes: _Lanes, env: Env, mask: Mask) -> None:
    _block((s.body,), lanes, {**env, s.var: _convert(lanes.thread, s.var.dtype)}, mask)


def _loop(s: For, lanes: _Lanes, env: Env, mask: Mask) -> None:
    extent = _eval(s.extent, lanes, env, mask)
    scope = dict(env)
    if np.ndim(extent) == 0:  # every lane runs the same iterations
        for i in range(int(extent)):
            scope[s.var] = _convert(i, s.var.dtype)
            _block((s.body,), lanes, scope, mask)
        return
    longest = int(np.max(extent, where=mask, initial=0))
    for i in range(longest):
        scope[s.var] = _convert(i, s.var.dtype)
        _block((s.body,), lanes, scope, mask & (extent > i))


FOR_KIND_RUN = {"blocks": _grid, "threads": _threads,
                "serial": _loop, "unroll": _loop, "vectorize": _loop}


def _for(s: For, lanes: _Lanes, env: Env, mask: Mask) -> None:
    FOR_KIND_RUN[s.kind](s, lanes, env, mask)


def _if(s: If, lanes: _Lanes, env: Env, mask: Mask) -> None:
    cond = _eval(s.cond, lanes, env, mask)
    for branch, taken in ((s.then, mask & cond), (s.otherwise, mask & ~cond)):
        if branch is not None and taken.any():
            _block((branch,), lanes, env, taken)


def _store(s: Store, lanes: _Lanes, env: Env, mask: Mask) -> None:
    if not mask.any():
        return
    memory = lookup(s.buffer, env)
    active = _active(mask)
    element, address = memory.address(s.indices, lanes, env, mask, active, "writes")
    value = _at(_eval(s.value, lanes, env, mask), active)
    address = _per_access(address, lanes, active)
    memory.on_write(lanes, active, element, address)
    memory.data[address] = value


def _accumulate(s: Accumulate, lanes: _Lanes, env: Env, mask: Mask) -> None:
    _store(Store(s.buffer, (), combine(s.op, s.buffer[()], s.value)), lanes, env, mask)


def _let(s: Let, lanes: _Lanes, env: Env, mask: Mask) -> None:
    env[s.var] = _eval(s.value, lanes, env, mask)


def _decl_buffer(s: DeclBuffer, lanes: _Lanes, env: Env, mask: Mask) -> None:
    buffer = s.buffer
    shape = tuple(_uniform_int(d, lanes, env, mask, f"dimension of {buffer.name}")
                  for d in buffer.shape)
    if buffer.scope == "shared":
        env[buffer] = lanes.shared[buffer] = _SharedMemory(buffer, shape, lanes)
    else:
        env[buffer] = _LocalMemory(buffer, shape, lanes)


def _barrier(s: Barrier, lanes: _Lanes, env: Env, mask: Mask) -> None:
    reached = mask.reshape(lanes.blocks, lanes.threads)
    blocks = reached.any(axis=1)
    partial = np.flatnonzero(blocks & ~reached.all(axis=1))
    if partial.size:
        b = partial[0]
        kernel = lanes.kernel
        raise KernelError(f"{kernel.name}: {kernel.barriers.get(id(s), 'a barrier')} is "
                          f"reached by threads {_ranges(np.flatnonzero(reached[b]))} of block "
                          f"{lanes.block[b * lanes.threads]} but not by threads "
                          f"{_ranges(np.flatnonzero(~reached[b]))}; all threads of a block "
                          "must reach each barrier (__syncthreads)")
    for memory in lanes.shared.values():
        memory.new_interval(blocks)
    passed = lanes.block[::lanes.threads][blocks]
    for memory in env.values():
        if isinstance(memory, _GlobalMemory):
            memory.new_interval(passed, lanes.threads)


def _assert(s: Assert, lanes: _Lanes, env: Env, mask: Mask) -> None:
    failed = np.flatnonzero(mask & ~_eval(s.cond, lanes, env, mask))
    if failed.size:
        value = None if s.value is None else int(_at(_eval(s.value, lanes, env, mask), failed[0]))
        raise KernelError(fault_message(s.message, value))


def _evaluate(s: Evaluate, lanes: _Lanes, env: Env, mask: Mask) -> None:
    if not is_prefetch(s.expr):
        _eval(s.expr, lanes, env, mask)


STMT_RUN: dict[type, Callable[[Any, _Lanes, Env, Mask], None]] = {
    Seq: lambda s, lanes, env, mask: _block(s.stmts, lanes, env, mask),
    For: _for,
    If: _if,
    Store: _store,
    Accumulate: _accumulate,
    Let: _let,
    DeclBuffer: _decl_buffer,
    Barrier: _barrier,
    Assert: _assert,
    Evaluate: _evaluate,
}


def _ranges(ids: np.ndarray) -> str:
    """Thread numbers as runs: ``0-4, 7, 9-31``."""
    runs = np.split(ids, np.flatnonzero(np.diff(ids) != 1) + 1)
    return ", ".join(f"{r[0]}" if r.size == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _uniform_int(expr: Expr, lanes: _Lanes, env: Env, mask: Mask, what: str) -> int:
    """An integer every active lane agrees on (numpy has no ragged arrays)."""
    value = _eval(expr, lanes, env, mask)
    if np.ndim(value) == 0:
        return int(value)
    values = value[mask]
    if values.size and np.any(values != values[0]):
        raise IRError(f"{lanes.kernel.name}: {what} {expr} differs between threads")
    return int(values[0]) if values.size else 0


# ---- memory ------------------------------------------------------------------------------

def _active(mask: Mask) -> Union[slice, np.ndarray]:
    """Selects the active lanes: all of them (a slice, so nothing is copied) or their numbers."""
    return slice(None) if mask.all() else np.flatnonzero(mask)


def _at(value, active):
    """A value on the selected lanes; a value every lane shares stays one scalar."""
    return value if np.ndim(value) == 0 else value[active]


def _per_access(address, lanes: _Lanes, active) -> np.ndarray:
    """An address for each selected lane, where all of them access one element."""
    return address if np.ndim(address) else np.full(lanes.thread[active].shape, address)


def _lane(active, k: int) -> int:
    """The lane of the k-th selected access."""
    return k if isinstance(active, slice) else int(active[k])


class _Memory:
    """One buffer's storage: ``data`` holds all its instances flat, and lane l's instance
    starts at ``base[l]`` (one instance per block for shared memory, per lane for local)."""

    def __init__(self, buffer: Buffer, shape: tuple[int, ...], data: np.ndarray, base):
        self.buffer = buffer
        self.shape = shape
        self.size = _count(shape)
        self.strides = tuple(_count(shape[axis + 1:]) for axis in range(len(shape)))
        self.data = data
        self.base = base

    def address(self, indices: Sequence[Expr], lanes: _Lanes, env: Env, mask: Mask, active,
                verb: str) -> tuple:
        """The element each selected lane accesses and its position in ``data``, after
        checking the indices against the shape."""
        index = [_as_index(_at(_eval(i, lanes, env, mask), active)) for i in indices]
        outside = np.zeros((), bool)
        for i, n in zip(index, self.shape):
            outside = outside | (i < 0) | (i >= n)
        if np.any(outside):
            k = int(np.flatnonzero(np.broadcast_to(outside, lanes.thread[active].shape))[0])
            element = [int(_at(i, k)) for i in index]
            raise KernelError(f"{lanes.kernel.name}: {lanes.where(_lane(active, k))} {verb} "
                              f"{self.buffer.name}{element}, outside its shape "
                              f"{list(self.shape)}")
        element = sum((i * s for i, s in zip(index, self.strides)), np.int64(0))
        return element, _at(self.base, active) + element

    def element_text(self, element) -> str:
        index = np.unravel_index(int(element), self.shape) if self.shape else ()
        return f"{self.buffer.name}{[int(i) for i in index]}"

    def on_read(self, lanes: _Lanes, active, element, address) -> None:
        """Checks a read of ``element`` by the selected lanes for races."""

    def on_write(self, lanes: _Lanes, active, element, address) -> None:
        """Checks a write of ``element`` by the selected lanes for races."""


def _count(shape: Sequence[int]) -> int:
    """The number of elements of an array of this shape."""
    return int(np.prod(shape, dtype=np.int64))


def _fill(dtype: DataType, size: int) -> np.ndarray:
    # NaN rather than zero, so a kernel that reads memory it never wrote shows it.
    target = dtype.numpy
    return np.full(size, np.nan if target.kind == "f" else 0, target)


class _GlobalMemory(_Memory):
    """A kernel argument, updated in place, with a record of which threads wrote each
    element (made at the first write, as most arguments are only read): over the whole
    kernel, and since the writer's block last passed a barrier."""

    def __init__(self, buffer: Buffer, array: np.ndarray):
        super().__init__(buffer, array.shape, array.reshape(-1), np.int64(0))
        self.writers: _Touches | None = None
        self.recent: _Touches | None = None
        self.unsynced = False  # whether ``recent`` holds anything

    def on_write(self, lanes: _Lanes, active, element, address) -> None:
        if self.writers is None:
            self.writers = _Touches(self.size, np.int64)
            self.recent = _Touches(self.size, np.int64)
        # Blocks never synchronise with each other, so a global write is numbered by its
        # thread in the whole grid, and every two writers of one element race.
        who = _grid_thread(lanes, active)
        self.writers.add(address, who)
        self.recent.add(address, who)
        self.unsynced = True
        self._race(self.writers.first_other(address, who), lanes, active, element,
                   "writes", "writes")

    def on_read(self, lanes: _Lanes, active, element, address) -> None:
        """A read races with a write by another thread of its block since their last
        barrier, and with any write by a thread of another block."""
        if self.writers is None:
            return
        who = _grid_thread(lanes, active)
        found = self.recent.first_other(address, who) if self.unsynced else None
        self._race(found or self._other_block(address, who, lanes.threads), lanes, active,
                   element, "reads", "writes")

    def _other_block(self, address, who, threads: int) -> tuple[int, int] | None:
        low, high = self.writers.low[address], self.writers.high[address]
        block = who // threads
        k = _first((high != NOBODY) & ((low // threads != block) | (high // threads != block)))
        if k is None:
            return None
        return k, int(low[k] if low[k] // threads != block[k] else high[k])

    def _race(self, found, lanes: _Lanes, active, element, verb: str, other_verb: str) -> None:
        if found is not None:
            k, other = found
            block, thread = divmod(other, lanes.threads)
            raise RaceError(f"{lanes.kernel.name}: data race on global buffer "
                            f"{self.element_text(_at(element, k))}: "
                            f"{lanes.where(_lane(active, k))} {verb} it and block {block} "
                            f"thread {thread} {other_verb} it with no barrier between")

    def new_interval(self, blocks: np.ndarray, threads: int) -> None:
        """Forgets the recent writes of the blocks (their numbers in the grid) that passed
        a barrier."""
        if not self.unsynced:
            return
        written = self.recent.high != NOBODY
        passed = written & np.isin(self.recent.low // threads, blocks)
        self.recent.low[passed] = np.iinfo(self.recent.low.dtype).max
        self.recent.high[passed] = NOBODY
        self.unsynced = bool((written & ~passed).any())


def _grid_thread(lanes: _Lanes, active) -> np.ndarray:
    return lanes.block[active] * lanes.threads + lanes.thread[active]


class _LocalMemory(_Memory):
    """Registers or stack: one private instance per lane."""

    def __init__(self, buffer: Buffer, shape: tuple[int, ...], lanes: _Lanes):
        size = _count(shape)
        super().__init__(buffer, shape, _fill(buffer.dtype, size * lanes.count),
                         np.arange(lanes.count, dtype=np.int64) * size)


class _SharedMemory(_Memory):
    """One instance per block, with a record of which threads read and wrote each element
    since the block's last barrier."""

    def __init__(self, buffer: Buffer, shape: tuple[int, ...], lanes: _Lanes):
        size = _count(shape)
        super().__init__(buffer, shape, _fill(buffer.dtype, size * lanes.blocks),
                         lanes.local_block * size)
        # A thread's number in its block fits 32 bits, halving the records' memory.
        self.readers = _Touches(self.data.size, np.int32)
        self.writers = _Touches(self.data.size, np.int32)

    def on_read(self, lanes: _Lanes, active, element, address) -> None:
        thread = lanes.thread[active]
        self._race(self.writers.first_other(address, thread), lanes, active, element,
                   "reads", "writes")
        self.readers.add(address, thread)

    def on_write(self, lanes: _Lanes, active, element, address) -> None:
        thread = lanes.thread[active]
        self._race(self.readers.first_other(address, thread), lanes, active, element,
                   "writes", "reads")
        self.writers.add(address, thread)
        self._race(self.writers.first_other(address, thread), lanes, active, element,
                   "writes", "writes")

    def _race(self, found: tuple[int, int] | None, lanes: _Lanes, active, element, verb: str,
              other_verb: str) -> None:
        if found is not None:
            k, other = found
            lane = _lane(active, k)
            raise RaceError(f"{lanes.kernel.name}: data race on shared buffer "
                            f"{self.element_text(_at(element, k))} in block "
                            f"{lanes.block[lane]}: thread {lanes.thread[lane]} {verb} it and "
                            f"thread {other} {other_verb} it with no barrier between")

    def new_interval(self, blocks: np.ndarray) -> None:
        """Forgets the accesses of the blocks (a bool per block of the pass) that passed a
        barrier."""
        self.readers.forget(blocks)
        self.writers.forget(blocks)


NOBODY = -1


class _Touches:
    """The lowest and highest number of the threads that touched each element: enough to
    tell whether a thread other than a given one touched it."""

    def __init__(self, size: int, dtype: type):
        self.low = np.full(size, np.iinfo(dtype).max, dtype)
        self.high = np.full(size, NOBODY, dtype)

    def add(self, address: np.ndarray, who: np.ndarray) -> None:
        who = who.astype(self.low.dtype, copy=False)  # ufunc.at is slow when it must cast
        np.minimum.at(self.low, address, who)
        np.maximum.at(self.high, address, who)

    def first_other(self, address: np.ndarray, who: np.ndarray) -> tuple[int, int] | None:
        """The first access (by thread ``who[k]`` at ``address[k]``) whose element another
        thread touched, as ``(k, that thread)``; None when there is none."""
        who = who.astype(self.low.dtype, copy=False)
        low, high = self.low[address], self.high[address]
        k = _first((high != NOBODY) & ((low != who) | (high != who)))
        if k is None:
            return None
        return k, int(low[k] if low[k] != who[k] else high[k])

    def forget(self, blocks: np.ndarray) -> None:
        """Clears the records of the blocks given as a bool per block of the pass."""
        if self.low.size == 0:  # an empty buffer cannot be reshaped to one row per block
            return
        for record, value in ((self.low, np.iinfo(self.low.dtype).max), (self.high, NOBODY)):
            if blocks.all():
                record.fill(value)
            else:
                record.reshape(blocks.size, -1)[blocks] = value


def _first(flags: np.ndarray) -> int | None:
    found = np.flatnonzero(flags)
    return int(found[0]) if found.size else None


def _as_index(value):
    """An index as int64, so that flattening it cannot overflow a narrower type."""
    if isinstance(value, np.ndarray):
        return value.astype(np.int64, copy=False)
    return np.int64(value)


# ---- expressions -------------------------------------------------------------------------

def _eval(expr: Expr, lanes: _Lanes, env: Env, mask: Mask):
    run = EXPR_EVAL.get(type(expr))
    if run is None:
        raise IRError(f"simulator table EXPR_EVAL has no entry for {type(expr).__name__}")
    return run(expr, lanes, env, mask)


def _convert(value, dtype: DataType):
    """``value`` as ``dtype`` with C conversion rules, lane-wise."""
    target = dtype.numpy
    if isinstance(value, np.ndarray):
        return value.astype(target, copy=False)
    return target.type(value)


def _as(expr: Expr, dtype: DataType, lanes: _Lanes, env: Env, mask: Mask):
    value = _eval(expr, lanes, env, mask)
    return value if expr.dtype == dtype else _convert(value, dtype)


def _binary(e: Binary, lanes: _Lanes, env: Env, mask: Mask):
    common = dtypes.promote(e.a.dtype, e.b.dtype)
    a = _as(e.a, common, lanes, env, mask)
    if e.op in ("and", "or"):
        # As in C, the right side runs only on lanes the left does not decide:
        # `i < n and A[i] > 0` must not load A[n].
        undecided = mask & (a if e.op == "and" else ~a)
        if not undecided.any():
            return a
        mask = undecided
    b = _as(e.b, common, lanes, env, mask)
    if e.op in ("//", "%") and np.any(mask & (b == 0)):
        raise KernelError(f"integer division by zero in {e}")
    return NUMPY_BINARY[e.op](a, b)


def _select(e: Select, lanes: _Lanes, env: Env, mask: Mask):
    # Like C's `?:`, each side runs only on the lanes that choose it.
    cond = _eval(e.cond, lanes, env, mask)
    then_mask, otherwise_mask = mask & cond, mask & ~cond
    if not otherwise_mask.any():
        return _as(e.then, e.dtype, lanes, env, then_mask)
    if not then_mask.any():
        return _as(e.otherwise, e.dtype, lanes, env, otherwise_mask)
    then = _as(e.then, e.dtype, lanes, env, then_mask)
    return _convert(np.where(cond, then, _as(e.otherwise, e.dtype, lanes, env, otherwise_mask)),
                    e.dtype)


def _load(e: Load, lanes: _Lanes, env: Env, mask: Mask):
    if not mask.any():  # the value of no lane is needed
        return _convert(0, e.dtype)
    memory = lookup(e.buffer, env)
    active = _active(mask)
    element, address = memory.address(e.indices, lanes, env, mask, active, "reads")
    memory.on_read(lanes, active, element, _per_access(address, lanes, active))
    values = memory.data[address]
    if np.ndim(values) == 0 or isinstance(active, slice):
        return values
    every_lane = np.zeros(lanes.count, values.dtype)
    every_lane[active] = values
    return every_lane


WARP = 32


def _shuffle_xor(e: Call, lanes: _Lanes, env: Env, mask: Mask):
    """``shfl_xor(value, m)``: each lane takes the value of the thread whose number is its
    own xor ``m``, in its warp. As ``__shfl_xor_sync`` with a full mask, every thread of a
    warp that shuffles must take part."""
    value = np.broadcast_to(_eval(e.args[0], lanes, env, mask), (lanes.count,))
    offset = _uniform_int(e.args[1], lanes, env, mask, "a shuffle's lane mask")
    partner = lanes.thread ^ offset
    if not 0 < offset < WARP or np.any(mask & (partner >= lanes.threads)):
        raise KernelError(f"{e}: lane mask {offset} reaches outside a warp of "
                          f"{min(WARP, lanes.threads)} threads")
    warp = lanes.local_block * lanes.threads + lanes.thread // WARP * WARP
    taking_part = np.zeros(lanes.count, bool)
    taking_part[warp[mask]] = True
    if np.any(taking_part[warp] & ~mask):
        lane = _first(taking_part[warp] & ~mask)
        raise KernelError(f"{e}: {lanes.where(lane)} does not take part in its warp's shuffle")
    return value[lanes.local_block * lanes.threads + partner]


def _call(e: Call, lanes: _Lanes, env: Env, mask: Mask):
    if e.func == "shfl_xor":
        return _shuffle_xor(e, lanes, env, mask)
    args = [_eval(a, lanes, env, mask) for a in e.args]
    return _convert(PRIMITIVES[e.func].numpy(*args), e.dtype)


EXPR_EVAL: dict[type, Callable[[Any, _Lanes, Env, Mask], Any]] = {
    Var: lambda e, lanes, env, mask: lookup(e, env),
    Const: lambda e, lanes, env, mask: _convert(e.value, e.dtype),
    Binary: _binary,
    Unary: lambda e, lanes, env, mask: NUMPY_UNARY[e.op](_eval(e.a, lanes, env, mask)),
    Select: _select,
    Cast: lambda e, lanes, env, mask: _convert(_eval(e.value, lanes, env, mask), e.dtype),
    Load: _load,
    Call: _call,
}
