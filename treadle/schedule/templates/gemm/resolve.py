"""From a point of the GEMM space to the program's every size: ``resolve``.

A config names blocks and a register tile for any problem; ``resolve`` fits it to one
problem, once and purely, in this order: blocks clamped to the constant sizes they tile
(``_clamped``), short K blocks for a right factor streamed in place or one K block over
laid-out panels (``_streaming``, ``_one_pass_over_panels``), blocks that split M and N
evenly over the workers (``_balanced``), K blocks of whole rows (``_whole_rows``), tiles
halved until their buffers fit the stack (``_within_stack``); then whether the threads
pack the left factor together, and the stack check, which raises ScheduleConfigError
where even the smallest tile overflows. The result, ``ResolvedGemm``, is all
``program.emit`` reads: two configs that resolve alike generate the same program, which
is how tuning finds duplicates without generating any.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from treadle.errors import ScheduleConfigError
from treadle.ir.builder import FunctionBuilder
from treadle.ir.compute import Compute, compute
from treadle.ir.dtypes import int32
from treadle.ir.expr import Load, Var, ceil_div, maximum, minimum, select
from treadle.ir.functor import substitute, walk
from treadle.ir.mapping import unravel
from treadle.schedule.templates.gemm.config import (ELEMENT_BYTES, GemmConfig, check_config,
                                                    registers_needed)
from treadle.schedule.templates.gemm.micro_kernel import RegisterTile
from treadle.schedule.templates.gemm.pattern import (ROLES, GemmPattern, plain_left,
                                                     product, right_row, role_extents,
                                                     round_up, static)
from treadle.schedule.templates.gemm.tiles import K_STEP, MICRO_N, TILE_WORDS, tile_config
from treadle.schedule.templates.gemm.words import TILES, in_words, tiled, words_for
from treadle.schedule.tiling import known
from treadle.target.cpu import CpuTarget

# Micro-panels of N a window read in place may feed: two (ResNeXt's 32-channel groups)
# ran 1.35x faster in place, each reading the window from L1 rather than packing it.
WINDOW_PANELS = 2
WIDE_WINDOW_COLUMNS = 32  # a micro-panel of a wider window, where two registers hold it
STACK_BYTES = 1 << 20  # the packed panels and accumulator live on a thread's stack
CACHE_LINE = 64
# Time to pack one element, in multiply-adds (measured on 1024^3): A goes through the left
# factor's index arithmetic (a convolution's im2col) row by row of the tile, B is copied
# from laid-out rows. A packed A element is reused block_n times, a B one block_m.
PACK_COST_A, PACK_COST_B = 12, 8


@dataclass(frozen=True)
class ResolvedGemm:
    """One GEMM and the config fitted to it: everything its program is generated from.
    Equal values generate equal programs (``panels`` and ``extents`` follow from the
    compared fields)."""
    pattern: GemmPattern
    cfg: GemmConfig  # the config after every clamp and balance
    threads: int
    lanes: int  # of the register tile's vectors (see register_lanes)
    whole_left: bool = False  # the threads pack the left factor for all of K first
    cached_left: bool = True  # the left factor's buffers fit the target's L2 (see in_place)
    extents: dict = field(default=None, compare=False)  # role -> extents of its axes
    panels: Compute | None = field(default=None, compare=False)  # laid-out right factor

    @property
    def config(self) -> GemmConfig:
        return self.cfg

    @property
    def tiled(self) -> bool:
        """Whether the register tile is AMX's tiles (see tiles.py)."""
        return self.pattern.words == TILES

    @property
    def register_tile(self) -> RegisterTile:
        words = self.pattern.words
        return RegisterTile(self.cfg.micro_m, self.cfg.micro_n, self.lanes,
                            "fma" if words is None else words.multiply_add)

    def size(self, role: str):
        return product(self.extents[role])

    def coords(self, fb: FunctionBuilder, role: str, flat) -> dict:
        """The axes of ``role`` at a flat position, bound once by lets."""
        axes = self.pattern.axes(role)
        if not axes:
            return {}
        values = unravel(flat, self.extents[role])
        return {a: fb.let(a.name, v) for a, v in zip(axes, values)}

    @property
    def tile_rows(self):
        """Rows per macro-tile (see tile_rows)."""
        return tile_rows(self.cfg, self.size("batch"), self.size("m"), self.size("n"),
                         self.threads)

    @property
    def num_tiles(self):
        return (self.size("batch") * ceil_div(self.size("m"), self.tile_rows)
                * ceil_div(self.size("n"), self.cfg.block_n))

    @property
    def _window_in_place(self) -> bool:
        """A left factor read through a window of several taps, in place: the tile's
        columns all of N and at most WINDOW_PANELS micro-panels (a grouped convolution's 16
        or 32; where tiles split a wider N each rereads the window, and ResNet-50's 3x3
        layers ran 3-5% slower), K with rows, and the factor within L2 (see in_place). A
        1x1 convolution is no such window: EfficientNet's projections, whose input a
        squeeze-and-excitation gate scales in a prologue fused later, ran slower in place."""
        n = product(self.extents["n"])
        return (self.cached_left and self.pattern.words is None
                and window_taps(self.extents["k"]) and isinstance(n, int)
                and self.cfg.block_n >= n and n <= WINDOW_PANELS * self.cfg.micro_n)

    @property
    def in_place(self) -> tuple[bool, bool]:
        """Whether the left and the right factor are read in place, not packed: a factor
        that only one register tile reads per K block (the macro-tile is one micro-panel
        wide in the other factor's direction: GEMV, tall-skinny shapes), as packing it
        would cost as much as the products. A left factor read through a window (a
        grouped convolution's im2col) is read in place under _window_in_place's
        conditions, K walked row by row (k_row), a window position's address computed
        once per row: per position it cost more than packing (RegNet's 16-channel
        groups ran 1.2x slower). In place from beyond L2 the reads of a tile's rows of
        pixels, a group's cache line of each, wait on memory between multiply-adds, where
        packing streams them (RegNet's first grouped layer, 3.3 MB, 1.2x slower)."""
        cfg = self.cfg
        if self.tiled:  # tile loads read A packed and B laid out
            return False, False
        return (cfg.block_n == cfg.micro_n and plain_left(self.pattern)
                or self._window_in_place,
                cfg.block_m == cfg.micro_m and self.panels is None
                and right_row(self.pattern) is not None)


