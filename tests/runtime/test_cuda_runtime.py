"""The CUDA runtime: its errors on a machine without a driver or GPU (run everywhere),
argument checks of device arguments, and, where a GPU is present, hand-written kernels
launched through the driver and compared with numpy."""
from __future__ import annotations

import shutil
import subprocess
import sys
import types
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from treadle.config import config
from treadle.errors import (ArgumentError, DeviceUnavailableError, DTypeError, KernelError,
                            ShapeError)
from treadle.ir import dtypes
from treadle.ir.builder import FunctionBuilder
from treadle.ir.expr import cast, ceil_div
from treadle.runtime import cuda
from treadle.runtime.cuda import CudaKernel, CudaModule, DeviceArray

THREADS = 128

# Kernels with treadle's ABI (backend.cuda): parameters in Function order, and the status
# and fault globals an Assert failure writes (status = the assert's 1-based number).
SOURCE = r"""
#include <stdint.h>

__device__ int32_t kernel_axpy__status;
__device__ int64_t kernel_axpy__fault;

extern "C" __global__ void kernel_axpy(int64_t n, const float *__restrict__ x,
                                       float *__restrict__ y, float a) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

__device__ int32_t kernel_gather__status;
__device__ int64_t kernel_gather__fault;

__device__ void gather_fail(int32_t code, int64_t value) {
    if (atomicCAS(&kernel_gather__status, 0, code) == 0) kernel_gather__fault = value;
}

extern "C" __global__ void kernel_gather(int64_t n, int64_t m,
                                         const int32_t *__restrict__ index,
                                         const float *__restrict__ table,
                                         float *__restrict__ out) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int64_t k = index[i];
    if (!(k >= 0)) { gather_fail(1, k); return; }
    if (!(k < m)) { gather_fail(2, k); return; }
    out[i] = table[k];
}
"""


def _axpy():
    """y[i] = a * x[i] + y[i], one thread per element."""
    with FunctionBuilder("axpy") as fb:
        n = fb.symbol("n")
        x = fb.param("x", "float32", [n])
        y = fb.param("y", "float32", [n])
        a = fb.symbol("a", dtypes.float32)
        for b in fb.range(ceil_div(n, THREADS), kind="blocks", name="b"):
            for t in fb.range(THREADS, kind="threads", name="t"):
                i = b * THREADS + t
                with fb.if_(i < n):
                    y[i] = a * x[i] + y[i]
    return fb.function


def _gather():
    """out[i] = table[index[i]], each index checked by two asserts."""
    with FunctionBuilder("gather") as fb:
        n, m = fb.symbol("n"), fb.symbol("m")
        index = fb.param("index", "int32", [n])
        table = fb.param("table", "float32", [m])
        out = fb.param("out", "float32", [n])
        for b in fb.range(ceil_div(n, THREADS), kind="blocks", name="b"):
            for t in fb.range(THREADS, kind="threads", name="t"):
                i = b * THREADS + t
                with fb.if_(i < n):
                    k = cast(index[i], "int64")
                    fb.assert_(k >= 0, "index {value} is negative", value=k)
                    fb.assert_(k < m, "index {value} is past the table's end", value=k)
                    out[i] = table[k]
    return fb.function


def _shape(func):
    return ceil_div(func.symbols[0], THREADS), THREADS


def _nvcc() -> str | None:
    return shutil.which(config.nvcc)


def _compile(tmp_path, arch: str) -> bytes:
    source, cubin = tmp_path / "kernels.cu", tmp_path / "kernels.cubin"
    source.write_text(SOURCE)
    subprocess.run([_nvcc(), "-cubin", f"-arch={arch}", "-o", str(cubin), str(source)],
                   check=True, capture_output=True)
    return cubin.read_bytes()


needs_nvcc = pytest.mark.skipif(_nvcc() is None, reason="no nvcc on this machine")
needs_gpu = pytest.mark.skipif(not cuda.available(), reason="no CUDA driver or GPU")


# ---- without a GPU ---------------------------------------------------------------------

@pytest.fixture
def no_driver(monkeypatch):
    """The runtime as on a machine without libcuda, whatever this one has."""
    monkeypatch.setattr(cuda, "_DRIVER", None)
    monkeypatch.setattr(cuda, "LIBRARY", "libcuda-treadle-test-missing.so.1")


