"""Running treadle's CUDA kernels through the CUDA driver API, called with ctypes.

No CUDA package is needed: ``libcuda.so.1``, which the NVIDIA driver installs, is loaded
on first use and device 0's primary context is made current on each calling thread. It is
the context PyTorch uses too, so a CUDA tensor's pointer is valid in treadle's kernels.
On a machine without the driver or a GPU, ``available()`` is False and every other entry
raises ``DeviceUnavailableError``; treadle still builds cubins there (nvcc needs no GPU).

The kernel ABI (``backend.cuda``): ``kernel_<name>(params...)`` takes a device pointer
per buffer and a C scalar per symbol, in parameter order; a failed ``Assert`` leaves its
1-based number, in ``walk`` order, in the device global ``kernel_<name>__status`` and its
value in ``kernel_<name>__fault``. A call resets the status, launches on the legacy default
stream (ordered with PyTorch's default stream), synchronises and reads the status back.
"""
from __future__ import annotations

import ctypes
import math
import threading
from contextlib import contextmanager
from typing import Iterator, Mapping, Sequence

import numpy as np

from treadle.backend.c import c_name, fault_symbol
from treadle.errors import (ArgumentError, DeviceUnavailableError, DTypeError, IRError,
                            KernelError, ShapeError, TreadleError)
from treadle.ir.expr import Buffer, Expr, Var, as_expr
from treadle.ir.functor import evaluate, walk
from treadle.ir.stmt import Assert, Function, Store, fault_message
from treadle.runtime.arguments import Value, bind_arguments
from treadle.runtime.module import CTYPES
from treadle.target.cuda import CudaTarget, described_target

LIBRARY = "libcuda.so.1"
NO_DRIVER = ("no CUDA driver ({library}) on this machine; treadle can build CUDA kernels "
             "here but not run them")

# CUdevice_attribute values from cuda.h (CUDA 13.0), by the key device_properties uses.
ATTRIBUTES = {
    "max_threads_per_block": 1,
    "max_shared_memory_per_block": 8,
    "warp_size": 10,
    "max_registers_per_block": 12,
    "clock_rate_khz": 13,
    "multiprocessor_count": 16,
    "l2_cache_size": 38,
    "max_threads_per_multiprocessor": 39,
    "max_shared_memory_per_multiprocessor": 81,
    "max_registers_per_multiprocessor": 82,
    "max_shared_memory_per_block_optin": 97,
}
COMPUTE_CAPABILITY_MAJOR, COMPUTE_CAPABILITY_MINOR = 75, 76

MAX_GRID_BLOCKS = 2**31 - 1  # gridDim.x limit since compute capability 3.0

# Advice added to the driver's own text for the CUresults that need it.
_LOST_CONTEXT = ("the process's CUDA context is now unusable: restart the process to run "
                 "CUDA kernels again")
_HINTS = {
    209: "the cubin holds no code for this GPU: build it for the device's compute "
         "capability (device_properties()['compute_capability'], nvcc -arch=sm_XY)",
    **dict.fromkeys((700, 710, 714, 715, 716, 717, 718, 719), _LOST_CONTEXT),
}

CUdeviceptr = ctypes.c_uint64  # unsigned long long in cuda.h
_handle = ctypes.c_void_p  # CUcontext, CUmodule, CUfunction, CUevent, CUstream
_out = ctypes.POINTER
_int, _uint, _size = ctypes.c_int, ctypes.c_uint, ctypes.c_size_t

