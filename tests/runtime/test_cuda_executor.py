"""Whole models compiled for CUDA: their kernels built by nvcc, their numbers from the GPU
simulator (and the GPU, where there is one) against the CPU build of the same model and
numpy, saved and loaded like CPU models."""
import ctypes

import numpy as np
import pytest

import treadle
from tests.harness import random_array
from treadle import ops
from treadle.errors import DeviceUnavailableError
from treadle.ir.functor import evaluate
from treadle.runtime import cuda as cuda_runtime
from treadle.runtime.cuda_executor import CudaExecutable
from treadle.runtime.simulate import simulate


def small_cnn(batch="N"):
    """conv 3x3 (padding 1) + bias, ReLU, max pool, another conv, global average pool,
    a dense layer and softmax: GEMM-template kernels with prologues and epilogues, and
    rule-based ones with row reductions."""
    rng = np.random.default_rng(0)
    x = ops.input("x", "float32", [batch, 3, 11, 9])
    w1 = ops.constant(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w1")
    b1 = ops.constant(rng.standard_normal(8).astype(np.float32), "b1")
    w2 = ops.constant(rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2, "w2")
    dense = ops.constant(rng.standard_normal((10, 16)).astype(np.float32), "dense")
    y = ops.relu(ops.conv2d(x, w1, b1, padding=1))
    y = ops.max_pool2d(y, 2)
    y = ops.relu(ops.conv2d(y, w2, stride=2, padding=1))
    y = ops.reshape(ops.global_avg_pool(y), [-1, 16])
    return ops.graph([x], [ops.softmax(ops.linear(y, dense))], "small_cnn")


def attention_block():
    """Layer norm, a projection, scores over a symbolic sequence, softmax, the weighted
    sum: batched products with both operands computed, and row reductions."""
    rng = np.random.default_rng(1)
    x = ops.input("x", "float32", [2, "seq", 16])
    gamma = ops.constant(rng.standard_normal(16).astype(np.float32), "gamma")
    wq = ops.constant(rng.standard_normal((16, 16)).astype(np.float32) * 0.25, "wq")
    h = ops.layer_norm(x, gamma)
    q = ops.matmul(h, wq)
    scores = ops.matmul(q, ops.transpose(h, [0, 2, 1]))
    return ops.graph([x], [ops.matmul(ops.softmax(scores), h)], "attention")


@pytest.mark.parametrize("build, shapes", [(small_cnn, [(1, 3, 11, 9), (3, 3, 11, 9)]),
                                           (attention_block, [(2, 1, 16), (2, 7, 16)])],
                         ids=["cnn", "attention"])
def test_simulated_cuda_model_matches_the_cpu_build(build, shapes):
    graph = build()
    gpu = treadle.compile(graph, target="cuda:sm_80")
    cpu = treadle.compile(graph)
    assert isinstance(gpu.executable, CudaExecutable)
    for shape in shapes:
        x = random_array(shape, seed=sum(shape))
        (expected,) = cpu(x)
        (actual,) = gpu.executable.simulate(x)
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)


def test_cuda_model_saves_and_loads_without_a_gpu(tmp_path):
    gpu = treadle.compile(small_cnn(), target="cuda:sm_90")
    gpu.save(tmp_path / "model")
    loaded = treadle.load(tmp_path / "model")
    assert isinstance(loaded.executable, CudaExecutable) and loaded.executable.arch == "sm_90"
    assert list((tmp_path / "model").glob("*.cubin"))
    x = random_array((2, 3, 11, 9), seed=4)
    np.testing.assert_array_equal(loaded.executable.simulate(x)[0], gpu.executable.simulate(x)[0])
    if not cuda_runtime.available():
        with pytest.raises(DeviceUnavailableError, match="no CUDA driver"):
            loaded(x)


def test_unknown_targets_are_refused_by_name():
    with pytest.raises(ValueError, match="'cpu', 'cuda' or 'cuda:<arch>'"):
        treadle.compile(small_cnn(), target="tpu")
    with pytest.raises(ValueError, match="unknown CUDA architecture"):
        treadle.compile(small_cnn(), target="cuda:sm_12")


@pytest.mark.skipif(not cuda_runtime.available(), reason="needs a GPU and its driver")
@pytest.mark.parametrize("build, shape", [(small_cnn, (5, 3, 11, 9)), (attention_block, (2, 33, 16))],
                         ids=["cnn", "attention"])
def test_on_the_gpu_cuda_model_matches_the_cpu_build(build, shape):
    graph = build()
    gpu, cpu = treadle.compile(graph, target="cuda"), treadle.compile(graph)
    x = random_array(shape, seed=9)
    for _ in range(2):  # the second call reuses the device arena and constants
        np.testing.assert_allclose(gpu(x)[0], cpu(x)[0], rtol=1e-4, atol=1e-5)


class _HostArray:
    """Host memory standing in for device memory: an address the kernels are given."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(int(d) for d in shape), np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self.memory = np.full(self.nbytes + 256, 0xFF, np.uint8)  # garbage: NaN as a float
        self.address = self.memory.ctypes.data + (-self.memory.ctypes.data) % 256

    @classmethod
    def from_numpy(cls, array):
        host = cls(array.shape, array.dtype)
        ctypes.memmove(host.address, array.ctypes.data, array.nbytes)
        return host


class _SimulatedKernel:
    """A launch run by the simulator on the buffers at the addresses it is given."""

    def __init__(self, function, module):
        self.function = function

    def reset_status(self):
        pass

    def check_status(self):
        pass

    def launch_unchecked(self, addresses, values):
        arrays = []
        for buffer, address in zip(self.function.buffers, addresses):
            shape = tuple(int(evaluate(d, values)) for d in buffer.shape)
            count = int(np.prod(shape))
            nbytes = max(count * buffer.dtype.numpy.itemsize, 1)
            raw = (ctypes.c_char * nbytes).from_address(address)
            arrays.append(np.frombuffer(raw, buffer.dtype.numpy, count).reshape(shape))
        simulate(self.function, *arrays, **{v.name: x for v, x in values.items()})


@pytest.mark.parametrize("build, shape",
                         [(small_cnn, (2, 3, 11, 9)), (attention_block, (2, 5, 16))],
                         ids=["cnn", "attention"])
def test_device_path_with_host_memory_and_the_simulator(build, shape, monkeypatch):
    """The GPU call path (arena offsets, constants uploaded once, views, outputs copied
    back) with host memory for the device's and the simulator for the launches."""
    monkeypatch.setattr(cuda_runtime, "DeviceArray", _HostArray)
    monkeypatch.setattr(cuda_runtime, "CudaKernel", _SimulatedKernel)
    monkeypatch.setattr(cuda_runtime, "CudaModule", lambda cubin: None)
    monkeypatch.setattr(cuda_runtime, "synchronize", lambda: None)
    monkeypatch.setattr(cuda_runtime, "copy_to_host",
                        lambda address, out: ctypes.memmove(out.ctypes.data, address, out.nbytes))
    graph = build()
    gpu, cpu = treadle.compile(graph, target="cuda:sm_80"), treadle.compile(graph)
    x = random_array(shape, seed=3)
    for _ in range(2):
        np.testing.assert_allclose(gpu(x)[0], cpu(x)[0], rtol=1e-4, atol=1e-5)
    assert [s.name for s, _ in gpu.executable.trace(x)] == [
        s.name for s in gpu.executable.steps if s.kernel is not None]
