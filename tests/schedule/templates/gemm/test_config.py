"""The rules every GEMM config keeps, on any problem: one definition (config.check_config),
named in the error, for AVX2 and AVX-512 register files."""
import pytest

from treadle.errors import ScheduleConfigError
from treadle.schedule.templates.gemm.config import GemmConfig, check_config, registers_needed
from treadle.target.cpu import CpuTarget

AVX2 = CpuTarget(("avx2", "fma"), 32 * 1024, 512 * 1024, 8 * 1024 * 1024)
AVX512 = CpuTarget(("avx2", "fma", "avx512f", "avx512vl"), 32 * 1024, 1024 * 1024,
                   32 * 1024 * 1024, vector_registers=32)


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
@pytest.mark.parametrize("cfg, rule", [
    (GemmConfig(micro_n=12, block_n=48), "not a multiple of 8 SIMD lanes"),
    (GemmConfig(block_m=100), "not a multiple of the register tile"),
    (GemmConfig(block_k=0), "positive integer"),
    (GemmConfig(split_k=0), "positive integer"),
    (GemmConfig(block_m="192"), "positive integer"),
    (GemmConfig(split_k=True), "positive integer"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_rules_name_what_is_wrong(target, cfg, rule):
    with pytest.raises(ScheduleConfigError, match=rule):
        check_config(cfg, target)


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
@pytest.mark.parametrize("vectors", [1, 2, 3, 4])
def test_register_tile_fits_the_register_file(target, vectors):
    """Accumulators, a row of B and the broadcast of A: the most rows that fit pass, one
    more row is refused."""
    cols = 8 * vectors
    most = (target.vector_registers - vectors - 1) // vectors
    for rows, fits in ((most, True), (most + 1, False)):
        cfg = GemmConfig(block_m=rows * 4, micro_m=rows, micro_n=cols, block_n=cols * 4)
        assert (registers_needed(rows, cols, target) <= target.vector_registers) == fits
        if fits:
            check_config(cfg, target)
        else:
            with pytest.raises(ScheduleConfigError, match="vector registers"):
                check_config(cfg, target)


def test_the_default_config_is_valid_everywhere():
    for target in (AVX2, AVX512):
        check_config(GemmConfig(), target)
