"""The NVIDIA GPUs treadle generates CUDA C for: the limits a schedule must keep and the
sizes its space is built from, by compute capability.

Schedules never see a device: they see a ``CudaTarget``, taken from the table below for a
named architecture (so kernels are built and checked on machines without a GPU) or read
from a device's properties when one is present (``runtime.cuda.device_target``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Mapping

from treadle.target.memory import DRAM_BYTES, Level, MemoryHierarchy


@dataclass(frozen=True)
class CudaTarget:
    kind: ClassVar[str] = "cuda"  # names the target's templates and lowering pipeline
    arch: str  # nvcc's -arch, e.g. "sm_80"
    sms: int
    l2_bytes: int
    warp_size: int = 32
    max_threads_per_block: int = 1024
    max_registers_per_thread: int = 255
    registers_per_block: int = 64 * 1024
    registers_per_sm: int = 64 * 1024
    # Statically declared __shared__ arrays are limited to 48 KB per block; more needs
    # dynamic shared memory and an opt-in the kernels do not take.
    shared_bytes_per_block: int = 48 * 1024
    shared_bytes_per_sm: int = 164 * 1024
    max_threads_per_sm: int = 2048
    # (m, n, k) of the mma.sync shapes for fp16/bf16 inputs with fp32 accumulators.
    tensor_core_shapes: tuple[tuple[int, int, int], ...] = ((16, 8, 16),)

    @property
    def compute_capability(self) -> tuple[int, int]:
        digits = self.arch.removeprefix("sm_").rstrip("a")
        return int(digits[:-1]), int(digits[-1])

    @property
    def compiler_flags(self) -> tuple[str, ...]:
        return (f"-arch={self.arch}",)

    def memory(self) -> MemoryHierarchy:
        """Registers, shared memory, L2 and DRAM from the architecture's published numbers
        (``DATASHEETS``) and this device's capacities; bandwidths and the peak per SM (a
        chip's L2 and DRAM bandwidth shared evenly by its SMs)."""
        sheet = DATASHEETS.get(self.arch, DATASHEETS[DEFAULT_ARCH])
        clock, chip = sheet.clock_ghz, ARCHS.get(self.arch, ARCHS[DEFAULT_ARCH])
        levels = (
            # Three operands of every lane's multiply-add each cycle.
            Level("registers", 4 * self.registers_per_sm, 1 / clock,
                  3 * 4 * sheet.fp32_lanes * clock),
            Level("shared", self.shared_bytes_per_sm, sheet.shared_cycles / clock,
                  SHARED_BYTES_PER_CYCLE * clock),
            Level("L2", self.l2_bytes, sheet.l2_cycles / clock, sheet.l2_gbs / chip.sms),
            Level("DRAM", DRAM_BYTES, sheet.dram_ns, sheet.dram_gbs / chip.sms))
        return MemoryHierarchy(levels, 2 * sheet.fp32_lanes * clock, "datasheet")


# The data-centre part of each architecture (A100, L40S, H100 SXM).
ARCHS = {
    "sm_80": CudaTarget("sm_80", sms=108, l2_bytes=40 << 20, shared_bytes_per_sm=164 * 1024),
    "sm_89": CudaTarget("sm_89", sms=142, l2_bytes=96 << 20, shared_bytes_per_sm=100 * 1024,
                        max_threads_per_sm=1536),
    "sm_90": CudaTarget("sm_90", sms=132, l2_bytes=50 << 20, shared_bytes_per_sm=228 * 1024),
}
DEFAULT_ARCH = "sm_80"


@dataclass(frozen=True)
class Datasheet:
    """Published numbers of an architecture's part in ARCHS, for its memory hierarchy."""
    clock_ghz: float  # boost clock
    fp32_lanes: int  # float32 multiply-adds per SM per cycle
    l2_gbs: float  # L2 read bandwidth of the whole chip
    dram_gbs: float  # memory bandwidth of the whole chip
    shared_cycles: int  # load-to-use latency of shared memory
    l2_cycles: int  # of an L2 hit
    dram_ns: float  # of a load that misses L2


# Clocks, lanes and bandwidths from NVIDIA's datasheets and architecture whitepapers
# (A100 SXM4 40 GB: 19.5 TFLOP/s, L2 5120 B/cycle, 1555 GB/s; L40S: 91.6 TFLOP/s,
# 864 GB/s; H100 SXM5: 67 TFLOP/s, 3.35 TB/s); latencies and Ada's and Hopper's L2
# bandwidth, which NVIDIA does not publish, from published microbenchmarks. An H200 is an
# sm_90 with 4.8 TB/s: the H100's numbers understate its memory, never its limits.
DATASHEETS = {
    "sm_80": Datasheet(1.41, 64, 7220.0, 1555.0, 29, 200, 480.0),
    "sm_89": Datasheet(2.52, 128, 5000.0, 864.0, 30, 270, 500.0),
    "sm_90": Datasheet(1.98, 128, 5500.0, 3350.0, 30, 260, 480.0),
}
SHARED_BYTES_PER_CYCLE = 128  # 32 banks of 4 bytes per SM, on every architecture here


def cuda_target(arch: str = DEFAULT_ARCH) -> CudaTarget:
    """The target of a named architecture (``sm_80``, ``sm_89``, ``sm_90``)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown CUDA architecture {arch!r}; treadle knows "
                         f"{', '.join(ARCHS)}")
    return ARCHS[arch]


def described_target(props: Mapping) -> CudaTarget:
    """The target of a device whose properties the driver reports
    (``runtime.cuda.device_properties``): its architecture's entry with the device's own
    limits."""
    major, minor = props["compute_capability"]
    arch = f"sm_{major}{minor}"
    base = ARCHS.get(arch, ARCHS[DEFAULT_ARCH])
    return replace(base, arch=arch, sms=props["multiprocessor_count"],
                   l2_bytes=props["l2_cache_size"],
                   max_threads_per_block=props["max_threads_per_block"],
                   registers_per_block=props["max_registers_per_block"],
                   registers_per_sm=props["max_registers_per_multiprocessor"],
                   shared_bytes_per_sm=props["max_shared_memory_per_multiprocessor"])
