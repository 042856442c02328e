"""What ``treadle info`` says of this machine: the CPU (its model, the ISA extensions
treadle generates code for, its cores), the memory hierarchy schedules are built for, the
GPU, and the cache of compiled kernels and tuning records, whose size says whether
clearing it is worth while.
"""
from __future__ import annotations

import os
from pathlib import Path

from treadle.config import config, usable_cores
from treadle.runtime import cuda
from treadle.target.cpu import cpu_model, host
from treadle.target.memory import memory_hierarchy


def describe() -> str:
    """The text of ``treadle info``."""
    return "\n".join([_cpu(), memory_hierarchy().format(), _gpu(), _cache()])


def _cpu() -> str:
    target = host()
    return (f"cpu: {cpu_model()}; {usable_cores()} of {os.cpu_count()} cores usable, "
            f"kernels run {target.cores} threads\n"
            f"isa: {', '.join(target.features) or 'no SIMD extensions treadle uses'}; "
            f"{target.vector_registers} vector registers")


def _gpu() -> str:
    if not cuda.available():
        return "gpu: none (no CUDA driver or device; CUDA kernels build but do not run here)"
    gpu = cuda.device_target()
    return (f"gpu: {cuda.device_properties()['name']} ({gpu.arch}, {gpu.sms} SMs, "
            f"{gpu.l2_bytes >> 20} MB L2)")


def _cache() -> str:
    root = config.cache_dir
    files = [Path(folder, name) for folder, _, names in os.walk(root) for name in names]
    size = 0
    for path in files:
        try:
            size += path.lstat().st_size
        except OSError:  # removed meanwhile by another process cleaning up
            pass
    return (f"cache: {root}, {size / 2**20:.1f} MiB in {len(files)} "
            f"file{'' if len(files) == 1 else 's'} "
            "(compiled kernels, tuning records; TREADLE_CACHE_DIR moves it)")
