"""Construction for the CUDA matmul template, without a GPU: on every architecture the
constructed config of square, prime, matrix-vector, batched and symbolic products is
one the template accepts, found in well under a second and ranked by the analytic
latency; ``choose`` constructs for a CUDA target; the kernels of constructed configs
compute the product in the GPU simulator against numpy, and nvcc builds them without
spilling."""
import functools
import time
from dataclasses import replace

import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle.backend.cuda import build_cuda
from treadle.config import override
from tests.schedule.templates.test_matmul_cuda import kernel, symbolic_matmul
from treadle.ir.compute import reduce
from treadle.ir.dtypes import float32
from treadle.ir.expr import Buffer, Var
from treadle.ir.lower import lower
from treadle.runtime.simulate import simulate
from treadle.schedule.template import default_point
from treadle.schedule.templates.gemm import match_gemm_output
from treadle.schedule.templates.matmul_cuda import MATMUL_CUDA, MatmulCudaConfig
from treadle.schedule.templates.matmul_cuda_construction import (matmul_problem,
                                                                 matmul_seconds, wave_terms)
from treadle.target.cuda import ARCHS, cuda_target
from treadle.tune.construct import construct
from treadle.tune.etir import footprint, traffic
from treadle.tune.choice import choose


def matmul(m, n, k, batch=None):
    """C = A @ B, with a leading batch axis on both operands where ``batch`` is given."""
    if batch is None:
        a, b = Buffer("a", float32, (m, k)), Buffer("b", float32, (k, n))
        c = reduce("c", [m, n], [k], lambda i, j, r: a[i, r] * b[r, j])
    else:
        a, b = Buffer("a", float32, (batch, m, k)), Buffer("b", float32, (batch, k, n))
        c = reduce("c", [batch, m, n], [k], lambda t, i, j, r: a[t, i, r] * b[t, r, j])
    return replace(match_gemm_output(c), inputs=(a, b))


SHAPES = [(1024, 1024, 1024), (2039, 2039, 2039), (4096, 4096, 4096), (1, 4096, 4096),
          (128, 64, 64, 12), (7, 61, 13), ("M", "N", "K")]


def pattern_of(shape):
    return matmul(*(Var(s) if isinstance(s, str) else s for s in shape))


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_constructed_configs_are_accepted_quickly_and_ranked(arch, shape):
    target, pattern = cuda_target(arch), pattern_of(shape)
    start = time.perf_counter()
    points = construct(MATMUL_CUDA, pattern, target)
    assert time.perf_counter() - start < 1.0
    for config, _ in points:
        MATMUL_CUDA.check(pattern, config, target)
    seconds = [matmul_seconds(r, target.memory()) for _, r in points]
    assert seconds == sorted(seconds) and all(s > 0 for s in seconds)
    default = default_point(MATMUL_CUDA, pattern, target)[1]
    assert seconds[0] <= matmul_seconds(default, target.memory())
    greedy, _ = construct(MATMUL_CUDA, pattern, target, "greedy")[0]
    MATMUL_CUDA.check(pattern, greedy, target)


@pytest.mark.parametrize("shape", [(0, 64, 64), (3, 5, 0)], ids=str)
def test_empty_products_construct_an_accepted_config(shape):
    target, pattern = cuda_target(), pattern_of(shape)
    config, resolved = construct(MATMUL_CUDA, pattern, target)[0]
    MATMUL_CUDA.check(pattern, config, target)
    assert matmul_seconds(resolved, target.memory()) >= 0


def test_choose_constructs_for_a_cuda_target():
    pattern = matmul(2039, 2039, 2039)
    choice = choose(MATMUL_CUDA, pattern, "mm", "construct", cuda_target())
    assert choice.source == "constructed"
    MATMUL_CUDA.check(pattern, choice.config, cuda_target())
    assert choice.config == construct(MATMUL_CUDA, pattern, cuda_target())[0][0]