def test_without_a_driver_nothing_runs_and_says_why(no_driver):
    assert not cuda.available()
    message = r"no CUDA driver \(libcuda-treadle-test-missing.so.1\).*build CUDA kernels " \
              r"here but not run them"
    with pytest.raises(DeviceUnavailableError, match=message):
        cuda.device_properties()
    with pytest.raises(DeviceUnavailableError, match=message):
        CudaKernel(_axpy(), b"\x7fELF", launch=_shape(_axpy()))
    with pytest.raises(DeviceUnavailableError, match=message):
        CudaModule(b"\x7fELF")
    with pytest.raises(DeviceUnavailableError, match=message):
        DeviceArray((4,), np.float32)


class _FakeLibrary:
    """A libcuda whose cuInit fails with ``result`` (named like the real driver names
    CUDA_ERROR_NO_DEVICE); ``missing`` is an entry point it lacks."""

    def __init__(self, result: int, missing: str = ""):
        self.result, self.missing = result, missing

    def __getattr__(self, name: str):
        if name == self.missing:
            raise AttributeError(f"undefined symbol: {name}")
        texts = {"cuGetErrorName": b"CUDA_ERROR_NO_DEVICE",
                 "cuGetErrorString": b"no CUDA-capable device is detected"}

        def entry(*args):
            if name in texts:
                args[1]._obj.value = texts[name]  # the byref(c_char_p) out-parameter
                return 0
            return self.result if name == "cuInit" else 0
        return entry


def test_without_a_device_the_driver_error_is_reported(monkeypatch):
    monkeypatch.setattr(cuda, "_DRIVER", None)
    monkeypatch.setattr(cuda, "_open_library", lambda name: _FakeLibrary(100))
    assert not cuda.available()
    with pytest.raises(DeviceUnavailableError,
                       match=r"cuInit failed: CUDA_ERROR_NO_DEVICE \(no CUDA-capable device "
                             r"is detected\); treadle can build CUDA kernels here"):
        cuda.device_properties()


def test_a_driver_without_an_entry_point_is_too_old(monkeypatch):
    monkeypatch.setattr(cuda, "_DRIVER", None)
    monkeypatch.setattr(cuda, "_open_library",
                        lambda name: _FakeLibrary(0, missing="cuModuleGetGlobal_v2"))
    with pytest.raises(DeviceUnavailableError, match="too old.*cuModuleGetGlobal_v2"):
        cuda.device_properties()


class _FakeTensor:
    """The parts of a CUDA torch.Tensor the runtime reads."""
    is_cuda = True

    def __init__(self, shape, dtype="torch.float32", address=1 << 32, contiguous=True,
                 device=0, itemsize=4):
        self.shape, self.dtype, self.address = shape, dtype, address
        self.contiguous, self.device, self.itemsize = contiguous, device, itemsize

    def is_contiguous(self) -> bool:
        return self.contiguous

    def get_device(self) -> int:
        return self.device

    def data_ptr(self) -> int:
        return self.address

    def numel(self) -> int:
        return int(np.prod(self.shape))

    def element_size(self) -> int:
        return self.itemsize


def test_device_arguments_are_checked_like_numpy_arrays():
    func = _axpy()
    n = func.symbols[0]
    values = cuda.bind_device_arguments(func, [_FakeTensor((1000,)), _FakeTensor((1000,))],
                                        {"a": 2})
    assert values[n] == 1000 and values[func.symbols[1]] == 2.0
    with pytest.raises(ShapeError, match=r"argument 'y'.*expected shape \[n\] = \[1000\], "
                                         r"got \(999,\)"):
        cuda.bind_device_arguments(func, [_FakeTensor((1000,)), _FakeTensor((999,))],
                                   {"a": 2})
    with pytest.raises(ShapeError, match="expected rank 1"):
        cuda.bind_device_arguments(func, [_FakeTensor((10, 100)), _FakeTensor((1000,))],
                                   {"a": 2})
    with pytest.raises(DTypeError, match="expected dtype float32, got float64"):
        cuda.bind_device_arguments(func, [_FakeTensor((8,), "torch.float64"),
                                          _FakeTensor((8,))], {"a": 2})
    with pytest.raises(DTypeError, match="float8_e4m3fn"):
        cuda.bind_device_arguments(func, [_FakeTensor((8,), "torch.float8_e4m3fn"),
                                          _FakeTensor((8,))], {"a": 2})
    with pytest.raises(ArgumentError, match="not contiguous"):
        cuda.bind_device_arguments(func, [_FakeTensor((8,), contiguous=False),
                                          _FakeTensor((8,))], {"a": 2})
    with pytest.raises(ArgumentError, match="cuda:1"):
        cuda.bind_device_arguments(func, [_FakeTensor((8,), device=1), _FakeTensor((8,))],
                                   {"a": 2})