def tile_rows(cfg: GemmConfig, batch, M, N, threads: int):
    """Rows per macro-tile: block_m, which resolution balances over the threads where M
    is known (``_balanced``). Where M is symbolic, an expression that evens the row
    blocks out at run time instead, up to block_m: as many blocks as keep every thread
    busy, each a whole number of micro-panels (ResNet-50 at a symbolic batch of 1: 196
    rows in blocks of 168 and 28 left one of two threads idle most of the time, 1.7x
    slower than two blocks of 98)."""
    if isinstance(M, int) or cfg.block_m == cfg.micro_m:
        return cfg.block_m
    per_row_block = batch * ceil_div(N, cfg.block_n)
    if not isinstance(per_row_block, int):
        return cfg.block_m
    spread = threads // math.gcd(threads, per_row_block)  # row blocks that fill the threads
    if spread == 1:
        return cfg.block_m
    blocks = maximum(ceil_div(M, cfg.block_m) + (spread - 1), spread) // spread * spread
    rows = ceil_div(ceil_div(M, blocks), cfg.micro_m) * cfg.micro_m
    return minimum(cfg.block_m, maximum(rows, cfg.micro_m))  # one micro-panel at M = 0


def resolve(pattern: GemmPattern, cfg: GemmConfig, target: CpuTarget) -> ResolvedGemm:
    """``cfg`` fitted to ``pattern`` on ``target`` (see the module's docstring); raises
    ScheduleConfigError for a config the template cannot generate."""
    gemm = _fitted(pattern, cfg, target, {})
    gemm = replace(gemm, whole_left=_one_row_of_tiles(gemm, target))
    _check_stack(gemm)
    return gemm


def sized_config(pattern: GemmPattern, cfg: GemmConfig, target: CpuTarget,
                 env: Mapping[Var, int]) -> GemmConfig:
    """The config ``resolve`` fits to ``pattern`` with its symbols at the values of
    ``env``: what a compile for those sizes alone would run, as a candidate variant of
    the symbolic kernel (``tune.dynamic``). K keeps its symbols: a variant's K block
    serves every K it dispatches to, and one fitted to a single K splits the others
    oddly (attention's P V at T = 24 and 31 ran 1.4x slower in K blocks of 18 than of
    64, and no faster at 17)."""
    return _fitted(pattern, cfg, target, env, ("batch", "m", "n")).cfg


