"""The GEMM schedule space: sizes per level, every point valid under the template's rules
(config.check_config) and the cache formulas, and nothing taken from the problem."""
import inspect

import pytest

from treadle.config import override
from treadle.errors import ScheduleConfigError
from treadle.schedule.templates.gemm import GemmConfig
from treadle.target import cpu
from treadle.target.cpu import CpuTarget, host
from treadle.schedule.templates.gemm.space import (ELEMENT_BYTES, check_space_point, gemm_space,
                                                   micro_tiles, tile_bytes)

TARGETS = [
    host(),
    CpuTarget(("avx2", "fma"), 32 * 1024, 256 * 1024, 8 * 1024 * 1024),
    CpuTarget(("avx2", "fma"), 48 * 1024, 2 * 1024 * 1024, 32 * 1024 * 1024),
    CpuTarget(("sse4_2",), 32 * 1024, 512 * 1024, 4 * 1024 * 1024),
    CpuTarget(("avx2", "fma", "avx512f", "avx512vl"), 32 * 1024, 1024 * 1024,
              32 * 1024 * 1024, vector_registers=32),
]
BOUNDS = {0: (1, 1), 1: (10, 30), 2: (31, 199)}


@pytest.mark.parametrize("threads", [1, 2, 16])
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"L2={t.l2_bytes // 1024}K")
@pytest.mark.parametrize("level", [0, 1, 2])
def test_size_and_validity(level, target, threads):
    with override(num_threads=threads):
        space = gemm_space(level, target)
        low, high = BOUNDS[level]
        assert low <= len(space) <= high
        assert len(set(space)) == len(space)
        lanes = target.simd_bytes // ELEMENT_BYTES
        for cfg in space:
            check_space_point(cfg, target)
            vectors = cfg.micro_n // lanes
            assert cfg.micro_n % lanes == 0
            assert cfg.micro_m * vectors + vectors + 1 <= target.vector_registers
            assert (cfg.micro_m + cfg.micro_n) * cfg.block_k * ELEMENT_BYTES <= target.l1d_bytes
            assert tile_bytes(cfg.block_m, cfg.block_n, cfg.block_k) <= target.l2_bytes
            assert cfg.block_m % cfg.micro_m == 0 and cfg.block_n % cfg.micro_n == 0
            assert cfg.split_k in (1, 2, threads)


def test_levels_nest_around_the_default():
    target = host()
    default, = gemm_space(0, target)
    assert default.split_k == 1
    micro = {(c.micro_m, c.micro_n) for c in gemm_space(1, target)}
    assert (default.micro_m, default.micro_n) in micro
    assert micro <= {(c.micro_m, c.micro_n) for c in gemm_space(2, target)}


def test_space_depends_on_the_target_only():
    assert list(inspect.signature(gemm_space).parameters) == ["level", "target"]
    assert gemm_space(1, TARGETS[1]) != gemm_space(1, TARGETS[2])
    assert gemm_space(2, host()) == gemm_space(2, host())


@pytest.mark.parametrize("cfg, rule", [
    (GemmConfig(micro_n=12), "SIMD lanes"),
    (GemmConfig(block_m=96, micro_m=8, micro_n=16), "vector registers"),
    (GemmConfig(block_m=50, micro_m=6), "multiple of the register tile"),
    (GemmConfig(block_k=4096), "L1"),
    (GemmConfig(block_m=1200, block_n=1200, block_k=128), "L2"),
    (GemmConfig(block_m=0), "positive"),
])
def test_invalid_points_raise(cfg, rule):
    with pytest.raises(ScheduleConfigError, match=rule):
        check_space_point(cfg, TARGETS[2])


def test_unknown_level():
    with pytest.raises(ValueError, match="tuning level 3"):
        gemm_space(3, host())


@pytest.mark.parametrize("flags, registers", [({"avx2", "fma"}, 16),
                                              ({"avx2", "fma", "avx512f", "avx512vl"}, 32)])
def test_avx512vl_gives_room_for_larger_register_tiles(monkeypatch, flags, registers):
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: flags)
    cpu.host.cache_clear()
    try:
        target = host()
        assert target.vector_registers == registers
        assert set(target.features) == flags and target.lanes() == 8
        (default,) = gemm_space(0, target)
        accumulators = default.micro_m * default.micro_n // 8
        assert registers // 2 <= accumulators < registers
    finally:
        monkeypatch.undo()
        cpu.host.cache_clear()


def test_tiles_the_widest_registers_hold_rank_first():
    """With 512-bit registers the leading register tiles have rows of 16 floats (one
    register each); without them a 24-wide tile (three 256-bit registers) is among them."""
    wide = TARGETS[-1]
    narrow = CpuTarget(("avx2", "fma", "avx512vl"), wide.l1d_bytes, wide.l2_bytes,
                       wide.l3_bytes, vector_registers=32)
    assert wide.register_lanes(16) == 16 and wide.register_lanes(24) == 8
    assert narrow.register_lanes(16) == 8
    assert all(n % 16 == 0 for _, n in micro_tiles(wide)[:4])
    assert any(n % 16 for _, n in micro_tiles(narrow)[:4])
    assert gemm_space(0, wide) == gemm_space(0, narrow)  # 14 x 16 either way