# Every entry point used, with its arguments; all return a CUresult (an int enum).
_SIGNATURES = {
    "cuGetErrorName": (_int, _out(ctypes.c_char_p)),
    "cuGetErrorString": (_int, _out(ctypes.c_char_p)),
    "cuInit": (_uint,),
    "cuDeviceGet": (_out(_int), _int),
    "cuDeviceGetName": (ctypes.c_char_p, _int, _int),
    "cuDeviceGetAttribute": (_out(_int), _int, _int),
    "cuDeviceTotalMem_v2": (_out(_size), _int),
    "cuDevicePrimaryCtxRetain": (_out(_handle), _int),
    "cuCtxGetCurrent": (_out(_handle),),
    "cuCtxSetCurrent": (_handle,),
    "cuCtxSynchronize": (),
    "cuModuleLoadData": (_out(_handle), ctypes.c_char_p),
    "cuModuleUnload": (_handle,),
    "cuModuleGetFunction": (_out(_handle), _handle, ctypes.c_char_p),
    "cuModuleGetGlobal_v2": (_out(CUdeviceptr), _out(_size), _handle, ctypes.c_char_p),
    "cuMemAlloc_v2": (_out(CUdeviceptr), _size),
    "cuMemFree_v2": (CUdeviceptr,),
    "cuMemcpyHtoD_v2": (CUdeviceptr, ctypes.c_void_p, _size),
    "cuMemcpyDtoH_v2": (ctypes.c_void_p, CUdeviceptr, _size),
    "cuMemsetD32_v2": (CUdeviceptr, _uint, _size),
    "cuLaunchKernel": (_handle, _uint, _uint, _uint, _uint, _uint, _uint, _uint, _handle,
                       _out(ctypes.c_void_p), _out(ctypes.c_void_p)),
    "cuEventCreate": (_out(_handle), _uint),
    "cuEventRecord": (_handle, _handle),
    "cuEventSynchronize": (_handle,),
    "cuEventElapsedTime_v2": (_out(ctypes.c_float), _handle, _handle),
    "cuEventDestroy_v2": (_handle,),
}
# Drivers before CUDA 12.8 have only the first version of these.
_FALLBACKS = {"cuEventElapsedTime_v2": "cuEventElapsedTime"}


class _Driver:
    """libcuda with its signatures declared, device 0 and its retained primary context."""

    def __init__(self, library):
        self.entries = {}
        for name, argtypes in _SIGNATURES.items():
            entry = getattr(library, name if hasattr(library, name)
                            else _FALLBACKS.get(name, name))
            entry.argtypes = argtypes
            entry.restype = ctypes.c_int
            self.entries[name] = entry
        self.call("cuInit", 0, error=DeviceUnavailableError)
        device = _int()
        self.call("cuDeviceGet", ctypes.byref(device), 0, error=DeviceUnavailableError)
        self.device = device.value
        self.context = _handle()
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(self.context), self.device,
                  error=DeviceUnavailableError)

    def call(self, name: str, *args, what: str = "", error: type = KernelError) -> None:
        """Calls ``name`` and raises ``error`` naming the call (``what``, when the name
        alone is not enough) where it does not return CUDA_SUCCESS."""
        result = self.entries[name](*args)
        if result != 0:
            raise error(self.describe(result, what or name))

    def describe(self, result: int, what: str) -> str:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        if self.entries["cuGetErrorName"](result, ctypes.byref(name)) != 0:
            return f"{what} failed with CUresult {result}, which this driver cannot name"
        self.entries["cuGetErrorString"](result, ctypes.byref(text))
        message = (f"{what} failed: {name.value.decode()} "
                   f"({(text.value or b'').decode()})")
        return message + (f"; {_HINTS[result]}" if result in _HINTS else "")

    def make_current(self) -> None:
        # A context is current per CPU thread: a thread that has not used CUDA yet, or
        # one another library switched, gets device 0's primary context back.
        current = _handle()
        self.call("cuCtxGetCurrent", ctypes.byref(current))
        if current.value != self.context.value:
            self.call("cuCtxSetCurrent", self.context)

    def attribute(self, code: int) -> int:
        value = _int()
        self.call("cuDeviceGetAttribute", ctypes.byref(value), code, self.device,
                  what=f"cuDeviceGetAttribute({code})")
        return value.value


def _open_library(name: str):
    return ctypes.CDLL(name)


_driver_lock = threading.Lock()
_DRIVER: _Driver | None = None  # set once the driver has started; failures are retried