def test_a_written_argument_may_not_overlap_another():
    func = _axpy()
    x, y = _FakeTensor((8,), address=4096), _FakeTensor((8,), address=4096 + 16)
    with pytest.raises(ArgumentError, match="'y' of axpy is written but shares memory"):
        cuda._check_overlap(func, [x, y], [False, True])
    cuda._check_overlap(func, [x, _FakeTensor((8,), address=4096 + 32)], [False, True])
    # A host array and a device pointer live in different address spaces.
    host = np.zeros(8, np.float32)
    cuda._check_overlap(func, [host, _FakeTensor((8,), address=host.ctypes.data)],
                        [False, True])


@needs_nvcc
def test_the_test_kernels_compile_with_unmangled_symbols(tmp_path):
    cubin = _compile(tmp_path, "sm_80")
    assert cubin[:4] == b"\x7fELF"
    for symbol in (b"kernel_axpy", b"kernel_gather", b"kernel_gather__status",
                   b"kernel_gather__fault"):
        assert b"\0" + symbol + b"\0" in cubin  # in the string table, as the runtime asks


# ---- with a GPU ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cubin(tmp_path_factory):
    if not cuda.available() or _nvcc() is None:
        pytest.skip("needs a CUDA GPU and nvcc")
    major, minor = cuda.device_properties()["compute_capability"]
    return _compile(tmp_path_factory.mktemp("cuda"), f"sm_{major}{minor}")


@pytest.fixture(scope="module")
def module(cubin):
    return CudaModule(cubin)


@pytest.fixture(scope="module")
def axpy(module):
    return CudaKernel(_axpy(), module, launch=_shape(_axpy()))


@pytest.fixture(scope="module")
def gather(module):
    return CudaKernel(_gather(), module, launch=_shape(_gather()))


@needs_gpu
def test_device_properties():
    props = cuda.device_properties()
    assert props["name"] and props["compute_capability"] >= (7, 0)
    assert props["warp_size"] == 32 and props["max_threads_per_block"] == 1024
    assert props["multiprocessor_count"] > 0 and props["l2_cache_size"] > 0
    assert props["max_shared_memory_per_block"] == 48 * 1024
    assert props["max_shared_memory_per_block_optin"] >= props["max_shared_memory_per_block"]
    assert props["max_shared_memory_per_multiprocessor"] >= \
        props["max_shared_memory_per_block_optin"]
    assert props["max_registers_per_block"] >= 32 * 1024
    assert props["max_registers_per_multiprocessor"] >= props["max_registers_per_block"]
    assert props["clock_rate_khz"] > 0 and props["total_memory"] > 1 << 30


@needs_gpu
@pytest.mark.parametrize("n", [1, 127, 128, 1000, 100_003])
def test_numpy_arguments_run_and_outputs_come_back_in_place(axpy, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    x_before, expected = x.copy(), np.float32(1.5) * x + y
    axpy(x, y, a=1.5)
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(x, x_before)


@needs_gpu
def test_an_empty_grid_launches_nothing(axpy):
    x, y = np.zeros(0, np.float32), np.zeros(0, np.float32)
    axpy(x, y, a=1.0)


@needs_gpu
def test_the_launch_shape_comes_from_the_backend(cubin, monkeypatch):
    calls = []
    backend = types.ModuleType("treadle.backend.cuda")
    backend.launch_shape = lambda func: calls.append(func.name) or _shape(func)
    monkeypatch.setitem(sys.modules, "treadle.backend.cuda", backend)
    kernel = CudaKernel(_axpy(), cubin)
    x, y = np.ones(300, np.float32), np.ones(300, np.float32)
    kernel(x, y, a=2.0)
    assert calls == ["axpy"] and np.all(y == 3.0)


@needs_gpu
def test_a_failed_assert_is_a_kernel_error_with_its_message(gather):
    table = np.arange(4, dtype=np.float32) * 10
    out = np.zeros(300, np.float32)
    index = np.zeros(300, np.int32)
    index[257] = 7
    with pytest.raises(KernelError, match="kernel gather: index 7 is past the table's end"):
        gather(index, table, out)
    index[257] = -3
    with pytest.raises(KernelError, match="kernel gather: index -3 is negative"):
        gather(index, table, out)
    # The status is reset before each launch: a good call after failed ones succeeds.
    index = (np.arange(300) % 4).astype(np.int32)
    gather(index, table, out)
    np.testing.assert_array_equal(out, table[index])


@needs_gpu
def test_device_arrays_round_trip_and_are_kernel_arguments(axpy):
    host = np.arange(1000, dtype=np.float32)
    x, y = DeviceArray.from_numpy(host), DeviceArray.from_numpy(np.ones(1000, np.float32))
    np.testing.assert_array_equal(x.to_numpy(), host)
    axpy(x, y, a=2.0)
    np.testing.assert_array_equal(y.to_numpy(), host * 2 + 1)
    with pytest.raises(ShapeError, match="expected shape"):
        axpy(x, DeviceArray((999,), np.float32), a=2.0)
    with pytest.raises(DTypeError):
        axpy(x, DeviceArray((1000,), np.float64), a=2.0)
    empty = DeviceArray((0, 3), np.float32)
    assert empty.address == 0 and empty.to_numpy().shape == (0, 3)
    x.free()
    x.free()  # freeing twice is harmless


@needs_gpu
def test_calls_from_other_threads(axpy):
    def work(seed: int) -> bool:
        rng = np.random.default_rng(seed)
        x = rng.standard_normal(5000).astype(np.float32)
        y = np.zeros(5000, np.float32)
        axpy(x, y, a=3.0)
        return bool(np.allclose(y, 3 * x, rtol=1e-6))
    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(work, range(16)))


