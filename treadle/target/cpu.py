"""The CPU treadle generates code for: SIMD width, registers, caches, cores.

Every hardware number a schedule uses comes from here. Values are read from the running
machine (``/proc/cpuinfo``, ``/sys/devices/system/cpu``) once; where the system does not
say, conservative defaults for an AVX2 x86-64 core stand in.
"""
from __future__ import annotations

import ctypes
import functools
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from treadle.config import config

if TYPE_CHECKING:
    from treadle.target.memory import MemoryHierarchy

# ISA extensions treadle emits code for, where the machine has them. Schedules count
# vectors of 256 bits (AVX2 + FMA) everywhere; AVX-512VL adds 16 registers for them, room
# for larger register tiles, and AVX-512F lets a register tile hold 16 floats of a row in
# one 512-bit register. AVX-512BW and the VNNI extensions serve integer products (see
# int8_dot), and AMX's tiles those of activations by constant weights, where Linux lets
# the process use tile data (int8_tiles). Kernels are built on the machine that runs them
# (a saved model records the features it was built for and refuses to load without them).
SUPPORTED_FEATURES = ("avx2", "fma", "avx512f", "avx512vl", "avx512bw", "avx512_vnni",
                      "avx_vnni", "amx_tile", "amx_int8")
# The compiler's name of a feature where /proc/cpuinfo spells it otherwise.
COMPILER_FEATURES = {"avx512_vnni": "avx512vnni", "avx_vnni": "avxvnni",
                     "amx_tile": "amx-tile", "amx_int8": "amx-int8"}
TILE_FEATURES = ("amx_tile", "amx_int8")
# Linux hands out AMX's tile data (8 KiB of state a thread) only on request:
# arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), once for the whole process.
SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18
EXTRA_REGISTERS_FEATURE = "avx512vl"
WIDE_VECTORS_FEATURE = "avx512f"
DEFAULT_CACHES = {1: 32 * 1024, 2: 512 * 1024, 3: 8 * 1024 * 1024}


@dataclass(frozen=True)
class CpuTarget:
    kind: ClassVar[str] = "cpu"  # names the target's templates and lowering pipeline
    features: tuple[str, ...]
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int
    vector_registers: int = 16

    @property
    def cores(self) -> int:
        return config.num_threads

    @property
    def simd_bytes(self) -> int:
        """Bytes of the vectors schedules count registers in (256-bit AVX2 ones)."""
        return 32 if "avx2" in self.features else 16

    @property
    def widest_simd_bytes(self) -> int:
        """Bytes of the widest vector registers generated code may use."""
        return 64 if WIDE_VECTORS_FEATURE in self.features else self.simd_bytes

    def lanes(self, element_bytes: int = 4) -> int:
        """SIMD lanes of one counted vector (``simd_bytes``) for elements of the given size."""
        return self.simd_bytes // element_bytes

    def register_lanes(self, count: int, element_bytes: int = 4) -> int:
        """Lanes of the widest vector register that ``count`` consecutive elements fill
        whole (a row of a register tile); ``count`` is a multiple of ``lanes``."""
        widest = self.widest_simd_bytes // element_bytes
        return widest if count % widest == 0 else self.lanes(element_bytes)

    @property
    def compiler_flags(self) -> tuple[str, ...]:
        return tuple(f"-m{COMPILER_FEATURES.get(f, f)}" for f in self.features)

    def int8_dot(self, lanes: int) -> bool:
        """Whether vectors of ``lanes`` int32 accumulate four byte products per lane in
        one instruction (VNNI's vpdpbusd); without it an integer product multiplies pairs
        of 16-bit halves (vpmaddwd)."""
        if lanes * 4 == 64:
            return "avx512_vnni" in self.features
        return "avx_vnni" in self.features or {"avx512_vnni", "avx512vl"} <= set(self.features)

    @property
    def int8_tiles(self) -> bool:
        """Whether products of unsigned by signed bytes may run on AMX's tiles (tdpbusd:
        a 16 x 16 int32 tile plus the products of 16 x 64 bytes by 64 x 16, 16384
        multiply-adds an instruction)."""
        return set(TILE_FEATURES) <= set(self.features)

    def memory(self) -> MemoryHierarchy:
        """The host's probed hierarchy (``target.memory``); another CPU's defaults."""
        from treadle.target.memory import defaults, memory_hierarchy  # it imports this module
        return memory_hierarchy() if self == host() else defaults(self)


def _cpuinfo(field: str) -> str | None:
    """The value of the first ``field`` line of /proc/cpuinfo (None where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == field:
            return value.strip()
    return None


def _cpu_flags() -> set[str]:
    return set((_cpuinfo("flags") or "").split())


@functools.lru_cache(maxsize=None)
def cpu_model() -> str:
    """This machine's CPU model name, as /proc/cpuinfo gives it."""
    return _cpuinfo("model name") or "unknown CPU"


def _cache_sizes() -> dict[int, int]:
    sizes = dict(DEFAULT_CACHES)
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            text = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        unit = {"K": 1024, "M": 1024 * 1024}.get(text[-1], 1)
        sizes[level] = int(text.rstrip("KM")) * unit
    return sizes


def _tile_data_permitted() -> str | None:
    """Asks Linux for AMX tile data for this process; None where it granted it, else why
    not (generated kernels ask again, see backend.c_prelude, for a process that never
    probed the host)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0:
        return None
    return os.strerror(ctypes.get_errno())


def _usable_tiles(flags: set[str]) -> set[str]:
    """``flags`` less AMX's where the process may not use tile data, with a warning that
    says why: integer products then run on VNNI."""
    if not set(TILE_FEATURES) <= flags:
        return flags
    refused = _tile_data_permitted()
    if refused is None:
        return flags
    warnings.warn(f"the CPU has AMX but Linux refused this process its tile data "
                  f"(arch_prctl ARCH_REQ_XCOMP_PERM: {refused}); integer products run on "
                  "VNNI instead", RuntimeWarning, stacklevel=3)
    return flags - set(TILE_FEATURES)


@functools.lru_cache(maxsize=None)
def host() -> CpuTarget:
    flags = _usable_tiles(_cpu_flags())
    caches = _cache_sizes()
    features = tuple(f for f in SUPPORTED_FEATURES if f in flags)
    registers = 32 if EXTRA_REGISTERS_FEATURE in features else 16
    return CpuTarget(features, caches[1], caches[2], caches[3], registers)