def _load() -> _Driver:
    try:
        library = _open_library(LIBRARY)
    except OSError:
        raise DeviceUnavailableError(NO_DRIVER.format(library=LIBRARY)) from None
    try:
        return _Driver(library)
    except AttributeError as err:
        raise DeviceUnavailableError(f"the CUDA driver {LIBRARY} is too old for treadle: "
                                     f"{err}") from None
    except DeviceUnavailableError as err:
        raise DeviceUnavailableError(f"CUDA cannot run on this machine: {err}; treadle can "
                                     "build CUDA kernels here but not run them") from None


def _driver() -> _Driver:
    """The started driver, with its context current on the calling thread."""
    global _DRIVER
    with _driver_lock:
        if _DRIVER is None:
            _DRIVER = _load()
    _DRIVER.make_current()
    return _DRIVER


def available() -> bool:
    """Whether this machine can run CUDA kernels (a driver and at least one GPU)."""
    try:
        _driver()
    except DeviceUnavailableError:
        return False
    return True


def device_target() -> CudaTarget:
    """The target of this machine's GPU (device 0), its limits read from the driver;
    raises ``DeviceUnavailableError`` without one."""
    return described_target(device_properties())


def device_properties() -> dict:
    """Name, compute capability and limits of device 0, read from the driver."""
    driver = _driver()
    name = ctypes.create_string_buffer(256)
    driver.call("cuDeviceGetName", name, len(name), driver.device)
    total = _size()
    driver.call("cuDeviceTotalMem_v2", ctypes.byref(total), driver.device)
    return {"name": name.value.decode(),
            "compute_capability": (driver.attribute(COMPUTE_CAPABILITY_MAJOR),
                                   driver.attribute(COMPUTE_CAPABILITY_MINOR)),
            "total_memory": total.value,
            **{key: driver.attribute(code) for key, code in ATTRIBUTES.items()}}


def synchronize() -> None:
    """Waits for every launch and copy issued so far."""
    _driver().call("cuCtxSynchronize")


def copy_to_host(address: int, out: np.ndarray) -> None:
    """Copies ``out.nbytes`` bytes at device ``address`` into the C-contiguous ``out``."""
    if out.nbytes:
        _driver().call("cuMemcpyDtoH_v2", out.ctypes.data, address, out.nbytes)


class DeviceArray:
    """Device memory holding a C-contiguous array of ``shape`` and ``dtype``, freed by
    ``free()`` or when collected."""

    def __init__(self, shape: Sequence[int], dtype):
        self.address = 0  # set first: __del__ runs even when the allocation fails
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        address = CUdeviceptr()
        # cuMemAlloc rejects 0 bytes: an empty array has no memory and address 0.
        if self.nbytes:
            _driver().call("cuMemAlloc_v2", ctypes.byref(address), self.nbytes,
                           what=f"cuMemAlloc({self.nbytes} bytes)")
        self.address = address.value

    @classmethod
    def from_numpy(cls, array: np.ndarray) -> DeviceArray:
        device = cls(array.shape, array.dtype)
        device.copy_from(array)
        return device

    def copy_from(self, array: np.ndarray) -> None:
        """Copies a host array of this shape and dtype to the device."""
        self._check_host(array)
        if self.nbytes:
            _driver().call("cuMemcpyHtoD_v2", self.address, array.ctypes.data, self.nbytes)

    def to_numpy(self, out: np.ndarray | None = None) -> np.ndarray:
        """The contents as a new host array, or copied into ``out``."""
        out = np.empty(self.shape, self.dtype) if out is None else out
        self._check_host(out)
        if not out.flags.writeable:
            raise ArgumentError("DeviceArray.to_numpy: out is read-only")
        if self.nbytes:
            _driver().call("cuMemcpyDtoH_v2", out.ctypes.data, self.address, self.nbytes)
        return out

    def free(self) -> None:
        if self.address:
            address, self.address = self.address, 0
            _driver().call("cuMemFree_v2", address)

    def __del__(self):
        try:
            self.free()
        except TreadleError:
            pass  # at exit the driver may have been torn down before this array

    def _check_host(self, array: np.ndarray) -> None:
        if array.dtype != self.dtype:
            raise DTypeError(f"device array is {self.dtype}, host array {array.dtype}")
        if array.shape != self.shape:
            raise ShapeError(f"device array has shape {self.shape}, host array "
                             f"{array.shape}")
        if not array.flags.c_contiguous:
            raise ArgumentError("host array is not C-contiguous; pass "
                                "np.ascontiguousarray(...)")

    def __repr__(self) -> str:
        return f"DeviceArray({self.shape}, {self.dtype}, address={self.address:#x})"


