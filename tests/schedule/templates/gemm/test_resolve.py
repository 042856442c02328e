"""Resolution: a config fitted to one problem, once and purely. Equal resolved values
generate equal programs (what tuning relies on to find duplicates without generating
any); clamps, streaming and the stack check happen here."""
from dataclasses import replace

import pytest

from treadle.config import override
from treadle.errors import ScheduleConfigError
from treadle.ir.compute import reduce
from treadle.ir.dtypes import float32
from treadle.ir.expr import Buffer, Var, as_expr
from treadle.ir.functor import evaluate
from treadle.ir.printer import format_function
from treadle.schedule.templates.gemm import GEMM, GemmConfig, match_gemm
from treadle.schedule.templates.gemm.pattern import interleaved_batch
from treadle.schedule.templates.gemm.resolve import STREAM_BLOCK_K, resolve, sized_config
from treadle.schedule.templates.gemm.space import gemm_space
from treadle.target.cpu import host


def matmul(m, n, k):
    a, b = Buffer("a", float32, (m, k)), Buffer("b", float32, (k, n))
    c = reduce("c", [m, n], [k], lambda i, j, r: a[i, r] * b[r, j])
    return replace(match_gemm(c), inputs=(a, b))


def program(resolved) -> str:
    return format_function(GEMM.emit(resolved, "g").function)


def test_configs_the_rules_forbid_raise():
    with override(num_threads=2), pytest.raises(ScheduleConfigError,
                                                match="multiple of the register tile"):
        resolve(matmul(Var("M"), Var("N"), Var("K")), GemmConfig(block_m=100), host())


@pytest.mark.parametrize("cfg", [GemmConfig(block_m=96, block_n=512, block_k=1024),
                                 GemmConfig(block_m=384, block_n=512, block_k=16, split_k=2)],
                         ids=["panels", "workspace"])
def test_tiles_too_large_for_the_stack_shrink_to_fit(cfg):
    """A macro-tile whose packed panels (or split-K workspace) overflow the stack, as a
    large L2's tiles do, is halved on its larger side until they fit."""
    with override(num_threads=2):
        fitted = resolve(matmul(Var("M"), Var("N"), Var("K")), cfg, host()).config
    assert fitted.block_k == cfg.block_k and fitted.split_k == cfg.split_k
    assert fitted.block_m * fitted.block_n < cfg.block_m * cfg.block_n
    assert fitted.block_m % fitted.micro_m == 0 and fitted.block_n % fitted.micro_n == 0


def test_resolution_is_pure():
    pattern, cfg = matmul(61, 37, 97), GemmConfig(12, 32, 16, 6, 16)
    first, second = resolve(pattern, cfg, host()), resolve(pattern, cfg, host())
    assert first == second and hash(first) == hash(second)
    assert program(first) == program(second)


@pytest.mark.parametrize("sizes", [(61, 37, 97), (5, 24, 40), ("M", "N", "K"), (1, 384, 2039)],
                         ids=str)
def test_configs_that_resolve_alike_generate_the_same_program(sizes):
    pattern = matmul(*(Var(s) if isinstance(s, str) else s for s in sizes))
    by_resolved: dict = {}
    for cfg in gemm_space(2, host()):
        try:
            by_resolved.setdefault(resolve(pattern, cfg, host()), []).append(cfg)
        except ScheduleConfigError:
            continue
    shared = [cfgs for cfgs in by_resolved.values() if len(cfgs) > 1]
    if all(isinstance(s, int) for s in sizes[:2]) and sizes[0] < 8:
        assert shared  # blocks larger than a small problem clamp alike
    for resolved, cfgs in by_resolved.items():
        programs = {program(resolve(pattern, cfg, host())) for cfg in cfgs}
        assert programs == {program(resolved)}, cfgs


def test_blocks_clamp_to_the_problem():
    """13 rows in register tiles of up to 6: three micro-panels of 5 rows (not 6, 6, 1);
    blocks no larger than the sizes they tile."""
    resolved = resolve(matmul(13, 40, 20), GemmConfig(192, 256, 256, 6, 16), host())
    cfg = resolved.config
    assert (cfg.micro_m, cfg.block_m) == (5, 15)
    assert cfg.block_n <= 48 and cfg.block_k <= 20


