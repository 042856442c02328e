"""What a CUDA matmul config costs at given sizes, in the terms DietCode's cost model
(``tune.dynamic``) weighs, as the CPU GEMM's ``gemm.cost`` gives them: the multiply-adds
of its block tiles (a partial tile computes whole, and the last K slice loads zeros),
the bytes of B that the blocks read (each row of blocks reads all of it; the first read
comes from DRAM, the others mostly from L2), and its blocks against the SMs' slots for
resident blocks, whose busy share is the occupancy; and the features of its tile, from
which the model learns the time of one multiply-add.
"""
from __future__ import annotations

import math
from typing import Mapping

from treadle.ir.expr import Var
from treadle.schedule.templates.gemm.cost import Work
from treadle.schedule.templates.gemm.construction import problem_sizes
from treadle.schedule.templates.matmul_cuda import ELEMENT_BYTES, ResolvedMatmulCuda
from treadle.schedule.templates.matmul_cuda_construction import blocks_per_sm
from treadle.target.cuda import CudaTarget


def matmul_work(resolved: ResolvedMatmulCuda, env: Mapping[Var, int]) -> Work:
    """The work of ``resolved`` with its symbols at the values of ``env``."""
    cfg, target = resolved.config, resolved.target
    batch, m, n, k = problem_sizes(resolved.pattern, env)
    row_blocks, column_blocks = math.ceil(m / cfg.block_m), math.ceil(n / cfg.block_n)
    once = ELEMENT_BYTES * batch * n * k
    padded_k = math.ceil(k / cfg.block_k) * cfg.block_k
    return Work(batch * row_blocks * cfg.block_m * column_blocks * cfg.block_n * padded_k,
                batch * m * n * k, once * row_blocks, once if m else 0,
                batch * row_blocks * column_blocks,
                target.sms * blocks_per_sm(cfg, target))


def matmul_features(resolved: ResolvedMatmulCuda, target: CudaTarget) -> dict[str, float]:
    """The tile's shape, how it fills an SM and how much it reuses what it loads."""
    cfg = resolved.config
    return {
        "block_m": cfg.block_m, "block_n": cfg.block_n, "block_k": cfg.block_k,
        "thread_m": cfg.thread_m, "thread_n": cfg.thread_n, "stages": cfg.stages,
        "threads": cfg.threads, "resident": blocks_per_sm(cfg, target),
        "shared": cfg.shared_bytes / target.shared_bytes_per_block,
        "registers": (cfg.tile_registers + sum(cfg.loads_per_thread)) / 255,
        "intensity": cfg.thread_m * cfg.thread_n / (cfg.thread_m + cfg.thread_n),
        "block_intensity": cfg.block_m * cfg.block_n / (cfg.block_m + cfg.block_n)}
