"""Running a compiled graph on the GPU: the CPU executor's slots, steps and memory plan,
with the arena, the constants and the tensors in device memory.

A step's kernel is a ``CudaLaunches``: the fused function (its parameters are the step's
arguments) and the CUDA kernels that compute it (``ir.passes.split_launches``), all in one cubin.
Inputs are copied to the device at each call and outputs back after the last step;
constants are copied once, at the first call. ``profile`` and ``trace`` wait for each
step (and ``trace`` copies what it wrote to the host). Launches go back to back on one stream
and the failed asserts of every kernel are checked after it drains. Building and saving
need no GPU; calling raises ``DeviceUnavailableError`` on a machine without one.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from treadle.errors import UnsupportedOpError
from treadle.ir.stmt import Function
from treadle.runtime.executor import Executable, Slot, Step, evaluate_shape


@dataclass(eq=False)
class CudaLaunches:
    """A step's kernel on CUDA; its kernels are loaded at the first call."""
    function: Function  # the fused program: its parameters are the step's
    launches: tuple[Function, ...]  # lowered CUDA kernels, with the same parameters
    cubin: bytes
    arch: str
    _kernels: list = field(default_factory=list, repr=False)

    def kernels(self, modules: dict) -> list:
        if not self._kernels:
            from treadle.runtime.cuda import CudaKernel, CudaModule
            module = modules.get(self.cubin)
            if module is None:
                module = modules[self.cubin] = CudaModule(self.cubin)
            self._kernels = [CudaKernel(f, module) for f in self.launches]
        return self._kernels


class CudaExecutable(Executable):
    def __init__(self, slots: Sequence[Slot], inputs: Sequence[int], outputs: Sequence[int],
                 constants, steps: Sequence[Step], arch: str):
        super().__init__(slots, inputs, outputs, constants, steps, runner=None)
        host = next((s for s in self.steps if s.host is not None), None)
        if host is not None:
            raise UnsupportedOpError(
                f"node {host.name!r}: a Loop counted at run time calls its body from the "
                "host once per iteration, which the CUDA target does not do yet; compile "
                "the model for the CPU")
        if self.found:
            slot = self.slots[next(iter(self.found.values()))]
            raise UnsupportedOpError(
                f"tensor {slot.name!r}: its size ({slot.holds.name}) is found in the data, "
                "as NonZero's and Compress's are, which the CUDA target does not run yet; "
                "compile the model for the CPU")
        self.arch = arch
        self._device_lock = threading.Lock()
        self._modules: dict[bytes, object] = {}
        self._device_constants: dict[int, object] | None = None
        self._device_arena = None

    def _run(self, arrays: list[np.ndarray], watch: Optional[Callable] = None
             ) -> list[np.ndarray]:
        from treadle.runtime import cuda
        with self._device_lock:  # one arena on the device: one call at a time
            symbols = self._bind(arrays)
            plan = self._plan(symbols)
            call = _Call(self, plan, symbols, self._arena_on_device(plan.arena_bytes))
            call.place(arrays)
            launched = [kernel for index, step in enumerate(self.steps)
                        for kernel in call.step(index, step, watch)]
            cuda.synchronize()
            for kernel in launched:
                kernel.check_status()
            for slot, result in call.results.items():
                cuda.copy_to_host(call.address[slot], result)
            return [self._owned(s, {**call.results, **dict(zip(self.inputs, arrays))})
                    for s in self.outputs]

    def simulate(self, *args, **named) -> list[np.ndarray]:
        """The outputs the GPU would compute, from the GPU simulator (``runtime.simulate``)
        on this machine's CPU: slow, for small sizes, and a second executor where no GPU
        is. Each tensor gets an array of its own (no memory plan); a view shares its
        source's."""
        from treadle.runtime.simulate import simulate
        arrays = self._arguments(args, named)
        symbols = self._bind(arrays)
        shapes = {i: evaluate_shape(s.shape, symbols) for i, s in enumerate(self.slots)}
        values = {**self.constants, **dict(zip(self.inputs, arrays))}
        for index, step in enumerate(self.steps):
            if step.kernel is None:
                values[step.outputs[0]] = values[step.args[0]].reshape(shapes[step.outputs[0]])
                continue
            buffers = [values.setdefault(a, _garbage(self.slots[a].dtype, shapes[a]))
                       for a in step.args if a >= 0]
            buffers += [_garbage(w.dtype, evaluate_shape(w.shape, symbols))
                        for w in step.workspaces]
            sizes = {v.name: symbols[v] for v in self._step_symbols[index]}
            for launch in step.kernel.launches:
                simulate(launch, *buffers, **sizes)
        return [self._owned(s, values) for s in self.outputs]

    def _constants_on_device(self) -> dict[int, object]:
        if self._device_constants is None:
            from treadle.runtime.cuda import DeviceArray
            self._device_constants = {slot: DeviceArray.from_numpy(array)
                                      for slot, array in self.constants.items()}
        return self._device_constants

    def _arena_on_device(self, nbytes: int) -> int:
        from treadle.runtime.cuda import DeviceArray
        if self._device_arena is None or self._device_arena.nbytes < nbytes:
            self._device_arena = DeviceArray((max(nbytes, 1),), np.uint8)
        return self._device_arena.address