def test_a_right_factor_read_in_place_streams_in_short_k_blocks():
    resolved = resolve(matmul(1, 4096, 512), GemmConfig(), host())
    assert resolved.in_place[1]
    assert resolved.config.block_k == STREAM_BLOCK_K


def test_symbolic_sizes_keep_the_config_blocks():
    cfg = GemmConfig(12, 32, 16, 6, 16)
    assert resolve(matmul(Var("M"), Var("N"), Var("K")), cfg, host()).config == cfg


@pytest.mark.parametrize("m", [1, 7, 16, 61, 128])
def test_a_sized_config_is_what_a_compile_for_that_size_resolves_to(m):
    """Dynamic tuning's stand-in candidates: the config fitted at a size of a symbol,
    which the symbolic problem then keeps (its M stays symbolic, so nothing re-clamps)."""
    M = Var("M")
    cfg = gemm_space(0, host())[0]
    with override(num_threads=2):
        sized = sized_config(matmul(M, 384, 256), cfg, host(), {M: m})
        assert sized == resolve(matmul(m, 384, 256), cfg, host()).config
        assert resolve(matmul(M, 384, 256), sized, host()).config == sized
        assert sized_config(matmul(M, 384, 256), cfg, host(), {}) == \
            resolve(matmul(M, 384, 256), cfg, host()).config


@pytest.mark.parametrize("t", [1, 7, 18, 61])
def test_a_sized_config_keeps_a_symbolic_k_block(t):
    """Attention's P V has K = T: a variant fitted at one T keeps the config's K block
    (or the streaming one, where one micro-panel of rows reads the right factor in
    place), which must serve every T it is dispatched to, while its rows are fitted to
    T."""
    T = Var("T")
    cfg = GemmConfig(block_m=42, block_n=64, block_k=64, micro_m=14, micro_n=16)
    with override(num_threads=2):
        sized = sized_config(matmul(T, 64, T), cfg, host(), {T: t})
        fitted = resolve(matmul(t, 64, t), cfg, host()).config
    assert sized.block_k == (STREAM_BLOCK_K if sized.block_m == sized.micro_m else 64)
    assert (sized.micro_m, sized.block_m) == (fitted.micro_m, fitted.block_m)


@pytest.mark.parametrize("sizes", [(1, 384, 256), (7, 768, 768), (61, 37, 97), ("M", 384, 256),
                                   ("M", "N", 64)], ids=str)
def test_resolving_a_resolved_config_changes_nothing(sizes):
    """A resolved config, as a record stores it or a dynamic variant carries it, resolves
    to itself."""
    pattern = matmul(*(Var(s) if isinstance(s, str) else s for s in sizes))
    with override(num_threads=2):
        for cfg in gemm_space(1, host()):
            once = resolve(pattern, cfg, host()).config
            assert resolve(pattern, once, host()).config == once, cfg


def window_product(side, columns=16, kernel=3, group_channels=16, groups=None):
    """A ``kernel`` x ``kernel`` convolution's product over one group of
    ``group_channels`` channels channels-last (im2col addressing), ``columns`` wide; with
    ``groups``, over each of that many groups side by side in a pixel (the batch axis)."""
    edge = side + kernel - 1
    if groups is None:
        x = Buffer("x", float32, (edge, edge, group_channels))
        w = Buffer("w", float32, (kernel, kernel, group_channels, columns))
        c = reduce("c", [side, side, columns], [kernel, kernel, group_channels],
                   lambda h, v, o, kh, kw, i: x[h + kh, v + kw, i] * w[kh, kw, i, o])
    else:
        x = Buffer("x", float32, (edge, edge, groups * group_channels))
        w = Buffer("w", float32, (groups, kernel, kernel, group_channels, columns))
        c = reduce("c", [groups, side, side, columns], [kernel, kernel, group_channels],
                   lambda g, h, v, o, kh, kw, i:
                   x[h + kh, v + kw, g * group_channels + i] * w[g, kh, kw, i, o])
    return replace(match_gemm(c), inputs=(x, w))


