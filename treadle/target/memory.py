"""The memory hierarchy of the CPU, measured once: capacity, latency and bandwidth of the
registers, L1, L2, L3 and memory, and the peak float32 multiply-add rate of one core.

Capacities come from the system (``target.cpu``). Latency and bandwidth come from a small
probe, one C file built like any kernel: a pointer chase through a random cycle of cache
lines sized to half of each level, at most CACHE_PROBE_BYTES, and to twice L3 for memory
(nanoseconds per dependent load) and a streaming sum
over the same sizes (bytes per nanosecond on one core), plus independent FMA chains for
the peak. It takes a few seconds and is cached per machine under
``<cache_dir>/target/``, keyed by the CPU model, its features and caches. Where probing
fails, conservative defaults stand in (``source`` says which). Registers are not probed:
their latency is one cycle of the probed clock and their bandwidth four times L1's (two
loads of the widest vector per cycle against the ~half that a streaming sum sustains).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from treadle.atomic import write_json
from treadle.config import config
from treadle.target.cpu import CpuTarget, cpu_model, host

log = logging.getLogger(__name__)
FORMAT = "treadle-memory-1"
DRAM_BYTES = 1 << 40  # "unbounded" for the formulas
DRAM_PROBE_BYTES = 256 << 20
# A cache level is probed over half its size up to this: a server's shared L3 (300 MB on
# one 2-core machine) took half a minute to walk, and 32 MB is as far beyond L2 as needed.
CACHE_PROBE_BYTES = 32 << 20


@dataclass(frozen=True)
class Level:
    name: str
    capacity: int  # bytes (registers, L1 and L2 per core; L3 shared)
    latency_ns: float
    bandwidth: float  # bytes per nanosecond (GB/s) one core reads from this level


@dataclass(frozen=True)
class MemoryHierarchy:
    levels: tuple[Level, ...]  # closest first: registers, L1, L2, L3, DRAM
    peak_gflops: float  # float32 multiply-adds (2 flops each) per core
    source: str  # "probed" or "defaults"

    def level(self, name: str) -> Level:
        return next(level for level in self.levels if level.name == name)

    def format(self) -> str:
        lines = [f"memory hierarchy ({self.source}), peak {self.peak_gflops:.1f} GFLOP/s "
                 f"per core (float32)",
                 f"  {'level':<10} {'capacity':>12} {'latency':>10} {'bandwidth':>12}"]
        for level in self.levels:
            capacity = "-" if level.capacity >= DRAM_BYTES else _size(level.capacity)
            lines.append(f"  {level.name:<10} {capacity:>12} {level.latency_ns:>8.2f}ns "
                         f"{level.bandwidth:>8.1f}GB/s")
        return "\n".join(lines)


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


# Per level (L1, L2, L3, DRAM): latency in ns and single-core read bandwidth in GB/s of
# a modest x86-64 server core; below what this project's machines measure.
DEFAULTS = {"L1": (1.2, 80.0), "L2": (4.0, 40.0), "L3": (15.0, 20.0), "DRAM": (90.0, 8.0)}
DEFAULT_GFLOPS = 50.0


@functools.lru_cache(maxsize=None)
def memory_hierarchy() -> MemoryHierarchy:
    """The host's hierarchy: from the cache, else probed (and cached), else defaults."""
    target = host()
    path = Path(config.cache_dir) / "target" / f"memory-{_machine_key(target)}.json"
    try:
        data = json.loads(path.read_text())
        if data.get("format") == FORMAT:
            return _from_json(data)
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("ignoring unusable memory probe %s (%s); probing again", path, err)
    try:
        hierarchy = probe(target)
    except Exception as err:  # no compiler, a sandbox without timers: the defaults do
        log.warning("memory probe failed (%s); using conservative defaults", err)
        return defaults(target)
    _store(path, hierarchy)
    return hierarchy


def defaults(target: CpuTarget) -> MemoryHierarchy:
    caches = {"L1": target.l1d_bytes, "L2": target.l2_bytes, "L3": target.l3_bytes,
              "DRAM": DRAM_BYTES}
    levels = [Level(name, caches[name], *DEFAULTS[name]) for name in DEFAULTS]
    return MemoryHierarchy((_registers(target, levels[0], DEFAULT_GFLOPS), *levels),
                           DEFAULT_GFLOPS, "defaults")