class CudaModule:
    """A cubin loaded into the context: its kernels and device globals by symbol."""

    def __init__(self, cubin: bytes):
        self._handle = _handle()
        _driver().call("cuModuleLoadData", ctypes.byref(self._handle), bytes(cubin))

    def function(self, symbol: str) -> ctypes.c_void_p:
        """The CUfunction handle of the ``extern "C"`` kernel ``symbol``."""
        handle = _handle()
        _driver().call("cuModuleGetFunction", ctypes.byref(handle), self._handle,
                       symbol.encode(), what=f"cuModuleGetFunction({symbol})")
        return handle

    def global_address(self, symbol: str) -> int:
        """The device address of the ``__device__`` variable ``symbol``."""
        address, size = CUdeviceptr(), _size()
        _driver().call("cuModuleGetGlobal_v2", ctypes.byref(address), ctypes.byref(size),
                       self._handle, symbol.encode(), what=f"cuModuleGetGlobal({symbol})")
        return address.value

    def close(self) -> None:
        if self._handle.value:
            handle, self._handle = self._handle, _handle()
            _driver().call("cuModuleUnload", handle)

    def __del__(self):
        try:
            self.close()
        except TreadleError:
            pass  # at exit the driver may have been torn down before this module


class CudaKernel:
    """One kernel of a cubin: ``kernel(*arrays, **symbols)`` runs it like the CPU runtime.

    ``arrays`` are the buffer parameters in order, each a numpy array (copied to the
    device and, where the kernel stores to it, back in place), a ``DeviceArray`` or a CUDA
    tensor (``is_cuda`` and ``data_ptr()``, as PyTorch's: used where it lies, no copies).
    Arguments are checked like the CPU runtime's (``bind_arguments``) before any launch.
    ``function`` is the (lowered) Function the cubin was generated from: it gives the
    parameters, the assert messages and, unless ``launch`` = (blocks, threads per block)
    is given, the launch shape (``backend.cuda.launch_shape``).
    """

    def __init__(self, function: Function, cubin: bytes | CudaModule,
                 launch: tuple[Expr | int, int] | None = None):
        self.function = function
        self._scalars = [None if isinstance(p, Buffer) else _scalar_ctype(function, p)
                         for p in function.params]
        if launch is None:
            # Imported here: a kernel given its shape needs nothing from the compiler side.
            from treadle.backend.cuda import launch_shape
            launch = launch_shape(function)
        self.blocks, self.threads = as_expr(launch[0]), int(launch[1])
        self.module = cubin if isinstance(cubin, CudaModule) else CudaModule(cubin)
        self.symbol = c_name(function)
        self._entry = self.module.function(self.symbol)
        self._status = self.module.global_address(self.symbol + "__status")
        self._fault = self.module.global_address(fault_symbol(function))
        stored = {s.buffer for s in walk(function.body) if isinstance(s, Store)}
        self._written = [b in stored for b in function.buffers]
        self._asserts = [s for s in walk(function.body) if isinstance(s, Assert)]
        # The status word is one per kernel: a launch and the read of its status must not
        # interleave with another thread's.
        self._lock = threading.Lock()

    def __call__(self, *arrays, **symbols) -> None:
        values = bind_device_arguments(self.function, arrays, symbols)
        _check_overlap(self.function, arrays, self._written)
        with self._lock, _staged(arrays) as (addresses, copies):
            self.reset_status()
            self._launch(self._params(addresses, values), self._grid(values))
            _driver().call("cuCtxSynchronize")
            self.check_status()
            for array, copy, written in zip(arrays, copies, self._written):
                if copy is not None and written:
                    copy.to_numpy(out=array)

    def time(self, *arrays, repeat: int = 10, warmup: int = 3, **symbols) -> list[float]:
        """Milliseconds of each of ``repeat`` launches (after ``warmup`` untimed ones),
        measured with CUDA events on device-resident arguments: numpy arrays are copied to
        the device once and are not copied back. Raises KernelError if any launch failed
        an assert."""
        values = bind_device_arguments(self.function, arrays, symbols)
        _check_overlap(self.function, arrays, self._written)
        with self._lock, _staged(arrays) as (addresses, _), _events(2) as (start, end):
            params, blocks = self._params(addresses, values), self._grid(values)
            self.reset_status()
            for _ in range(warmup):
                self._launch(params, blocks)
            times = [self._timed_launch(params, blocks, start, end) for _ in range(repeat)]
            _driver().call("cuCtxSynchronize")
            self.check_status()
        return times

    def launch_unchecked(self, addresses: Sequence[int], values: Mapping[Var, Value]) -> None:
        """Launches on device addresses (the buffer parameters in order) and symbol values
        that the caller has checked, without waiting: a model's steps go back to back on
        the stream, and ``check_status`` after a ``synchronize`` reports a failed assert."""
        self._launch(self._params(addresses, values), self._grid(values))

    def _params(self, addresses: Sequence[int], values: Mapping[Var, Value]) -> list:
        pointers = iter(addresses)
        return [CUdeviceptr(next(pointers)) if ctype is None else ctype(values[p])
                for p, ctype in zip(self.function.params, self._scalars)]

    def _grid(self, values: Mapping[Var, Value]) -> int:
        blocks = evaluate(self.blocks, values)
        if blocks > MAX_GRID_BLOCKS:
            raise ArgumentError(f"kernel {self.function.name}: these sizes need a grid of "
                                f"{blocks} blocks, more than CUDA's {MAX_GRID_BLOCKS}")
        return max(blocks, 0)

    def _launch(self, params: list, blocks: int) -> None:
        if blocks == 0:
            return  # nothing to do, and cuLaunchKernel rejects an empty grid
        # kernelParams: one pointer per parameter to its value, copied at launch.
        pointers = (ctypes.c_void_p * len(params))(*(ctypes.addressof(p) for p in params))
        _driver().call("cuLaunchKernel", self._entry, blocks, 1, 1, self.threads, 1, 1, 0,
                       None, pointers, None,
                       what=f"cuLaunchKernel({self.symbol}, {blocks} blocks of "
                            f"{self.threads} threads)")

    def _timed_launch(self, params: list, blocks: int, start, end) -> float:
        driver = _driver()
        driver.call("cuEventRecord", start, None)
        self._launch(params, blocks)
        driver.call("cuEventRecord", end, None)
        driver.call("cuEventSynchronize", end)
        milliseconds = ctypes.c_float()
        driver.call("cuEventElapsedTime_v2", ctypes.byref(milliseconds), start, end)
        return milliseconds.value

    def reset_status(self) -> None:
        _driver().call("cuMemsetD32_v2", self._status, 0, 1)

    def check_status(self) -> None:
        status = ctypes.c_int32()
        _driver().call("cuMemcpyDtoH_v2", ctypes.addressof(status), self._status, 4)
        if status.value == 0:
            return
        k = status.value
        message = (self._asserts[k - 1].message if 0 < k <= len(self._asserts)
                   else f"unexpected status {k}")
        if "{value}" in message:
            fault = ctypes.c_int64()
            _driver().call("cuMemcpyDtoH_v2", ctypes.addressof(fault), self._fault, 8)
            message = fault_message(message, fault.value)
        raise KernelError(f"kernel {self.function.name}: {message}")

    def __repr__(self) -> str:
        return f"CudaKernel({self.function.name})"


