"""The CUDA targets' memory hierarchies: four levels, closest first, each larger, slower
and narrower than the one inside it; the device's own capacities; the datasheet's peak."""
import pytest

from treadle.target.cuda import ARCHS, cuda_target, described_target
from treadle.target.memory import DRAM_BYTES


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_levels_are_ordered_and_positive(arch):
    memory = cuda_target(arch).memory()
    assert [level.name for level in memory.levels] == ["registers", "shared", "L2", "DRAM"]
    assert memory.source == "datasheet" and memory.peak_gflops > 0
    for inner, outer in zip(memory.levels, memory.levels[1:]):
        assert 0 < inner.latency_ns < outer.latency_ns
        assert inner.bandwidth > outer.bandwidth > 0
    assert [level.capacity for level in memory.levels[2:]] == [cuda_target(arch).l2_bytes,
                                                               DRAM_BYTES]


def test_published_peaks_per_sm():
    """float32 TFLOP/s of the whole chip: A100 19.5, L40S 91.6, H100 SXM 67."""
    for arch, tflops in (("sm_80", 19.5), ("sm_89", 91.6), ("sm_90", 67.0)):
        target = cuda_target(arch)
        assert target.memory().peak_gflops * target.sms / 1e3 == pytest.approx(tflops, rel=0.02)


def test_a_described_device_brings_its_own_capacities():
    props = {"compute_capability": (8, 6), "multiprocessor_count": 84, "l2_cache_size": 6 << 20,
             "max_threads_per_block": 1024, "max_registers_per_block": 65536,
             "max_registers_per_multiprocessor": 65536,
             "max_shared_memory_per_multiprocessor": 100 * 1024}
    memory = described_target(props).memory()  # an architecture the table lacks: sm_80's numbers
    assert memory.level("L2").capacity == 6 << 20
    assert memory.level("shared").capacity == 100 * 1024
    assert memory.peak_gflops == cuda_target("sm_80").memory().peak_gflops
