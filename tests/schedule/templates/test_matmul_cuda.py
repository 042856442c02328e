"""The CUDA matmul template: its space and rules, its kernels built by nvcc within the
limits of each architecture, and its numbers in the GPU simulator against numpy (on a GPU
too, where the machine has one)."""
from dataclasses import replace

import numpy as np
import pytest

from tests.harness import assert_close, random_array
from tests.schedule.templates.gemm.test_program import conv_reference, convolution
from treadle.backend.cuda import build_cuda
from treadle.config import override
from treadle.errors import ScheduleConfigError
from treadle.ir.compute import compute, reduce
from treadle.ir.dtypes import float32
from treadle.ir.expr import Buffer, Var, maximum
from treadle.ir.lower import lower
from treadle.runtime import cuda as cuda_runtime
from treadle.runtime.cuda import device_target
from treadle.runtime.simulate import simulate
from treadle.schedule.templates.gemm import match_gemm_output
from treadle.schedule.templates.matmul_cuda import MATMUL_CUDA, MatmulCudaConfig
from treadle.target.cuda import ARCHS, cuda_target

TARGET = cuda_target("sm_80")


def symbolic_matmul():
    M, N, K = Var("M"), Var("N"), Var("K")
    a, b = Buffer("a", float32, (M, K)), Buffer("b", float32, (K, N))
    return [a, b], reduce("c", [M, N], [K], lambda i, j, r: a[i, r] * b[r, j])


def kernel(inputs, out, cfg=MatmulCudaConfig(), target=TARGET, name="mm"):
    pattern = replace(match_gemm_output(out), inputs=tuple(inputs))
    return lower(MATMUL_CUDA.emit(MATMUL_CUDA.resolve(pattern, cfg, target), name).function,
                 target)


def space():
    inputs, c = symbolic_matmul()
    return MATMUL_CUDA.space(replace(match_gemm_output(c), inputs=tuple(inputs)), 2, TARGET)


def test_space_is_small_valid_and_spans_the_knobs():
    configs = space()
    assert 50 <= len(configs) < 200 and MatmulCudaConfig() in configs
    assert {c.stages for c in configs} == {1, 2}
    assert {(c.thread_m, c.thread_n) for c in configs} == {(4, 4), (4, 8), (8, 4), (8, 8)}
    for cfg in configs:
        assert cfg.threads % 32 == 0 and cfg.shared_bytes <= TARGET.shared_bytes_per_block


@pytest.mark.parametrize("cfg, rule", [
    (MatmulCudaConfig(thread_m=3), "groups of 4"),
    (MatmulCudaConfig(block_m=16, block_n=16, thread_m=4, thread_n=4), "whole number of warps"),
    (MatmulCudaConfig(block_k=64, stages=2), "shared memory"),
    (MatmulCudaConfig(stages=3), "stages must be"),
])
def test_configs_breaking_a_rule_are_refused_with_the_rule(cfg, rule):
    inputs, c = symbolic_matmul()
    with pytest.raises(ScheduleConfigError, match=rule):
        MATMUL_CUDA.check(match_gemm_output(c), cfg, TARGET)


# A sample of the space in the default suite (every block shape, thread tile and stage
# count); the whole space runs under -m slow.
SAMPLE = [MatmulCudaConfig(), MatmulCudaConfig(128, 64, 16, 8, 4, 1),
          MatmulCudaConfig(64, 128, 8, 4, 8, 2), MatmulCudaConfig(64, 64, 16, 4, 4, 1),
          MatmulCudaConfig(32, 64, 8, 4, 4, 2), MatmulCudaConfig(64, 32, 16, 4, 4, 2),
          MatmulCudaConfig(32, 32, 8, 4, 4, 1)]
SIZES = [(1, 1, 1), (7, 61, 97), (97, 7, 61), (61, 97, 7), (3, 5, 0)]


def check_matmul(cfg, sizes=SIZES):
    inputs, c = symbolic_matmul()
    func = kernel(inputs, c, cfg)
    for m, n, k in sizes:
        x, y = random_array((m, k), seed=1), random_array((k, n), seed=2)
        out = np.full((m, n), np.nan, np.float32)
        simulate(func, x, y, out)
        assert_close(out, x @ y, reduction=k, context=f"{cfg} at {m}x{n}x{k}")


@pytest.mark.parametrize("cfg", SAMPLE, ids=str)
def test_simulated_matmul_matches_numpy(cfg):
    check_matmul(cfg)


# Every point of the space at one of these in turn: partial tiles along M and N, a K of
# one step and of several (a short K keeps the simulation quick).
ROTATION = [(61, 97, 7), (97, 61, 13), (7, 1, 29), (1, 7, 1)]


@pytest.mark.parametrize("index, cfg", list(enumerate(space())), ids=str)
def test_whole_space_matches_numpy_at_one_size_each(index, cfg):
    check_matmul(cfg, [ROTATION[index % len(ROTATION)]])


@pytest.mark.slow
@pytest.mark.parametrize("cfg", space(), ids=str)
def test_whole_space_matches_numpy_at_every_size(cfg):
    check_matmul(cfg)