def _fitted(pattern: GemmPattern, cfg: GemmConfig, target: CpuTarget, env: Mapping[Var, int],
            roles: Sequence[str] = ROLES) -> ResolvedGemm:
    """The clamp, stream and balance chain, on the sizes the symbols take in ``env`` in
    the sizes of ``roles`` (a symbol missing from it leaves its sizes untouched)."""
    tiles = tiled(pattern, target)
    check_config(cfg, target, tiles)
    fit = tile_config if tiles else (lambda config: config)
    cfg = fit(cfg)
    if pattern.accumulator == int32 and pattern.words is None:
        pattern = in_words(pattern, words_for(pattern, register_lanes(cfg, target), target))
    threads = target.cores
    extents = role_extents(pattern)
    sizes = {r: known(product(extents[r]), env) if r in roles else product(extents[r])
             for r in ROLES}
    M, N, K = sizes["m"], sizes["n"], sizes["k"]
    cached_left = _left_bytes(pattern) <= target.l2_bytes
    if cached_left and window_taps(extents["k"]):
        cfg = _wide_window_tile(cfg, N, target)
    workers = threads if cfg.split_k == 1 else worker_groups(cfg, threads)
    panels = None
    if pattern.constant_right:
        panels = tile_panel_layout(pattern) if tiles else panel_layout(pattern, cfg.micro_n)

    def fitted(config: GemmConfig) -> ResolvedGemm:
        config = fit(config)
        return ResolvedGemm(pattern, config, threads, register_lanes(config, target),
                            cached_left=cached_left, extents=extents, panels=panels)
    clamped = fit(_clamped(cfg, M, N, K))
    if fitted(clamped).in_place[1]:
        clamped = _streaming(clamped, M, N, K)
    elif panels is not None:
        clamped = _one_pass_over_panels(clamped, M, N, K)
    clamped = _balanced(clamped, sizes["batch"], M, N, workers, packs_right=panels is None)
    if fitted(clamped)._window_in_place:
        clamped = _window_tiles(clamped, extents["m"], K)
    return _within_stack(fitted(_whole_rows(clamped, extents["k"])))


# Memoised, as are the panels: a pattern is resolved against every point of a space.
@functools.lru_cache(maxsize=256)
def _left_bytes(pattern: GemmPattern) -> float:
    """The bytes of the buffers the left factor reads; infinite where one is symbolic."""
    total = 0.0
    for buffer in {n.buffer for n in walk(pattern.left) if isinstance(n, Load)}:
        size = product([static(d) for d in buffer.shape])
        if not isinstance(size, int):
            return float("inf")
        total += size * buffer.dtype.nbytes
    return total


def register_lanes(cfg: GemmConfig, target: CpuTarget) -> int:
    """Lanes of the register tile's vectors: a row of 16 floats takes one 512-bit register
    where the target has them. Tiles are still sized in 256-bit vectors (check_config,
    the schedule space), so the widest registers serve 16-wide tiles, not tiles twice as
    wide: on 128 x 768 x 768, 14 x 16 in 512-bit registers ran 9-11% faster than in
    256-bit ones and 3-10% faster than 14 x 32 or 12 x 32 in 512-bit ones."""
    return target.register_lanes(cfg.micro_n, ELEMENT_BYTES)


