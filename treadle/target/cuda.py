"""The NVIDIA GPUs treadle generates CUDA C for: the limits a schedule must keep and the
sizes its space is built from, by compute capability.

Schedules never see a device: they see a ``CudaTarget``, taken from the table below for a
named architecture (so kernels are built and checked on machines without a GPU) or read
from the device when one is present (``device_target``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar


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


# The data-centre part of each architecture (A100, L40S, H100 SXM).
ARCHS = {
    "sm_80": CudaTarget("sm_80", sms=108, l2_bytes=40 << 20, shared_bytes_per_sm=164 * 1024),
    "sm_89": CudaTarget("sm_89", sms=142, l2_bytes=96 << 20, shared_bytes_per_sm=100 * 1024,
                        max_threads_per_sm=1536),
    "sm_90": CudaTarget("sm_90", sms=132, l2_bytes=50 << 20, shared_bytes_per_sm=228 * 1024),
}
DEFAULT_ARCH = "sm_80"


def cuda_target(arch: str = DEFAULT_ARCH) -> CudaTarget:
    """The target of a named architecture (``sm_80``, ``sm_89``, ``sm_90``)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown CUDA architecture {arch!r}; treadle knows "
                         f"{', '.join(ARCHS)}")
    return ARCHS[arch]


def device_target() -> CudaTarget:
    """The target of the GPU of this machine (device 0), its limits read from the driver;
    raises ``DeviceUnavailableError`` without one."""
    from treadle.runtime.cuda import device_properties
    props = device_properties()
    major, minor = props["compute_capability"]
    arch = f"sm_{major}{minor}"
    base = ARCHS.get(arch, ARCHS[DEFAULT_ARCH])
    return replace(base, arch=arch, sms=props["multiprocessor_count"],
                   l2_bytes=props["l2_cache_size"],
                   max_threads_per_block=props["max_threads_per_block"],
                   registers_per_block=props["max_registers_per_block"],
                   registers_per_sm=props["max_registers_per_multiprocessor"],
                   shared_bytes_per_sm=props["max_shared_memory_per_multiprocessor"])