@needs_gpu
def test_time_reports_each_launch_and_leaves_numpy_arrays(axpy):
    x, y = np.ones(1 << 20, np.float32), np.zeros(1 << 20, np.float32)
    times = axpy.time(x, y, a=2.0, repeat=5, warmup=2)
    assert len(times) == 5 and all(0 < t < 1000 for t in times)
    assert not y.any()


@needs_gpu
def test_time_raises_a_failed_assert(gather):
    with pytest.raises(KernelError, match="index 9 is past"):
        gather.time(np.full(10, 9, np.int32), np.zeros(4, np.float32),
                    np.zeros(10, np.float32), repeat=2)


@needs_gpu
def test_a_grid_over_the_limit_is_refused(module):
    func = _axpy()
    kernel = CudaKernel(func, module, launch=(func.symbols[0] * (1 << 32), THREADS))
    with pytest.raises(ArgumentError, match="more than CUDA's 2147483647"):
        kernel(np.ones(1, np.float32), np.ones(1, np.float32), a=1.0)


@needs_gpu
def test_a_missing_kernel_names_its_symbol(module):
    with FunctionBuilder("missing") as fb:
        fb.symbol("n")
    with pytest.raises(KernelError, match=r"cuModuleGetFunction\(kernel_missing\) failed: "
                                          r"CUDA_ERROR_NOT_FOUND"):
        CudaKernel(fb.function, module, launch=(1, 1))


@needs_gpu
@needs_nvcc
def test_a_cubin_for_another_architecture_is_refused(tmp_path):
    major, _ = cuda.device_properties()["compute_capability"]
    other = _compile(tmp_path, "sm_80" if major != 8 else "sm_90")
    with pytest.raises(KernelError, match="cuModuleLoadData failed"):
        CudaModule(other)


def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


@needs_gpu
def test_torch_tensors_are_used_in_place(axpy):
    torch = _torch_cuda()
    x = torch.arange(1000, dtype=torch.float32, device="cuda")
    y = torch.ones(1000, dtype=torch.float32, device="cuda")
    axpy(x, y, a=2.0)
    np.testing.assert_array_equal(y.cpu().numpy(), np.arange(1000) * 2 + 1)
    with pytest.raises(ShapeError):
        axpy(x, torch.ones(999, device="cuda"), a=2.0)
    with pytest.raises(DTypeError):
        axpy(x, torch.ones(1000, dtype=torch.float64, device="cuda"), a=2.0)
    with pytest.raises(ArgumentError, match="not contiguous"):
        axpy(x, torch.ones(2000, device="cuda")[::2], a=2.0)
    with pytest.raises(ArgumentError, match="shares memory"):
        axpy(x, x, a=2.0)
    times = axpy.time(x, y, a=2.0, repeat=3)
    assert len(times) == 3


@needs_gpu
def test_errors_are_named_by_the_driver():
    # A real illegal access would make the context unusable for the tests after it.
    message = cuda._driver().describe(700, "cuCtxSynchronize")
    assert message.startswith("cuCtxSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS (")
    assert message.endswith("restart the process to run CUDA kernels again")
