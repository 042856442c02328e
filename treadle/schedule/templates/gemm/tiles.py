"""Integer products on AMX's tiles: the register tile of words.py's byte products, made of
tile registers.

AMX holds eight tiles of 16 rows x 64 bytes; ``tdpbusd`` adds to a 16 x 16 int32 tile the
products of a tile of 16 rows x 16 words of unsigned bytes (A) and a tile of 16 word-rows
x 16 columns of signed bytes (B): B's rows are words of four consecutive K positions,
the layout words.py packs the right factor in already. The register tile is 2 x 2 such
tiles of C (32 x 32 int32), fed by two tiles of A and two of B per step of 16 words (64
K positions): all eight registers.

Every operand a tile load reads is laid out tile by tile, its 16 rows of 64 bytes one
after the other: the IR holds a tile as one int32 vector of 256 lanes, which a load reads
contiguously, so the interpreter runs the same program as the CPU (see
ir.primitives.tile_dot_u8s8). A's packed panels are [micro-panel][K step][2 tiles]; the
constant right factor is laid out once, when compiling, as [column tile][K word][16]
(resolve.tile_panel_layout); the accumulator between K blocks holds the C tiles tile
by tile too, and in the last K block they go through a small int32 scratch straight
through the epilogue to the output (program._store_tile), without the vector register
tile's buffer of rows. K's
last step is zero-padded in A (pad_left, packing._tile_walk), so whatever B holds past K
adds nothing; rows and columns past the matrix are computed and never stored, as in the
vector register tile.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import int32
from treadle.ir.expr import Buffer, Expr, as_expr, broadcast, call, ceil_div, eq, minimum
from treadle.ir.primitives import TILE, TILE_ROWS, TILE_WORDS
from treadle.schedule.templates.gemm.config import GemmConfig
from treadle.schedule.templates.gemm.micro_kernel import Slice
from treadle.schedule.templates.gemm.pattern import round_up

TILE_LANES = TILE_ROWS * TILE_WORDS
C_TILES = (2, 2)  # C tiles along M and N: 2 + 2 more registers for A and B make AMX's eight
MICRO_M, MICRO_N = C_TILES[0] * TILE_ROWS, C_TILES[1] * TILE_WORDS
PAIRS = [(i, j) for i in range(C_TILES[0]) for j in range(C_TILES[1])]  # C tiles, in order
K_STEP = TILE_WORDS  # words of K one tile product takes


def tile_config(cfg: GemmConfig) -> GemmConfig:
    """``cfg`` fitted to the tile register tile: the micro tile AMX's (any other config's,
    from construction or a vector space, maps to it), blocks of whole micro tiles and
    whole K steps, K not split (a tile's part of K runs whole steps; small outputs have
    few tiles to share but each is fast)."""
    return replace(cfg, micro_m=MICRO_M, micro_n=MICRO_N,
                   block_m=round_up(cfg.block_m, MICRO_M),
                   block_n=round_up(cfg.block_n, MICRO_N),
                   block_k=round_up(cfg.block_k, K_STEP), split_k=1)


# The space on tiles, in words of K (4 bytes). K blocks of 256 words: A's micro-panel
# stays in L1 while B's stream from L2, and between K blocks the sums stay tile by tile
# in the accumulator (a register tile's four tiles stored and loaded again); all of K in
# one block, which streams both from L2, comes second (128 x 3072 x 768 ran alike either
# way). Column blocks of
# all of N up to 1024: A is packed once per column block (1024^3: blocks of 128 x 1024
# ran 1.2-1.3x faster than 128 x 512). Measured on a busy, shared machine.
TILE_BLOCKS_K = (256, 1024, 512)
TILE_BLOCKS_MN = ((128, 1024), (128, 512), (64, 512), (256, 256), (128, 256), (192, 384))
TILE_KEEP = {0: (1, 1), 1: (2, 3), 2: (3, 6)}


def tile_space(level: int) -> list[GemmConfig]:
    """The tile configs of ``level``, best-guess first (as gemm_space's levels)."""
    if level not in TILE_KEEP:
        raise ValueError(f"tuning level {level!r}: expected one of {tuple(TILE_KEEP)}")
    ks, tiles = TILE_KEEP[level]
    return [GemmConfig(block_m, block_n, block_k, MICRO_M, MICRO_N)
            for block_k in TILE_BLOCKS_K[:ks] for block_m, block_n in TILE_BLOCKS_MN[:tiles]]


def left_tiles_shape(block_m: int, block_k: int) -> tuple[int, int, int]:
    """A's packed K block: [micro-panels][K steps][the micro-panel's row tiles]."""
    return (block_m // MICRO_M, ceil_div(block_k, K_STEP), C_TILES[0] * TILE_LANES)


@dataclass(frozen=True)
class TiledLeft:
    """A's packed panels in tile order, indexed as pack_left writes them: [p, r, kk] is
    row r of micro-panel p at word kk of the K block."""
    buffer: Buffer | Slice

    def __setitem__(self, index: tuple, value) -> None:
        self.buffer[self._at(*index)] = value

    @staticmethod
    def _at(p, r, kk) -> tuple:
        tile, row = r // TILE_ROWS, r % TILE_ROWS
        return p, kk // K_STEP, tile * TILE_LANES + row * TILE_WORDS + kk % K_STEP

    def tile(self, p, step, i) -> Expr:
        """The tile of rows [16 i, 16 i + 16) of micro-panel p at K step ``step``."""
        return _vload(self.buffer, (p, step, i * TILE_LANES))


def _vload(buffer: Buffer | Slice, index: tuple) -> Expr:
    if isinstance(buffer, Slice):
        return buffer.buffer.vload((buffer.first, *index), TILE_LANES)
    return buffer.vload(index, TILE_LANES)


def pad_left(fb: FunctionBuilder, left: TiledLeft, rows, depth) -> None:
    """Zeros in A past the K block's last word up to a whole K step, in each of the
    ``rows`` rows' micro-panels: their products with whatever B holds there add 0."""
    pad = ceil_div(depth, K_STEP) * K_STEP - depth
    for p in fb.range(ceil_div(rows, MICRO_M), name="p"):
        for r in fb.range(MICRO_M, name="r"):
            for kk in fb.range(pad, name="kk"):
                left[p, r, depth + kk] = as_expr(0, int32)


@dataclass(frozen=True)
class TilePanels:
    """The laid-out right factor (tile_panel_layout) from column tile ``first`` and K word
    ``k0``."""
    buffer: Buffer
    first: Expr
    k0: Expr

    def tile(self, q, j, kk) -> Expr:
        """Column tile j of micro-panel q, its 16 word-rows from word kk of the block."""
        return self.buffer.vload((self.first + q * C_TILES[1] + j,
                                  (self.k0 + kk) * TILE_WORDS), TILE_LANES)


def tile_product(fb: FunctionBuilder, acc: Buffer, at, first, depth, left: TiledLeft,
                 right: TilePanels, p, q,
                 last: tuple[Expr, Callable[[Buffer], None]] | None = None) -> None:
    """acc[at:] (+)= the 32 x 32 register tile's sums over the K block's ``depth`` words,
    A's micro-panel p by B's q, on AMX's tile registers; acc holds them tile by tile
    (C tiles in PAIRS order), as tile loads and stores read and write them. With
    ``last`` = (condition, finish), where the condition holds the sums go to
    ``finish(sums)`` (a scratch in acc's order, read by tile_index) instead."""
    c = fb.buffer("c_tiles", TILE, [len(PAIRS)])
    a = fb.buffer("a_tiles", TILE, [C_TILES[0]])
    b = fb.buffer("b_tiles", TILE, [C_TILES[1]])
    with fb.if_(first):
        for t in range(len(PAIRS)):
            c[t] = broadcast(as_expr(0, int32), TILE_LANES)
    with fb.else_():
        for t in range(len(PAIRS)):
            c[t] = acc.vload(at + t * TILE_LANES, TILE_LANES)
    for step in fb.range(ceil_div(depth, K_STEP), name="ks"):
        # Each operand loaded just before its first product: tile registers are not
        # renamed, so a load waits for the products still reading its register, and
        # loads interleaved with products overlap them.
        loaded = set()
        for t, (i, j) in enumerate(PAIRS):
            for buffer, n, tile in ((a, i, lambda: left.tile(p, step, i)),
                                    (b, j, lambda: right.tile(q, j, step * K_STEP))):
                if (buffer, n) not in loaded:
                    buffer[n] = tile()
                    loaded.add((buffer, n))
            c[t] = call("tile_dot_u8s8", c[t], a[i], b[j])
    if last is None:
        _store_tiles(c, acc, at)
        return
    done, finish = last
    with fb.if_(done):
        sums = fb.buffer("sums", int32, [len(PAIRS) * TILE_LANES])
        _store_tiles(c, sums, 0)
        finish(sums)
    with fb.else_():
        _store_tiles(c, acc, at)


def _store_tiles(c: Buffer, into: Buffer, at) -> None:
    for t in range(len(PAIRS)):
        into[at + t * TILE_LANES] = c[t]


def acc_size(block_m: int, block_n: int) -> int:
    """The int32 accumulator of a macro tile, its register tiles' sums tile by tile."""
    return block_m * block_n


def acc_offset(p, q, block_n: int) -> Expr:
    """Where the accumulator (acc_size) holds register tile (p, q)'s sums."""
    return (p * (block_n // MICRO_N) + q) * (MICRO_M * MICRO_N)


def tile_index(i: int, j: int, r, w) -> Expr:
    """Where the scratch of tile_product holds row r, column w of C tile (i, j)."""
    return as_expr(PAIRS.index((i, j)) * TILE_LANES) + r * TILE_WORDS + w


def tile_parts(p, q, rows, cols) -> list[tuple[tuple[int, int], Expr, Expr]]:
    """((i, j), rows, columns) of each C tile of register tile (p, q) within a macro
    tile of ``rows`` x ``cols`` (at most 16 each; at most 0 past the edge)."""
    parts = []
    for i, j in PAIRS:
        row0, col0 = p * MICRO_M + i * TILE_ROWS, q * MICRO_N + j * TILE_WORDS
        parts.append(((i, j), minimum(rows - row0, TILE_ROWS), minimum(cols - col0, TILE_WORDS)))
    return parts


def begin_tiles(fb: FunctionBuilder) -> None:
    """Configures this thread's tile registers (once per parallel iteration: the
    configuration belongs to the thread that runs it)."""
    fb.assert_(eq(call("tile_begin", as_expr(TILE_ROWS, int32)), 0),
               "Linux refused this process AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM)")


def end_tiles(fb: FunctionBuilder) -> None:
    """Releases this thread's tile registers (their state no longer saved on switches)."""
    fb.evaluate(call("tile_end", as_expr(0, int32)))