class _Call:
    """One call's device memory: where each tensor lies, the device arrays it holds, and
    the host arrays its outputs come back into."""

    def __init__(self, exe: CudaExecutable, plan, symbols: dict, base: int):
        self.exe, self.plan, self.symbols, self.base = exe, plan, symbols, base
        self.address = {slot: d.address for slot, d in exe._constants_on_device().items()}
        self.held: list = []  # device arrays alive until the call returns
        self.results: dict[int, np.ndarray] = {}

    def place(self, arrays: list[np.ndarray]) -> None:
        """The inputs copied to the device, and device arrays for the outputs."""
        from treadle.runtime.cuda import DeviceArray
        exe = self.exe
        for slot, array in zip(exe.inputs, arrays):
            self._hold(slot, DeviceArray.from_numpy(array))
        for slot in exe.outputs:
            if slot not in self.address:
                result = np.empty(self.plan.shapes[slot], exe.slots[slot].dtype.numpy)
                self.results[slot] = result
                self._hold(slot, DeviceArray(result.shape, result.dtype))

    def step(self, index: int, step: Step, watch: Optional[Callable]) -> list:
        """Launches ``step``'s kernels (a view is an address) and returns them."""
        plan = self.plan
        where = [self.address[a] if a in self.address else
                 self.base + plan.offsets[a if a >= 0 else (index, -a - 1)] for a in step.args]
        if step.kernel is None:  # a view: its source's memory, copied if an output
            out = step.outputs[0]
            if out in self.results:
                self._hold(out, _copy_of(where[0], self.results[out]))
            else:
                self.address[out] = where[0]
            return []
        values = {v: self.symbols[v] for v in self.exe._step_symbols[index]}
        begin = time.perf_counter()
        kernels = step.kernel.kernels(self.exe._modules)
        for kernel in kernels:
            kernel.reset_status()
            kernel.launch_unchecked(where, values)
        if watch is not None:
            from treadle.runtime.cuda import synchronize
            synchronize()
            watch(step, time.perf_counter() - begin,
                  {s: _downloaded(where[step.args.index(s)], self.exe.slots[s], plan.shapes[s])
                   for s in step.outputs})
        return kernels

    def _hold(self, slot: int, device) -> None:
        self.held.append(device)
        self.address[slot] = device.address


def _downloaded(address: int, slot: Slot, shape) -> np.ndarray:
    from treadle.runtime import cuda
    array = np.empty(shape, slot.dtype.numpy)
    cuda.copy_to_host(address, array)
    return array


def _garbage(dtype, shape) -> np.ndarray:
    """A tensor before any step writes it: NaN where it is float, so reading it shows."""
    array = np.empty(shape, dtype.numpy)
    if array.dtype.kind == "f":
        array.fill(np.nan)
    return array


def _copy_of(address: int, like: np.ndarray):
    """A device array holding a copy of ``like.nbytes`` bytes at ``address`` (a view that
    is a graph output: the caller's result must not alias the arena)."""
    from treadle.runtime import cuda
    staging = np.empty_like(like)
    cuda.copy_to_host(address, staging)
    return cuda.DeviceArray.from_numpy(staging)
