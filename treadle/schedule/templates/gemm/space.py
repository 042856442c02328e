"""The hardware-centric schedule space of the CPU GEMM template.

Every point is derived from the target's numbers — SIMD lanes, vector registers, cache
sizes, cores — never from the problem's sizes: the template pads its tiles, so a tile need
not divide the matrix (Hidet, section 4.3). The same space therefore serves every shape,
and its size is fixed by the level:

    level 0   one point, chosen by the formulas below (no measurement)
    level 1   a small space (~10-30 points) around it
    level 2   the full space (< 200 points)

The formulas (sizes in bytes of float32 elements):

    registers   micro_m * micro_n/lanes accumulators + micro_n/lanes B vectors
                + 1 broadcast A value  <=  vector registers, counted in 256-bit
                vectors (lanes = 8) also where a 16-wide row takes one 512-bit
                register (see resolve.register_lanes)
    L1          the micro-panels of A and B for block_k steps: (micro_m + micro_n) * block_k
                fit in L1; level 0 leaves a quarter of L1 for the accumulator tile's rows
                and the lines being prefetched
    L2          a thread's tile — A panel, B panel and accumulators,
                block_m*block_k + block_k*block_n + block_m*block_n — fits in its L2;
                among the tiles that fit, those that pack the fewest elements per
                multiply-add come first (large, and wider in N than in M, since a packed
                element of A costs more than one of B)
    L3 / cores  every thread's tile together fits in half of the shared L3

A point that breaks a rule of the template (``config.check_config``) or overflows a cache
(``check_space_point``) is left out.
"""
from __future__ import annotations

import itertools

from treadle.errors import ScheduleConfigError
from treadle.schedule.templates.gemm.config import (ELEMENT_BYTES, GemmConfig, check_config,
                                                    registers_needed)
from treadle.schedule.templates.gemm.resolve import PACK_COST_A, PACK_COST_B
from treadle.target.cpu import CpuTarget

LEVELS = (0, 1, 2)
# block_k candidates: multiples of a cache line's worth of floats (16) that unroll evenly.
BLOCK_K_STEPS = (32, 64, 96, 128, 192, 256, 384, 512)
# How many micro tiles a macro-tile holds along M and along N.
TILE_MULTIPLES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
# Fraction of L1 the micro-panels may use, per level.
L1_SHARE = {0: 3 / 4, 1: 1, 2: 1}
# Fraction of L2 a thread's tile may use, per level: (smallest, largest). The lower bound
# drops tiles too small to amortise packing; the upper leaves room for the next panels.
# Only the A panel must stay in L2 (B streams through L1 one micro-panel at a time and
# each accumulator row is touched once per K block), so the tile may take most of it.
L2_SHARE = {0: (1 / 4, 3 / 4), 1: (1 / 8, 3 / 4), 2: (1 / 16, 3 / 4)}
# Per level: how many micro tiles, block_k values and (block_m, block_n) pairs are kept.
KEEP = {0: (1, 1, 1), 1: (2, 2, 3), 2: (4, 3, 5)}


def gemm_space(level: int, target: CpuTarget) -> list[GemmConfig]:
    """The GEMM configurations of ``level`` for ``target``, best-guess first."""
    if level not in LEVELS:
        raise ValueError(f"tuning level {level!r}: expected one of {LEVELS}")
    n_micro, n_k, n_tiles = KEEP[level]
    points = []
    for micro_m, micro_n in micro_tiles(target)[:n_micro]:
        for block_k in block_ks(target, micro_m, micro_n, L1_SHARE[level])[:n_k]:
            tiles = macro_tiles(target, micro_m, micro_n, block_k, level)[:n_tiles]
            for (block_m, block_n), split_k in itertools.product(tiles, split_ks(level, target)):
                points.append(GemmConfig(block_m, block_n, block_k, micro_m, micro_n, split_k))
    valid = []
    for cfg in points:
        try:
            check_space_point(cfg, target)
        except ScheduleConfigError:
            continue
        valid.append(cfg)
    return list(dict.fromkeys(valid))