@pytest.mark.parametrize("side,columns,kernel,in_place", [
    (20, 16, 3, True), (20, 32, 3, True),  # one or two micro-panels of a cached image
    (400, 16, 3, False),  # beyond L2: packing streams it
    (20, 96, 3, False),  # tiles would each reread the window
    (20, 16, 1, False)])  # 1x1: no window
def test_a_window_left_factor_is_read_in_place_where_it_pays(side, columns, kernel, in_place):
    """A window's im2col rows read where they lie, K walked row by row of channels."""
    target = host()
    assert ((side + 2) ** 2 * 16 * 4 <= target.l2_bytes) == (side < 400)
    resolved = resolve(window_product(side, columns, kernel), GemmConfig(), target)
    assert resolved.in_place[0] == in_place
    # In place, the multiply-adds broadcast the image's elements themselves.
    assert ("fma(broadcast(x0[" in program(resolved)) == in_place


def test_a_window_of_up_to_64_columns_takes_a_register_tile_32_wide():
    """Where 32 columns fill two 512-bit registers, a cached window 64 columns wide gets
    a 6 x 32 register tile (rows evened to the image's width: 20 = 4 x 5) and is read in
    place; with 256-bit registers (8 per 64 columns) it stays 16 wide and packed."""
    target = host()
    resolved = resolve(window_product(20, 64, 3), gemm_space(0, target)[0], target)
    wide = target.register_lanes(32) == 16
    assert resolved.in_place[0] == wide
    assert resolved.config.micro_n == (32 if wide else gemm_space(0, target)[0].micro_n)
    if wide:
        assert resolved.config.micro_m == 5 and 20 % resolved.config.micro_m == 0


@pytest.mark.parametrize("side", [7, 13, 14, 28, 17])
def test_a_window_read_in_place_takes_panels_along_image_rows(side):
    """In place, a micro-panel of rows lies in one row of the image where a divisor of its
    width is at least half the register tile the product would take otherwise (a 7 x 7
    image in panels of 7, not of 13), and K (3 x 3 x 32 = 288, past the level-0 block of
    256) is one block."""
    level0 = gemm_space(0, host())[0]
    plain = resolve(matmul(side * side, 32, 288), level0, host()).config.micro_m
    resolved = resolve(window_product(side, 32, 3, 32), level0, host())
    assert resolved.in_place[0]
    cfg = resolved.config
    fitting = [d for d in range(1, plain + 1) if side % d == 0 and 2 * d >= plain]
    assert cfg.micro_m == (max(fitting) if fitting else plain)
    assert cfg.block_m % cfg.micro_m == 0 and cfg.block_k == 288
    if side == 7 and plain >= 7:
        assert cfg.micro_m == 7


def test_groups_side_by_side_in_a_pixel_interleave_with_the_rows():
    """A channels-last grouped convolution's groups share the image's pixels; attention's
    heads own rows of their own, and so does a product without batch."""
    assert interleaved_batch(window_product(9, groups=4))
    q, k = Buffer("q", float32, (12, 64, 32)), Buffer("k", float32, (12, 32, 64))
    heads = reduce("s", [12, 64, 64], [32], lambda h, i, j, r: q[h, i, r] * k[h, r, j])
    assert not interleaved_batch(match_gemm(heads))
    assert not interleaved_batch(matmul(64, 64, 64))


@pytest.mark.parametrize("m, blocks", [(1, 1), (28, 2), (196, 2), (400, 4), (784, 6)])
def test_symbolic_rows_split_evenly_over_the_threads(m, blocks):
    """Where M is symbolic, the row blocks even out at run time: a multiple of the two
    threads' count (where the rows fill that many micro-panels), each a whole number of
    micro-panels and at most block_m rows."""
    M = Var("M")
    with override(num_threads=2):
        gemm = resolve(matmul(M, 256, 64), GemmConfig(168, 256, 64, 14, 16), host())
    rows = evaluate(as_expr(gemm.tile_rows), {M: m})
    assert rows % 14 == 0 and rows <= 168
    assert -(-m // rows) == blocks


def test_symbolic_rows_split_a_constant_n_evenly():
    with override(num_threads=2):
        gemm = resolve(matmul(Var("M"), 512, 64), GemmConfig(168, 384, 64, 14, 16), host())
    assert gemm.config.block_n == 256
