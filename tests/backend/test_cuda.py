"""The CUDA printer, nvcc builds and their cache, and the resource limits kernels are held
to; numerical agreement lives with the templates' tests (through the simulator)."""
from types import SimpleNamespace

import pytest

from treadle.backend import cuda
from treadle.backend import build as build_module
from treadle.backend.build import build_with
from treadle.backend.cuda import (Resources, build_cuda, check_resources, generate_cuda,
                                  launch_shape, parse_resources)
from treadle.config import override
from treadle.errors import CompileError, IRError
from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import float32, float64
from treadle.ir.expr import call, eq
from treadle.ir.lower import lower
from treadle.target.cuda import ARCHS, cuda_target


def block_sum(name="block_sum", threads=128, local_name="s"):
    """out[b] = sum of a[b*threads : (b+1)*threads] by a tree in shared memory."""
    with FunctionBuilder(name) as fb:
        n = fb.symbol("n")
        a = fb.param("a", float32, [n])
        out = fb.param("out", float32, [(n + threads - 1) // threads])
        for b in fb.range((n + threads - 1) // threads, kind="blocks", name="b"):
            s = fb.buffer(local_name, float32, [threads], scope="shared")
            for t in fb.range(threads, kind="threads", name="t"):
                i = b * threads + t
                with fb.if_(i < n):
                    s[t] = a[i]
                with fb.else_():
                    s[t] = 0.0
                fb.barrier()
                step = threads // 2
                while step:
                    with fb.if_(t < step):
                        s[t] = s[t] + s[t + step]
                    fb.barrier()
                    step //= 2
                with fb.if_(eq(t, 0)):
                    out[b] = s[0]
    return lower(fb.function, cuda_target())


def test_printer_spells_workers_shared_memory_and_barriers():
    source = generate_cuda([block_sum()])
    assert 'extern "C" __global__ void __launch_bounds__(128) kernel_block_sum(' in source
    assert "(int64_t)blockIdx.x" in source and "(int64_t)threadIdx.x" in source
    assert "__shared__ __align__(16) float s[128];" in source
    assert source.count("__syncthreads();") == 8
    assert "float *__restrict__ out" in source and "const float *__restrict__ a" in source


def test_cxx_keywords_and_cuda_builtins_are_not_names():
    source = generate_cuda([block_sum(local_name="threadIdx")])
    assert "float threadIdx[" not in source and "float threadIdx_[128]" in source


def test_launch_shape_is_the_worker_loops_extents():
    blocks, threads = launch_shape(block_sum(threads=64))
    assert threads == 64 and "n" in str(blocks)


def test_launch_shape_refuses_kernels_without_workers():
    with FunctionBuilder("serial") as fb:
        a = fb.param("a", float32, [4])
        for i in fb.range(4):
            a[i] = 0.0
    with pytest.raises(IRError, match="one blocks loop and one threads loop"):
        launch_shape(fb.function)


def test_parse_resources_reads_ptxas_report():
    log = """ptxas info    : Compiling entry function 'kernel_a' for 'sm_80'
ptxas info    : Function properties for kernel_a
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 4096 bytes smem, 380 bytes cmem[0]
ptxas info    : Compiling entry function 'kernel_b' for 'sm_80'
ptxas info    : Function properties for kernel_b
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, 376 bytes cmem[0]"""
    assert parse_resources(log) == {"kernel_a": Resources(40, 4096, 16, 12),
                                    "kernel_b": Resources(12, 0, 0, 0)}


def test_resources_over_the_limits_are_refused():
    func, target = block_sum(threads=128), cuda_target("sm_80")
    check_resources(func, Resources(255, 48 * 1024, 0, 0), target)
    with pytest.raises(CompileError, match="registers x 128 threads"):
        check_resources(func, Resources(255, 0, 0, 0), SimpleNamespace(
            arch="sm_80", registers_per_block=16384, shared_bytes_per_block=48 * 1024))
    with pytest.raises(CompileError, match="bytes of shared memory"):
        check_resources(func, Resources(32, 64 * 1024, 0, 0), target)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_nvcc_builds_for_every_architecture(arch, tmp_path):
    with override(cache_dir=tmp_path):
        binary = build_cuda([block_sum()], cuda_target(arch), "block_sum")
    assert binary.cubin[:4] == b"\x7fELF"
    used = binary.resources["kernel_block_sum"]
    assert used.shared_bytes == 128 * 4 and 0 < used.registers <= 255


def test_build_is_cached_and_a_corrupt_entry_is_rebuilt(tmp_path, monkeypatch):
    func, target = block_sum(), cuda_target()
    with override(cache_dir=tmp_path):
        first = build_cuda([func], target, "block_sum")
        calls = []
        real_run = build_module.subprocess.run
        monkeypatch.setattr(build_module.subprocess, "run",
                            lambda cmd, **kw: calls.append(cmd) or real_run(cmd, **kw))
        assert build_cuda([func], target, "block_sum").cubin == first.cubin
        assert not any("-cubin" in c for c in calls)  # only `nvcc --version`
        (cubin,) = tmp_path.glob("kernels/*/kernel.cubin")
        cubin.write_bytes(b"truncated")
        assert build_cuda([func], target, "block_sum").cubin == first.cubin
        assert any("-cubin" in c for c in calls)


def test_nvcc_failure_is_a_compile_error_with_its_log(tmp_path):
    with override(cache_dir=tmp_path), pytest.raises(CompileError, match="nvcc failed") as err:
        build_with(cuda.cuda_toolchain(cuda_target()), "this is not CUDA;", "broken")
    assert "error" in str(err.value)


def test_missing_nvcc_is_a_clear_error(tmp_path):
    with override(cache_dir=tmp_path, nvcc=str(tmp_path / "no-nvcc")):
        with pytest.raises(CompileError, match="cannot run nvcc"):
            build_cuda([block_sum()], cuda_target(), "block_sum")


def test_a_buffer_read_back_across_a_barrier_is_not_restrict():
    """nvcc hoists a __restrict__ load above __syncthreads(), so a value one thread writes
    for the others would be read stale: such buffers lose the qualifier, others keep it."""
    with FunctionBuilder("broadcast") as fb:
        a = fb.param("a", float32, [32])
        total = fb.param("total", float32, [1])
        out = fb.param("out", float32, [32])
        for b in fb.range(1, kind="blocks", name="b"):
            for t in fb.range(32, kind="threads", name="t"):
                with fb.if_(eq(t, 0)):
                    total[0] = a[0]
                fb.barrier()
                out[t] = a[t] + total[0]
    source = generate_cuda([lower(fb.function, cuda_target())])
    assert "float *total" in source and "__restrict__ total" not in source
    assert "const float *__restrict__ a" in source and "float *__restrict__ out" in source


def test_fmod_is_cuda_fmod_in_each_precision(tmp_path):
    """The exact remainder is CUDA's fmodf / fmod, which nvcc builds."""
    with FunctionBuilder("remainders") as fb:
        a = fb.param("a", float32, [32])
        b = fb.param("b", float64, [32])
        out_a = fb.param("out_a", float32, [32])
        out_b = fb.param("out_b", float64, [32])
        for _ in fb.range(1, kind="blocks", name="g"):
            for t in fb.range(32, kind="threads", name="t"):
                out_a[t] = call("fmod", a[t], a[31 - t])
                out_b[t] = call("fmod", b[t], b[31 - t])
    func = lower(fb.function, cuda_target())
    source = generate_cuda([func])
    assert "fmodf(a[" in source and "fmod(b[" in source
    with override(cache_dir=tmp_path):
        assert build_cuda([func], cuda_target(), "remainders").cubin[:4] == b"\x7fELF"
