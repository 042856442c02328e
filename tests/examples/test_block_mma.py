"""Hidet's Figure 13 in treadle: four warps share a 4x4 grid of 16x16 MMA tiles through
``spatial(2, 2) * repeat(2, 2)``; here the warps are CPU threads and an MMA is loops."""
import numpy as np

from tests.harness import assert_close, random_array
from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import float32
from treadle.ir.mapping import repeat, spatial
from treadle.runtime.interpret import interpret
from treadle.runtime.build import compile_function

TILE = 16


def block_mma():
    task_map = spatial(2, 2) * repeat(2, 2)
    with FunctionBuilder("block_mma") as fb:
        smem_a = fb.param("SmemA", float32, [64, 8])
        smem_b = fb.param("SmemB", float32, [8, 64])
        regs_c = fb.param("RegsC", float32, [64, 64])
        for warp in fb.range(4, kind="parallel", name="warp"):
            for i, j in task_map.on(warp):
                for r, c in repeat(TILE, TILE).on(0):
                    acc = fb.scalar("acc", float32, 0.0)
                    for k in fb.range(8, name="k"):
                        acc[()] = acc[()] + smem_a[i * TILE + r, k] * smem_b[k, j * TILE + c]
                    regs_c[i * TILE + r, j * TILE + c] = acc[()]
    return fb.function


def test_each_warp_gets_a_two_by_two_block_of_tiles():
    task_map = spatial(2, 2) * repeat(2, 2)
    assert task_map.tasks(1) == [(0, 2), (0, 3), (1, 2), (1, 3)]
    assert task_map.tasks(2) == [(2, 0), (2, 1), (3, 0), (3, 1)]


def test_block_mma_matches_numpy_compiled_and_interpreted():
    a, b = random_array((64, 8), seed=1), random_array((8, 64), seed=2)
    compiled, interpreted = np.zeros((64, 64), np.float32), np.zeros((64, 64), np.float32)
    compile_function(block_mma())(a, b, compiled)
    interpret(block_mma(), a, b, interpreted)
    assert_close(compiled, a @ b, reduction=8)
    # Not bit-equal: the C compiler contracts a * b + acc into one rounding (an FMA).
    assert_close(interpreted, compiled, reduction=8)
