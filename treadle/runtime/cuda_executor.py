"""Running a compiled graph on the GPU: the CPU executor's slots, steps and memory plan,
with the arena, the constants and the tensors in device memory.

A step's kernel is a ``CudaLaunches``: the fused function (its parameters are the step's
arguments) and the CUDA kernels that compute it (``schedule.launches``), all in one cubin.
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
            base = self._arena_on_device(plan.arena_bytes)
            held = [cuda.DeviceArray.from_numpy(a) for a in arrays]
            address = {slot: d.address for slot, d in self._constants_on_device().items()}
            address.update((slot, d.address) for slot, d in zip(self.inputs, held))
            results = {slot: np.empty(plan.shapes[slot], self.slots[slot].dtype.numpy)
                       for slot in self.outputs if slot not in address}
            for slot, result in results.items():
                held.append(cuda.DeviceArray(result.shape, result.dtype))
                address[slot] = held[-1].address
            launched = []
            for index, step in enumerate(self.steps):
                where = [address[a] if a in address else
                         base + plan.offsets[a if a >= 0 else (index, -a - 1)] for a in step.args]
                if step.kernel is None:  # a view: its source's memory
                    if step.outputs[0] in results:
                        held.append(_copy_of(where[0], results[step.outputs[0]]))
                        address[step.outputs[0]] = held[-1].address
                    else:
                        address[step.outputs[0]] = where[0]
                    continue
                values = {v: symbols[v] for v in self._step_symbols[index]}
                begin = time.perf_counter()
                for kernel in step.kernel.kernels(self._modules):
                    kernel.reset_status()
                    kernel.launch_unchecked(where, values)
                    launched.append(kernel)
                if watch is not None:
                    cuda.synchronize()
                    seconds = time.perf_counter() - begin
                    watch(step, seconds, {s: _downloaded(where[step.args.index(s)],
                                                         self.slots[s], plan.shapes[s])
                                          for s in step.outputs})
            cuda.synchronize()
            for kernel in launched:
                kernel.check_status()
            for slot, result in results.items():
                cuda.copy_to_host(address[slot], result)
            return [self._owned(s, {**results, **dict(zip(self.inputs, arrays))})
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