def test_batched_matmul_with_a_broadcast_operand():
    a, b = Buffer("a", float32, (3, 13, 17)), Buffer("b", float32, (17, 11))
    c = reduce("c", [3, 13, 11], [17], lambda t, i, j, r: a[t, i, r] * b[r, j])
    x, y = random_array((3, 13, 17), seed=3), random_array((17, 11), seed=4)
    out = np.full((3, 13, 11), np.nan, np.float32)
    simulate(kernel([a, b], c, SAMPLE[4]), x, y, out)
    assert_close(out, x @ y, reduction=17)


@pytest.mark.parametrize("cfg", SAMPLE[:3], ids=str)
def test_right_operand_contiguous_along_k_loads_along_k(cfg):
    """x @ w.T with w [N, K] (a linear layer's weights): B's slice is loaded along K."""
    M, N, K = Var("M"), Var("N"), Var("K")
    a, w = Buffer("a", float32, (M, K)), Buffer("w", float32, (N, K))
    c = reduce("c", [M, N], [K], lambda i, j, r: a[i, r] * w[j, r])
    func = kernel([a, w], c, cfg)
    for m, n, k in [(7, 61, 97), (61, 7, 13), (1, 130, 9)]:
        x, y = random_array((m, k), seed=5), random_array((n, k), seed=6)
        out = np.full((m, n), np.nan, np.float32)
        simulate(func, x, y, out)
        assert_close(out, x @ y.T, reduction=k, context=f"{cfg} at {m}x{n}x{k}")


def fused_convolution():
    """conv(x, w) + bias, then ReLU, 3x3 with stride 2 and padding 1 (NCHW)."""
    n, ci, h, wd, co, k, stride, pad = 2, 3, 11, 7, 5, 3, 2, 1
    x, w = Buffer("x", float32, (n, ci, h, wd)), Buffer("w", float32, (co, ci, k, k))
    bias = Buffer("bias", float32, (co,))
    conv = convolution(x, w, stride, pad)
    out = compute("out", conv.shape, lambda b, o, i, j: maximum(conv[b, o, i, j] + bias[o], 0.0))
    return [x, w, bias], out, (n, ci, h, wd, co, k, stride, pad)


def test_fused_convolution_bias_relu_matches_numpy():
    inputs, out, (n, ci, h, wd, co, k, stride, pad) = fused_convolution()
    xv, wv = random_array((n, ci, h, wd), seed=7), random_array((co, ci, k, k), seed=8)
    bv = random_array((co,), seed=9)
    result = np.full(tuple(d.value for d in out.shape), np.nan, np.float32)
    simulate(kernel(inputs, out, SAMPLE[5]), xv, wv, bv, result)
    expected = np.maximum(conv_reference(xv, wv, stride, pad) + bv[None, :, None, None], 0)
    assert_close(result, expected, reduction=ci * k * k)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_kernels_compile_within_the_limits_of_every_architecture(arch, tmp_path):
    """The sample and the fused convolution in one nvcc run per architecture; build_cuda
    refuses a kernel over the register or shared-memory limits."""
    target = cuda_target(arch)
    inputs, c = symbolic_matmul()
    funcs = [kernel(inputs, c, cfg, target, f"mm{i}") for i, cfg in enumerate(SAMPLE)]
    conv_inputs, conv_out, _ = fused_convolution()
    funcs.append(kernel(conv_inputs, conv_out, SAMPLE[0], target, "conv"))
    with override(cache_dir=tmp_path):
        binary = build_cuda(funcs, target, "matmul_sample")
    assert len(binary.resources) == len(funcs)
    assert all(r.spill_bytes == 0 for r in binary.resources.values())


@pytest.mark.skipif(not cuda_runtime.available(), reason="needs a GPU and its driver")
@pytest.mark.parametrize("cfg", SAMPLE, ids=str)
def test_on_the_gpu_matmul_matches_numpy(cfg, tmp_path):
    target = device_target()
    inputs, c = symbolic_matmul()
    func = kernel(inputs, c, cfg, target)
    with override(cache_dir=tmp_path):
        run = cuda_runtime.CudaKernel(func, build_cuda([func], target, "mm").cubin)
    for m, n, k in SIZES + [(257, 129, 2039)]:
        x, y = random_array((m, k), seed=1), random_array((k, n), seed=2)
        out = np.full((m, n), np.nan, np.float32)
        run(x, y, out)
        assert_close(out, x @ y, reduction=k, context=f"{cfg} at {m}x{n}x{k}")


@pytest.mark.skipif(not cuda_runtime.available(), reason="needs a GPU and its driver")
def test_on_the_gpu_fused_convolution_matches_numpy(tmp_path):
    target = device_target()
    inputs, out, (n, ci, h, wd, co, k, stride, pad) = fused_convolution()
    func = kernel(inputs, out, SAMPLE[0], target)
    with override(cache_dir=tmp_path):
        run = cuda_runtime.CudaKernel(func, build_cuda([func], target, "conv").cubin)
    xv, wv = random_array((n, ci, h, wd), seed=7), random_array((co, ci, k, k), seed=8)
    bv = random_array((co,), seed=9)
    result = np.full(tuple(d.value for d in out.shape), np.nan, np.float32)
    run(xv, wv, bv, result)
    expected = np.maximum(conv_reference(xv, wv, stride, pad) + bv[None, :, None, None], 0)
    assert_close(result, expected, reduction=ci * k * k)
