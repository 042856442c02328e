"""What a GEMM config costs at given sizes, in the terms the dynamic-shape cost model
(``tune.dynamic``) weighs: the multiply-adds its register tiles compute (padding
included: a tile past the matrix's edge computes whole), the bytes of the right factor
it streams (once per block of rows: blocks of fewer rows re-read B more often; the first
read comes from memory, the others mostly from cache), and how
many macro-tiles the threads share; and the features of its micro-kernel, from which the
model learns the time of one multiply-add.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from treadle.ir.expr import Var, as_expr
from treadle.ir.functor import evaluate
from treadle.schedule.templates.gemm.config import ELEMENT_BYTES, registers_needed
from treadle.schedule.templates.gemm.pattern import round_up
from treadle.schedule.templates.gemm.resolve import ResolvedGemm
from treadle.target.cpu import CpuTarget


@dataclass(frozen=True)
class Work:
    macs: int          # multiply-adds of the register tiles, padding included
    useful_macs: int   # of the problem itself
    right_bytes: int   # the right factor read, once per block of rows
    right_once: int    # the right factor's own size: the first of those reads
    tiles: int         # parallel units of work (macro-tiles, times the K split)
    threads: int

    @property
    def occupancy(self) -> float:
        """The share of thread slots busy over the rounds the tiles take."""
        if self.tiles == 0:
            return 1.0
        rounds = -(-self.tiles // self.threads)
        return self.tiles / (rounds * self.threads)


def work(gemm: ResolvedGemm, env: Mapping[Var, int]) -> Work:
    """The work of ``gemm`` with its symbols at the values of ``env``."""
    batch, M, N, K = (_size(gemm.size(r), env) for r in ("batch", "m", "n", "k"))
    cfg = gemm.cfg
    row_blocks = -(-M // _size(gemm.tile_rows, env))
    tiles = batch * row_blocks * -(-N // cfg.block_n) * cfg.split_k
    once = ELEMENT_BYTES * batch * N * K
    return Work(batch * round_up(M, cfg.micro_m) * round_up(N, cfg.micro_n) * K,
                batch * M * N * K, once * row_blocks, once if M else 0, tiles, gemm.threads)


def features(gemm: ResolvedGemm, target: CpuTarget) -> dict[str, float]:
    """The micro-kernel's shape and how it sits in the registers and caches."""
    cfg, e = gemm.cfg, ELEMENT_BYTES
    left, right = gemm.in_place
    return {
        "micro_m": cfg.micro_m, "micro_n": cfg.micro_n, "block_m": cfg.block_m,
        "block_n": cfg.block_n, "block_k": cfg.block_k, "split_k": cfg.split_k,
        "registers": registers_needed(cfg.micro_m, cfg.micro_n, target) / target.vector_registers,
        "l1": (cfg.micro_m + cfg.micro_n) * cfg.block_k * e / target.l1d_bytes,
        "l2": (cfg.block_m * cfg.block_k + cfg.block_k * cfg.block_n
               + cfg.block_m * cfg.block_n) * e / target.l2_bytes,
        "intensity": cfg.micro_m * cfg.micro_n / (cfg.micro_m + cfg.micro_n),
        "lanes": gemm.lanes, "left_in_place": float(left), "right_in_place": float(right),
        "laid_out": float(gemm.panels is not None)}


def _size(value, env: Mapping[Var, int]) -> int:
    return value if isinstance(value, int) else int(evaluate(as_expr(value), env))