def _clamped(cfg: GemmConfig, M, N, K) -> GemmConfig:
    """Blocks no larger than the constant sizes they tile (no padded work on small dims),
    and micro-panels of A as even as the register tile allows: as many as micro_m rows
    need, each of the fewest rows that cover M (M = 49 takes 4 of 13 rows, not 4 of 14)."""
    if isinstance(M, int):
        panels = -(-max(M, 1) // cfg.micro_m)
        micro_m = -(-max(M, 1) // panels)
        block_m = cfg.block_m // cfg.micro_m * micro_m
        cfg = replace(cfg, micro_m=micro_m, block_m=min(block_m, round_up(M, micro_m)))
    if isinstance(N, int):
        cfg = replace(cfg, block_n=min(cfg.block_n, round_up(N, cfg.micro_n)))
    if isinstance(K, int):
        cfg = replace(cfg, block_k=min(cfg.block_k, max(K, 1)))
    return cfg


# A right factor read in place (one micro-panel of rows: GEMV, decoding) streams from
# memory; short K blocks over wide column blocks walk few rows at a time, each over a
# long contiguous stretch, which the hardware prefetcher follows (3x faster than 256 x 256
# on a 1 x 4096 x 4096 GEMV).
STREAM_BLOCK_K = 8
STREAM_BLOCK_N = 1024


def _streaming(cfg: GemmConfig, M, N, K) -> GemmConfig:
    if cfg.block_k <= STREAM_BLOCK_K:  # streamed already (a resolved config, resolved again)
        return _clamped(cfg, M, N, K)
    block_n = max(cfg.block_n, round_up(STREAM_BLOCK_N, cfg.micro_n))
    return _clamped(replace(cfg, block_k=min(cfg.block_k, STREAM_BLOCK_K), block_n=block_n),
                    M, N, K)


def _one_pass_over_panels(cfg: GemmConfig, M, N, K) -> GemmConfig:
    """With one micro-panel of rows (GEMV, decoding), each of B's laid-out micro-panels is
    read once: all of K in one block streams each micro-panel whole, a long contiguous
    stretch the hardware prefetcher follows, rather than a short stretch per K block."""
    one_panel = isinstance(M, int) and M <= cfg.micro_m
    if one_panel and isinstance(K, int) and 4 * cfg.micro_m * K <= STACK_BYTES // 4:
        return replace(cfg, block_k=max(K, 1))
    return cfg


def _wide_window_tile(cfg: GemmConfig, N, target: CpuTarget) -> GemmConfig:
    """A cached window (see _window_in_place) of more columns than WINDOW_PANELS of the
    config's micro-panels but at most WINDOW_PANELS of WIDE_WINDOW_COLUMNS, where those
    fill two 512-bit registers: a register tile that wide (6 x 32), so the window is read
    in place rather than packed with every tap (Inception's 5 x 5 convolution to 64
    channels 1.7x faster, ResNet-50's 7 x 7 stem 1.4x)."""
    wide = WIDE_WINDOW_COLUMNS
    if not (isinstance(N, int) and WINDOW_PANELS * cfg.micro_n < N <= WINDOW_PANELS * wide
            and target.register_lanes(wide) * 2 == wide):
        return cfg
    rows = max(m for m in range(1, cfg.micro_m + 1)
               if registers_needed(m, wide, target) <= target.vector_registers)
    return replace(cfg, micro_m=rows, micro_n=wide, block_m=cfg.block_m // cfg.micro_m * rows,
                   block_n=round_up(cfg.block_n, wide))


def _window_tiles(cfg: GemmConfig, m_extents: Sequence, K) -> GemmConfig:
    """A window read in place: micro-panels of rows that divide the image's width, so each
    panel's pixels lie in one row of the image (their addresses a row's start plus a
    stride, not one register each: M = 7 x 7 in panels of 13 ran out of registers), and
    K in one block where it spans at most two (no accumulator round trip between them).
    ResNeXt's and RegNet's 7 x 7 grouped layers ran 1.3-1.4x faster."""
    width = m_extents[-1] if m_extents else None
    if isinstance(width, int):
        rows = max(d for d in range(1, cfg.micro_m + 1) if width % d == 0)
        if 2 * rows >= cfg.micro_m:
            cfg = replace(cfg, micro_m=rows, block_m=max(rows, cfg.block_m // rows * rows))
    if isinstance(K, int) and K <= 2 * cfg.block_k:
        cfg = replace(cfg, block_k=max(K, 1))
    return cfg


def _balanced(cfg: GemmConfig, batch, M, N, workers: int, packs_right: bool) -> GemmConfig:
    """For constant sizes, blocks no larger than the config's that split M and N evenly and
    keep ``workers`` equally busy: the most useful work per padded, packed tile slot; for
    a symbolic M, blocks that split a constant N evenly.

    The overhead term is the packing per multiply-add (PACK_COST_A, PACK_COST_B; on
    1024^3 larger blocks win over evener ones). A right factor laid out at compile time
    (``packs_right`` false) costs nothing per tile; between tilings that score alike it
    then gives each thread rows of its own (M in a multiple of ``workers`` blocks): each
    packs only its rows of A, where a split of N packs all of A in a parallel loop of its
    own whose panels every thread reads (128 x 768 x 768: 65-row tiles 5% faster than
    384-column ones, warm or cold)."""
    if isinstance(N, int) and N > 0 and not isinstance(M, int):
        # M symbolic (tile_rows evens its blocks out at run time): N in even blocks
        # (512 columns in blocks of 384 and 128 kept one of two threads idle 3/4 of the time)
        even = round_up(ceil_div(N, ceil_div(N, cfg.block_n)), cfg.micro_n)
        return replace(cfg, block_n=min(cfg.block_n, even))
    if not all(isinstance(v, int) and v > 0 for v in (batch, M, N)):
        return cfg
    mr, nr = cfg.micro_m, cfg.micro_n
    tiles_m, tiles_n = ceil_div(M, cfg.block_m), ceil_div(N, cfg.block_n)
    cost_b = PACK_COST_B if packs_right else 0

    def score(tm: int, tn: int) -> tuple[float, int, int, int]:
        bm, bn = round_up(ceil_div(M, tm), mr), round_up(ceil_div(N, tn), nr)
        tiles = batch * ceil_div(M, bm) * ceil_div(N, bn)
        slots = ceil_div(tiles, workers) * workers * bm * bn
        value = batch * M * N / slots / (1 + PACK_COST_A / bn + cost_b / bm)
        return value, bm, bn, ceil_div(M, bm)

    candidates = [score(tm, tn) for tm in range(tiles_m, tiles_m + 2 * workers + 1)
                  for tn in range(tiles_n, tiles_n + 2 * workers + 1)]
    _, bm, bn, _ = max(candidates, key=lambda c: (c[0], not packs_right and c[3] % workers == 0))
    return replace(cfg, block_m=bm, block_n=bn)


# Positions in a row of K that packing walks without dividing; a shorter innermost axis
# is merged with the next ones out (see k_row).
MIN_ROW = 16


def window_taps(k_extents: Sequence) -> bool:
    """Whether K runs over several window positions, each a row of channels (a KxK
    convolution's im2col, not a 1x1 one's)."""
    row = k_row(k_extents)
    return row is not None and product(k_extents[:-row[0]]) != 1


def k_row(k_extents: Sequence) -> tuple[int, int] | None:
    """(axes, width): how many innermost of several K axes packing walks as one row (see
    k_walk), and the row's length. The innermost axis (a convolution's input channels)
    alone, or merged with the next ones out while shorter than MIN_ROW: the 3 channels of
    an image make rows of 3 x kernel width, one contiguous stretch of a channels-last
    input, whose coordinates the simplifier folds back into the address."""
    count, width = 0, 1
    for extent in reversed(k_extents[1:]):  # at least one axis stays outside the row
        if not isinstance(extent, int):
            break
        count, width = count + 1, width * extent
        if width >= MIN_ROW:
            break
    return (count, width) if count else None


def _whole_rows(cfg: GemmConfig, k_extents: Sequence) -> GemmConfig:
    """A K block of whole rows, where one fits."""
    row = k_row(k_extents)
    if row is not None and row[1] <= cfg.block_k:
        return replace(cfg, block_k=cfg.block_k // row[1] * row[1])
    return cfg


def _one_row_of_tiles(gemm: ResolvedGemm, target: CpuTarget) -> bool:
    """Whether every macro-tile spans the same rows (constant M within one block, no batch)
    and the left factor packed for all of K stays in the cores' L2 caches: the threads
    then pack A once, together, instead of once per tile each (a 128 x 768 x 3072 dense
    layer re-packed A for each of its N tiles; a 7x7x512 3x3 convolution, 49 x 4608,
    spent a fifth of its time packing all of A on both threads). A symbolic tile count
    packs per tile: that is right for any count."""
    cfg, M, K, tiles = gemm.cfg, gemm.size("m"), gemm.size("k"), gemm.num_tiles
    if not (isinstance(M, int) and isinstance(K, int) and M <= cfg.block_m
            and gemm.size("batch") == 1 and cfg.split_k == 1 and not gemm.in_place[0]
            and isinstance(tiles, int) and tiles > 1):
        return False
    packed_bytes = 4 * ceil_div(K, cfg.block_k) * cfg.block_m * left_row(cfg)
    return packed_bytes <= target.cores * target.l2_bytes


def _within_stack(gemm: ResolvedGemm) -> ResolvedGemm:
    """Smaller macro-tiles, the larger side halved (in micro-tile steps) until the buffers
    and a split K's workspace fit the stack: tiles sized for a large L2 (2 MB a core)
    overflow it where the right factor is packed there too, as for a product of two
    activations."""
    while 4 * max(_stack_floats(gemm), _workspace_floats(gemm)) > STACK_BYTES:
        cfg = gemm.cfg
        m_steps, n_steps = cfg.block_m // cfg.micro_m, cfg.block_n // cfg.micro_n
        if max(m_steps, n_steps) == 1:
            break  # as small as it gets; the check names the problem
        if cfg.block_m * (m_steps > 1) >= cfg.block_n * (n_steps > 1):
            cfg = replace(cfg, block_m=cfg.micro_m * ceil_div(m_steps, 2))
        else:
            cfg = replace(cfg, block_n=cfg.micro_n * ceil_div(n_steps, 2))
        gemm = replace(gemm, cfg=cfg)
    return gemm


def _stack_floats(gemm: ResolvedGemm) -> int:
    cfg = gemm.cfg
    a_floats = 0 if gemm.in_place[0] else cfg.block_m * left_row(cfg)
    return a_floats + _b_pack_floats(gemm) + _output_floats(cfg)


def _workspace_floats(gemm: ResolvedGemm) -> int:
    cfg = gemm.cfg
    if cfg.split_k == 1:
        return 0
    return worker_groups(cfg, gemm.threads) * cfg.split_k * cfg.block_m * cfg.block_n


def _check_stack(gemm: ResolvedGemm) -> None:
    """The config, clamped to the problem, must fit its buffers on the stack."""
    cfg = gemm.cfg
    floats = _stack_floats(gemm)
    if 4 * floats > STACK_BYTES:
        raise ScheduleConfigError(f"panels and accumulator of {cfg} need {4 * floats} bytes "
                                  f"of stack, more than {STACK_BYTES}")
    workspace = 4 * _workspace_floats(gemm)
    if workspace > STACK_BYTES:
        raise ScheduleConfigError(f"split_k={cfg.split_k} needs a {workspace}-byte workspace, "
                                  f"more than {STACK_BYTES}")


def _b_pack_floats(gemm: ResolvedGemm) -> int:
    """The size of the right factor's packed panels on the stack."""
    cfg = gemm.cfg
    if gemm.panels is not None:
        return 0
    return (cfg.micro_n if gemm.in_place[1] else cfg.block_n) * panel_rows(cfg)


def _output_floats(cfg: GemmConfig) -> int:
    """The accumulator of a macro-tile and the finished rows of one micro-panel."""
    return (cfg.block_m + cfg.micro_m) * cfg.block_n


def worker_groups(cfg: GemmConfig, threads: int) -> int:
    """How many macro-tiles split_k workers compute at once."""
    return max(1, threads // cfg.split_k)


def left_row(cfg: GemmConfig) -> int:
    """Floats from one packed row of A to the next: block_k and a cache line, so that the
    rows of a micro-panel fall in different L1 sets when block_k is a power of two."""
    return cfg.block_k + ceil_div(CACHE_LINE, 4)


def panel_rows(cfg: GemmConfig) -> int:
    """Rows of one packed B micro-panel: block_k, plus at least a cache line (see
    pack_right)."""
    return cfg.block_k + ceil_div(CACHE_LINE, 4 * cfg.micro_n)


@functools.lru_cache(maxsize=256)
def panel_layout(pattern: GemmPattern, nr: int) -> Compute:
    """The constant right factor as [ceil(N / nr), K, nr]: a register tile's micro-panel
    is one contiguous stretch, read in K order as packing would lay it out. Columns past
    N repeat the last one (their sums are never stored)."""
    N, K = (product(role_extents(pattern)[r]) for r in ("n", "k"))
    return compute("panels", [ceil_div(N, nr), K, nr],
                   lambda q, k, r: _right_at(pattern, q * nr + r, k))


@functools.lru_cache(maxsize=256)
def tile_panel_layout(pattern: GemmPattern) -> Compute:
    """The constant right factor as tiles.py's tile loads read it: [column tiles, K words
    x 16], a tile of 16 columns' K words one word-row after the other, K zero-padded to
    whole K steps and the columns to whole micro tiles (two column tiles)."""
    N, K = (product(role_extents(pattern)[r]) for r in ("n", "k"))
    tiles = ceil_div(N, MICRO_N) * (MICRO_N // TILE_WORDS)
    k_words = max(ceil_div(K, K_STEP), 1) * K_STEP

    def element(q, f):
        k = f // TILE_WORDS
        value = _right_at(pattern, q * TILE_WORDS + f % TILE_WORDS, minimum(k, K - 1))
        return select(k < K, value, 0)
    return compute("panels", [tiles, k_words * TILE_WORDS], element)


def _right_at(pattern: GemmPattern, column, k):
    """The right factor at flat column ``column`` (past N: the last) and K position k."""
    extents = role_extents(pattern)
    n = unravel(minimum(column, product(extents["n"]) - 1), extents["n"])
    coords = {**dict(zip(pattern.n_axes, n)),
              **dict(zip(pattern.compute.reduce_axes, unravel(k, extents["k"])))}
    return pattern.element(substitute(pattern.right, coords))
