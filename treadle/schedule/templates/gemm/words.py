"""Integer products as products of words: how the GEMM template multiplies 8-bit factors.

A product of 8-bit integers summed in int32 (``sum(int32(a) * int32(b))``, what
MatMulInteger and the quantised convolutions compute) runs on instructions that take
several consecutive K positions at once in each 32-bit lane: VNNI's vpdpbusd multiplies
four unsigned bytes of A by four signed bytes of B and adds the four products to the lane;
without VNNI, vpmaddwd multiplies two 16-bit halves by two and adds the pair. So the
template sees the innermost K axis in words of ``group`` positions: each factor becomes
an int32 expression packing ``group`` of its elements (the last word zero-padded), the
K axis ``ceil(K / group)`` words long, and the register tile's multiply-add the
instruction's. Everything else (blocks, packing, the panels laid out at compile time, the
epilogue) is the float32 program's over 4-byte elements. Where the CPU has AMX and the
right factor is constant, the register tile is made of tiles instead (tiles.py): the
same words, ``tdpbusd`` multiplying 16 x 16 of them by 16 x 16 at once.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from treadle.ir.compute import Compute
from treadle.ir.dtypes import int8, int16, int32, uint8, uint32
from treadle.ir.expr import Expr, Var, as_expr, cast, ceil_div, minimum, select
from treadle.ir.functor import substitute
from treadle.schedule.templates.gemm.pattern import GemmPattern, byte_factor, static
from treadle.schedule.templates.thresholds import WORD_BYTES
from treadle.target.cpu import CpuTarget

@dataclass(frozen=True)
class Words:
    """``group`` K positions per int32 word, multiplied and added by ``multiply_add``."""
    group: int
    multiply_add: str  # a primitive of ir.primitives: dot_u8s8 or dot_s16

    @property
    def bits(self) -> int:
        return 32 // self.group


BYTES = Words(WORD_BYTES, "dot_u8s8")
HALVES = Words(2, "dot_s16")
TILES = Words(WORD_BYTES, "tile_dot_u8s8")


def words_for(pattern: GemmPattern, lanes: int, target: CpuTarget) -> Words:
    """Tiles where ``tiled``; bytes where the CPU multiplies unsigned bytes of A by signed
    bytes of B in one instruction (VNNI) and the factors are those; 16-bit halves
    otherwise, which hold either signedness exactly."""
    if tiled(pattern, target):
        return TILES
    if _unsigned_by_signed(pattern) and target.int8_dot(lanes):
        return BYTES
    return HALVES


def tiled(pattern: GemmPattern, target: CpuTarget) -> bool:
    """Whether the product runs on AMX's tiles: unsigned bytes of A by signed bytes of a
    constant B (laid out in tile order when compiling; products of two activations keep
    the vector register tile), on a target with AMX."""
    if pattern.words is not None:
        return pattern.words == TILES
    return (pattern.accumulator == int32 and pattern.constant_right and target.int8_tiles
            and _unsigned_by_signed(pattern))


def _unsigned_by_signed(pattern: GemmPattern) -> bool:
    return (byte_factor(pattern.left).dtype == uint8
            and byte_factor(pattern.right).dtype == int8)


@functools.lru_cache(maxsize=256)  # resolved against every point of a space
def in_words(pattern: GemmPattern, words: Words) -> GemmPattern:
    """``pattern`` with its innermost K axis counted in words: both factors packed, the
    axis ``ceil(K / group)`` long."""
    c = pattern.compute
    axis, extent = c.reduce_axes[-1], c.reduce_extents[-1]
    word = Var(f"{axis.name}_word", axis.dtype)
    count = as_expr(ceil_div(static(extent), words.group), extent.dtype)
    compute = Compute(c.buffer, c.axes, c.value, (*c.reduce_axes[:-1], word),
                      (*c.reduce_extents[:-1], count), c.reduce_op, c.sources)
    left = _packed(byte_factor(pattern.left), axis, static(extent), word, words)
    right = _packed(byte_factor(pattern.right), axis, static(extent), word, words)
    return replace(pattern, compute=compute, left=left, right=right, words=words)


def _packed(value: Expr, axis: Var, extent, word: Var, words: Words) -> Expr:
    """The int32 word of ``value`` at K positions word * group + j: byte (or 16-bit half)
    j holds the j-th, zero past the axis's end. Packed in uint32, whose shifts C defines
    for every value."""
    ragged = not (isinstance(extent, int) and extent % words.group == 0)
    mask = (1 << words.bits) - 1
    total = None
    for j in range(words.group):
        k = word * words.group + j
        at = substitute(value, {axis: minimum(k, extent - 1) if ragged else k})
        lane = cast(cast(at, int16) if words is HALVES else at, uint32) & mask
        if ragged:
            lane = select(k < extent, lane, 0)
        part = lane << (words.bits * j) if j else lane
        total = part if total is None else total | part
    return cast(total, int32)
