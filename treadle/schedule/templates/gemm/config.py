"""A point of the GEMM template's schedule space, and the rules every point must keep.

The rules here are the ones without which no program exists (positive sizes, whole SIMD
vectors, blocks of whole register tiles, a register tile the register file holds); they
hold for any problem. What depends on the problem (clamping to its sizes, the stack the
clamped panels need) is decided by ``resolve``; how well a point uses the caches is the
space's concern (``space``), not a rule.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from treadle.errors import ScheduleConfigError
from treadle.target.cpu import CpuTarget

ELEMENT_BYTES = 4  # float32, or the int32 words of an integer product (see words.py)


@dataclass(frozen=True)
class GemmConfig:
    """One point of the schedule space: macro-tile (block_*), register tile (micro_*), and
    how many parts the K loop is split into (split_k, for small M x N)."""
    block_m: int = 192
    block_n: int = 256
    block_k: int = 256
    micro_m: int = 6
    micro_n: int = 16
    split_k: int = 1


def registers_needed(micro_m: int, micro_n: int, target: CpuTarget) -> int:
    """Vector registers a register tile holds at once: its accumulators, one row of B and
    the broadcast of A, counted in 256-bit vectors also where a 16-wide row takes one
    512-bit register (see resolve.register_lanes)."""
    vectors = micro_n // target.lanes(ELEMENT_BYTES)
    return micro_m * vectors + vectors + 1


def check_config(cfg: GemmConfig, target: CpuTarget, tiles: bool = False) -> None:
    """Raises ScheduleConfigError, naming the rule, for a config the template cannot
    generate on ``target``. On ``tiles`` (AMX, see tiles.py) any positive sizes serve:
    resolution fits them to the tiles' register tile."""
    bad = [f"{f.name}={getattr(cfg, f.name)!r}" for f in fields(cfg)
           if not (type(getattr(cfg, f.name)) is int and getattr(cfg, f.name) >= 1)]
    if bad:
        raise ScheduleConfigError(f"{cfg}: every size must be a positive integer, got "
                                  f"{', '.join(bad)}")
    if tiles:
        return
    lanes = target.lanes(ELEMENT_BYTES)
    if cfg.micro_n % lanes:
        raise ScheduleConfigError(f"{cfg}: micro_n={cfg.micro_n} is not a multiple of {lanes} "
                                  f"SIMD lanes")
    if cfg.block_m % cfg.micro_m or cfg.block_n % cfg.micro_n:
        raise ScheduleConfigError(f"{cfg}: block {cfg.block_m}x{cfg.block_n} is not a multiple "
                                  f"of the register tile {cfg.micro_m}x{cfg.micro_n}")
    needed = registers_needed(cfg.micro_m, cfg.micro_n, target)
    if needed > target.vector_registers:
        raise ScheduleConfigError(f"{cfg}: register tile {cfg.micro_m}x{cfg.micro_n} needs "
                                  f"{needed} vector registers, the target has "
                                  f"{target.vector_registers}")