def test_the_problem_tiles_threads_blocks_and_the_k_step():
    problem = matmul_problem(matmul(61, 97, 13), cuda_target())
    assert problem.extents == (1, 61, 97, 13)
    assert problem.levels == ("registers", "shared", "L2")
    left, right, out = problem.tensors
    assert (left.dims, right.dims, out.dims) == ({1, 3}, {2, 3}, {0, 1, 2})
    assert traffic(problem, problem.extents) == footprint(problem, problem.extents)
    # Thread tiles in runs of four up to the first covering the extent; K steps likewise.
    assert list(problem.steps(0, 1, 1)) == [4, 8, 12, 16]
    assert list(problem.steps(1, 3, 1)) == [8, 16]
    assert list(problem.steps(1, 1, 8)) == [8, 16, 32, 64]


def test_a_tail_wave_and_thin_tiles_cost_time():
    target, memory = cuda_target("sm_80"), cuda_target("sm_80").memory()
    pattern = matmul(4096, 4096, 4096)
    wide, thin = (MATMUL_CUDA.resolve(pattern, cfg, target) for cfg in [
        MatmulCudaConfig(128, 128, 8, 8, 8), MatmulCudaConfig(32, 32, 8, 4, 4)])
    assert matmul_seconds(wide, memory) < matmul_seconds(thin, memory)
    assert set(wave_terms(wide, memory)) == {"compute", "issue", "shared", "L2", "latency"}
    # 108 blocks fill the SMs of an A100 once; 109 take a second wave.
    full, tail = (MATMUL_CUDA.resolve(matmul(m, 128, 1024), MatmulCudaConfig(), target)
                  for m in (108 * 128, 108 * 128 + 1))
    assert matmul_seconds(tail, memory) > 1.5 * matmul_seconds(full, memory)


@functools.cache
def constructed_configs():
    """The best constructed config of each shape on each architecture, once each."""
    configs = {construct(MATMUL_CUDA, pattern_of(shape), cuda_target(arch))[0][0]
               for arch in sorted(ARCHS) for shape in SHAPES}
    return sorted(configs, key=str)


@pytest.mark.parametrize("cfg", constructed_configs(), ids=str)
def test_constructed_kernels_match_numpy_in_the_simulator(cfg):
    """Each constructed config's kernel, at an odd size: partial tiles along M and N, a K
    of two steps and a partial one."""
    inputs, c = symbolic_matmul()
    func = kernel(inputs, c, cfg)
    m, n, k = 37, 67, 2 * cfg.block_k + 3
    x, y = random_array((m, k), seed=1), random_array((k, n), seed=2)
    out = np.full((m, n), np.nan, np.float32)
    simulate(func, x, y, out)
    assert_close(out, x @ y, reduction=k, context=f"{cfg} at {m}x{n}x{k}")


def test_constructed_batched_kernel_matches_numpy_in_the_simulator():
    pattern = matmul(13, 11, 17, batch=3)
    config, resolved = construct(MATMUL_CUDA, pattern, cuda_target())[0]
    x, y = random_array((3, 13, 17), seed=3), random_array((3, 17, 11), seed=4)
    out = np.full((3, 13, 11), np.nan, np.float32)
    simulate(lower(MATMUL_CUDA.emit(resolved, "bmm").function, cuda_target()), x, y, out)
    assert_close(out, x @ y, reduction=17, context=str(config))


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_constructed_kernels_build_without_spilling(arch, tmp_path):
    target = cuda_target(arch)
    inputs, c = symbolic_matmul()
    funcs = [kernel(inputs, c, cfg, target, f"mm{i}")
             for i, cfg in enumerate(constructed_configs())]
    with override(cache_dir=tmp_path):
        binary = build_cuda(funcs, target, "constructed")
    assert len(binary.resources) == len(funcs)
    assert all(r.spill_bytes == 0 for r in binary.resources.values())