def probe(target: CpuTarget) -> MemoryHierarchy:
    """Measures the host (see the module's docstring); raises where it cannot."""
    from treadle.backend.build import build_with, c_toolchain
    built = build_with(c_toolchain(target), PROBE_SOURCE, "memory_probe", list(PROBE_SYMBOLS))
    library = ctypes.CDLL(str(built.path))
    chase, stream, fma = (getattr(library, s) for s in PROBE_SYMBOLS)
    chase.restype = stream.restype = fma.restype = ctypes.c_double
    chase.argtypes = stream.argtypes = [ctypes.c_int64, ctypes.c_int64]
    fma.argtypes = [ctypes.c_int64]
    caches = {"L1": target.l1d_bytes, "L2": target.l2_bytes, "L3": target.l3_bytes}
    levels = []
    for name, capacity in [*caches.items(), ("DRAM", DRAM_BYTES)]:
        size = (min(capacity // 2, CACHE_PROBE_BYTES) if name != "DRAM"
                else max(DRAM_PROBE_BYTES, 2 * target.l3_bytes))
        tries = 1 if name == "DRAM" else 3  # memory's is the slow probe, and the steadiest
        latency = min(chase(size, 1 << 20) for _ in range(tries))
        bytes_per_ns = max(stream(size, max(1 << 26, 4 * size) // size) for _ in range(tries))
        if not (latency > 0 and bytes_per_ns > 0):
            raise RuntimeError(f"{name}: latency {latency} ns, bandwidth {bytes_per_ns} B/ns")
        levels.append(Level(name, capacity, latency, bytes_per_ns))
    levels = _outward(levels)
    gflops = max(fma(1 << 24) for _ in range(3))
    return MemoryHierarchy((_registers(target, levels[0], gflops), *levels), gflops, "probed")


def _outward(levels: list[Level]) -> list[Level]:
    """Each level's bandwidth at least the next one out's: a cache is never slower than
    what it caches, and a probe of it that read slower (another process on the core, a
    frequency drop) would rank tiles that fit it below ones that spill."""
    ordered = [levels[-1]]
    for level in reversed(levels[:-1]):
        ordered.insert(0, replace(level, bandwidth=max(level.bandwidth, ordered[0].bandwidth)))
    return ordered


def _registers(target: CpuTarget, l1: Level, gflops: float) -> Level:
    lanes = target.widest_simd_bytes // 4
    clock_ghz = gflops / (2 * 2 * lanes)  # two FMA units, two flops per multiply-add
    return Level("registers", target.vector_registers * target.simd_bytes,
                 1 / max(clock_ghz, 0.5), 4 * l1.bandwidth)


def _machine_key(target: CpuTarget) -> str:
    identity = json.dumps([cpu_model(), list(target.features), target.l1d_bytes, target.l2_bytes,
                           target.l3_bytes, PROBE_SOURCE])
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def _store(path: Path, hierarchy: MemoryHierarchy) -> None:
    write_json(path, {"format": FORMAT, **asdict(hierarchy)})


def _from_json(data: dict) -> MemoryHierarchy:
    levels = tuple(Level(str(d["name"]), int(d["capacity"]), float(d["latency_ns"]),
                         float(d["bandwidth"])) for d in data["levels"])
    if [level.name for level in levels] != ["registers", "L1", "L2", "L3", "DRAM"] or \
            not all(level.latency_ns > 0 and level.bandwidth > 0 for level in levels):
        raise ValueError("levels missing or not positive")
    return MemoryHierarchy(levels, float(data["peak_gflops"]), str(data["source"]))


PROBE_SYMBOLS = ("treadle_probe_chase", "treadle_probe_stream", "treadle_probe_fma")
PROBE_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

/* ns per dependent load along a random cycle through the cache lines of `bytes`. */
double treadle_probe_chase(int64_t bytes, int64_t hops) {
    int64_t lines = bytes / 64, *order = malloc(lines * sizeof(int64_t));
    char *memory = aligned_alloc(64, lines * 64);
    if (!order || !memory || lines < 2) return -1;
    for (int64_t i = 0; i < lines; ++i) order[i] = i;
    uint64_t state = 88172645463325252ULL;
    for (int64_t i = lines - 1; i > 0; --i) {
        state ^= state << 13; state ^= state >> 7; state ^= state << 17;
        int64_t j = state % (uint64_t)(i + 1), t = order[i];
        order[i] = order[j]; order[j] = t;
    }
    for (int64_t i = 0; i < lines; ++i)
        *(void **)(memory + order[i] * 64) = memory + order[(i + 1) % lines] * 64;
    void **p = (void **)(memory + order[0] * 64);
    /* The empty asm keeps the compiler from reasoning about the chain. */
    /* Warm-up: the whole cycle where it is a cache's, as many hops as are timed beyond. */
    for (int64_t i = 0; i < (lines < hops ? lines : hops); ++i) {
        p = *p; __asm__ volatile("" : "+r"(p));
    }
    double start = now_ns();
    for (int64_t i = 0; i < hops; ++i) { p = *p; __asm__ volatile("" : "+r"(p)); }
    double ns = (now_ns() - start) / hops;
    volatile void *sink = p; (void)sink;
    free(order); free(memory);
    return ns;
}

/* bytes per ns of a streaming float sum over `bytes`, `rounds` times. */
double treadle_probe_stream(int64_t bytes, int64_t rounds) {
    int64_t n = bytes / sizeof(float);
    float *x = aligned_alloc(64, n * sizeof(float));
    if (!x || n < 64) return -1;
    for (int64_t i = 0; i < n; ++i) x[i] = (float)(i & 7);
    float total = 0;
    double start = 0;
    for (int64_t r = -1; r < rounds; ++r) {
        if (r == 0) start = now_ns();
        float s[16] = {0};
        for (int64_t i = 0; i < n; i += 16)
            for (int k = 0; k < 16; ++k) s[k] += x[i + k];
        for (int k = 0; k < 16; ++k) total += s[k];
    }
    double ns = now_ns() - start;
    volatile float sink = total; (void)sink;
    free(x);
    return (double)bytes * rounds / ns;
}

/* float32 GFLOP/s of independent multiply-add chains in the widest vectors. */
double treadle_probe_fma(int64_t steps) {
    typedef float v16 __attribute__((vector_size(64)));
    v16 a[12], b = {0}, c = {0};
    for (int k = 0; k < 16; ++k) { b[k] = 0.999999f; c[k] = 1e-7f; }
    for (int j = 0; j < 12; ++j) a[j] = c;
    double start = now_ns();
    for (int64_t i = 0; i < steps; ++i)
        for (int j = 0; j < 12; ++j) a[j] = a[j] * b + c;
    double ns = now_ns() - start;
    v16 total = {0};
    for (int j = 0; j < 12; ++j) total += a[j];
    volatile float sink = total[0]; (void)sink;
    return 2.0 * 16 * 12 * steps / ns;
}
"""