def micro_tiles(target: CpuTarget) -> list[tuple[int, int]]:
    """(micro_m, micro_n) register tiles that fill at least half the registers with
    accumulators (enough independent chains to hide the FMA latency). Ranked: tiles that
    issue no more loads than FMAs per step first (the load ports keep up with the FMA
    ports), then rows the target's widest registers hold (half the instructions per
    multiply-add where those are 512-bit), then most accumulators, then B rows of whole
    64-byte cache lines, then fewest loads per FMA."""
    lanes, registers = target.lanes(ELEMENT_BYTES), target.vector_registers
    tiles = []
    for vectors in range(1, registers):
        for micro_m in range(1, registers):
            accumulators = micro_m * vectors
            fits = registers_needed(micro_m, vectors * lanes, target) <= registers
            if fits and 2 * accumulators >= registers:
                tiles.append((micro_m, vectors * lanes))

    def rank(tile):
        micro_m, micro_n = tile
        vectors = micro_n // lanes
        whole_lines = micro_n * ELEMENT_BYTES % 64 == 0
        loads, fmas = micro_m + vectors, micro_m * vectors
        widest = target.register_lanes(micro_n) == target.widest_simd_bytes // ELEMENT_BYTES
        return (loads > fmas, not widest, -fmas, not whole_lines, loads / fmas)
    return sorted(tiles, key=rank)


def block_ks(target: CpuTarget, micro_m: int, micro_n: int, share: float = 1) -> list[int]:
    """block_k values whose A and B micro-panels fit in ``share`` of L1, largest first."""
    fits = [k for k in BLOCK_K_STEPS
            if (micro_m + micro_n) * k * ELEMENT_BYTES <= share * target.l1d_bytes]
    return sorted(fits, reverse=True)


def macro_tiles(target: CpuTarget, micro_m: int, micro_n: int, block_k: int,
                level: int) -> list[tuple[int, int]]:
    """(block_m, block_n) whose tile fits the level's share of L2 and its part of L3:
    tiles using at least the share's lower bound first (smaller ones only where a cache
    is too small for any), then by the time spent packing per multiply-add, then
    largest."""
    low, high = L2_SHARE[level]
    tiles = []
    for a, b in itertools.product(TILE_MULTIPLES, repeat=2):
        block_m, block_n = micro_m * a, micro_n * b
        size = tile_bytes(block_m, block_n, block_k)
        if size <= high * target.l2_bytes and target.cores * size <= target.l3_bytes // 2:
            tiles.append((block_m, block_n, size < low * target.l2_bytes))
    tiles.sort(key=lambda t: (t[2], pack_cost(*t[:2]), -t[0] * t[1]))
    return [(block_m, block_n) for block_m, block_n, _ in tiles]


def split_ks(level: int, target: CpuTarget) -> list[int]:
    """How many parts the K loop may be split into: 1, and for small outputs (which the
    tuner discovers by measuring) 2 or one part per core."""
    choices = {0: [1], 1: [1, target.cores], 2: [1, 2, target.cores]}[level]
    return sorted(set(choices))


def pack_cost(block_m: int, block_n: int) -> float:
    """Multiply-adds' worth of packing per multiply-add of a block_m x block_n tile."""
    return PACK_COST_A / block_n + PACK_COST_B / block_m


def tile_bytes(block_m: int, block_n: int, block_k: int) -> int:
    """Bytes of a thread's tile: A panel, B panel and the accumulators."""
    return (block_m * block_k + block_k * block_n + block_m * block_n) * ELEMENT_BYTES


def check_space_point(cfg: GemmConfig, target: CpuTarget) -> None:
    """Raises ScheduleConfigError when ``cfg`` breaks a rule of the template or overflows a
    cache of ``target`` (the shares above aside: those rank, this bounds)."""
    check_config(cfg, target)

    def fail(rule: str) -> None:
        raise ScheduleConfigError(f"{cfg}: {rule}")

    if (cfg.micro_m + cfg.micro_n) * cfg.block_k * ELEMENT_BYTES > target.l1d_bytes:
        fail(f"the micro-panels for block_k={cfg.block_k} overflow the "
             f"{target.l1d_bytes}-byte L1")
    size = tile_bytes(cfg.block_m, cfg.block_n, cfg.block_k)
    if size > target.l2_bytes:
        fail(f"the tile's {size} bytes overflow the {target.l2_bytes}-byte L2")
    if target.cores * size > target.l3_bytes // 2:
        fail(f"{target.cores} tiles of {size} bytes overflow half of the L3")
    if cfg.split_k > max(2, target.cores):
        fail(f"split_k={cfg.split_k} exceeds the {target.cores} cores")