def _scalar_ctype(func: Function, param: Var):
    if param.dtype.name not in CTYPES:
        raise IRError(f"{func.name}: scalar parameter {param.name} has dtype {param.dtype}, "
                      f"which cannot be passed to a CUDA kernel (supported: "
                      f"{', '.join(CTYPES)})")
    return CTYPES[param.dtype.name]


def _is_device(arg) -> bool:
    return isinstance(arg, DeviceArray) or getattr(arg, "is_cuda", False) is True


def bind_device_arguments(func: Function, arrays: Sequence,
                          symbols: Mapping[str, Value]) -> dict[Var, Value]:
    """``bind_arguments`` for a CUDA call: device arguments are checked by their shape and
    dtype like numpy arrays, so a wrong-sized one never reaches a kernel."""
    return bind_arguments(func, [_stand_in(a) if _is_device(a) else a for a in arrays],
                          symbols)


def _stand_in(arg) -> np.ndarray:
    """A numpy array with a device argument's shape and dtype, for bind_arguments, which
    reads only an array's metadata: its C-contiguous strides run over one element, so its
    memory must never be read."""
    if isinstance(arg, DeviceArray):
        shape, dtype = arg.shape, arg.dtype
    else:
        _check_tensor(arg)
        shape, dtype = tuple(arg.shape), _tensor_dtype(arg)
    return np.lib.stride_tricks.as_strided(np.empty(1, dtype), shape,
                                           _c_strides(shape, dtype.itemsize))


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


def _check_tensor(tensor) -> None:
    # Kernels index buffers as dense row-major arrays on device 0, the context's device.
    if not tensor.is_contiguous():
        raise ArgumentError(f"CUDA tensor of shape {tuple(tensor.shape)} is not contiguous; "
                            "pass tensor.contiguous()")
    if tensor.get_device() != 0:
        raise ArgumentError(f"CUDA tensor is on cuda:{tensor.get_device()}; treadle runs "
                            "kernels on cuda:0")


def _tensor_dtype(tensor) -> np.dtype:
    name = str(tensor.dtype).removeprefix("torch.")
    if name == "bfloat16":
        return np.dtype(np.uint16)  # treadle keeps bfloat16 as its raw bits (DataType.numpy)
    try:
        return np.dtype(name)
    except TypeError:
        raise DTypeError(f"CUDA tensor dtype {tensor.dtype} has no treadle dtype") from None


def _device_address(arg) -> int:
    return arg.address if isinstance(arg, DeviceArray) else arg.data_ptr()


def _span(arg) -> tuple[bool, int, int]:
    """(on the device, first byte, end) of an argument's memory."""
    if isinstance(arg, np.ndarray):
        return False, arg.ctypes.data, arg.ctypes.data + arg.nbytes
    start = _device_address(arg)
    size = arg.nbytes if isinstance(arg, DeviceArray) else arg.numel() * arg.element_size()
    return True, start, start + size


def _check_overlap(func: Function, arrays: Sequence, written: Sequence[bool]) -> None:
    # Kernels take __restrict__ pointers; numpy arguments are checked too, so a call
    # that would be wrong on the CPU is rejected here as well.
    names = [b.name for b in func.buffers]
    spans = [_span(a) for a in arrays]
    for i, (device, start, end) in enumerate(spans):
        for j, (other_device, other_start, other_end) in enumerate(spans):
            if (written[i] and i != j and device == other_device and start < other_end
                    and other_start < end):
                raise ArgumentError(f"argument {names[i]!r} of {func.name} is written but "
                                    f"shares memory with argument {names[j]!r}; pass a "
                                    "separate array")


@contextmanager
def _staged(arrays: Sequence) -> Iterator[tuple[list[int], list[DeviceArray | None]]]:
    """The device address of every argument, numpy arrays copied to fresh device memory
    (the copies come second, None for device arguments) and freed on exit."""
    copies: list[DeviceArray | None] = []
    try:
        for array in arrays:
            copies.append(DeviceArray.from_numpy(array) if isinstance(array, np.ndarray)
                          else None)
        yield ([_device_address(c if c is not None else a) for a, c in zip(arrays, copies)],
               copies)
    finally:
        for copy in copies:
            if copy is not None:
                copy.free()


@contextmanager
def _events(count: int) -> Iterator[list]:
    driver = _driver()
    events = []
    try:
        for _ in range(count):
            events.append(_handle())
            driver.call("cuEventCreate", ctypes.byref(events[-1]), 0)  # CU_EVENT_DEFAULT
        yield events
    finally:
        for event in events:
            if event.value:
                driver.call("cuEventDestroy_v2", event)
