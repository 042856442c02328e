"""Integer products on AMX's tiles (tiles.py): uint8 by constant int8 weights summed in
int32, exactly, against numpy's int64 products at odd, prime, zero and symbolic sizes;
the same program in the IR interpreter on any CPU; the VNNI and AVX2 paths where AMX is
absent (quantised models end to end: test_tiles_models.py)."""
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.schedule.templates.gemm.test_program import runner
from treadle.backend.build import compiler_flags
from treadle.backend.cpu import generate
from treadle.config import override
from treadle.errors import IRError, ScheduleConfigError
from treadle.ir.builder import FunctionBuilder
from treadle.ir.compute import reduce
from treadle.ir.dtypes import int8, int32, uint8
from treadle.ir.expr import Buffer, Var, as_expr, broadcast, cast
from treadle.ir.lower import lower
from treadle.ir.primitives import TILE, lookup
from treadle.ir.tabulate import tabulate
from treadle.runtime.interpret import interpret
from treadle.schedule.templates.gemm import GEMM, GemmConfig, match_gemm_output, with_constants
from treadle.schedule.templates.gemm.program import emit
from treadle.schedule.templates.gemm.resolve import resolve, sized_config
from treadle.schedule.templates.gemm.tiles import MICRO_M, MICRO_N
from treadle.target.cpu import TILE_FEATURES, host

CPU_HAS_AMX = set(TILE_FEATURES) <= set(Path("/proc/cpuinfo").read_text().split())
needs_amx = pytest.mark.skipif(not (CPU_HAS_AMX and host().int8_tiles),
                               reason="the CPU lacks AMX (amx_tile, amx_int8 in /proc/cpuinfo) "
                                      "or Linux refused this process its tile data")
# The host without AMX: VNNI where it has it (as a CPU before Sapphire Rapids), and AVX2 only.
VNNI = replace(host(), features=tuple(f for f in host().features if f not in TILE_FEATURES))
AVX2 = replace(host(), features=("avx2", "fma"), vector_registers=16)
# Any CPU told it has AMX: for the interpreter, which runs the tile products by their meaning.
WITH_TILES = replace(host(), features=tuple(dict.fromkeys(host().features + TILE_FEATURES)))

ROWS = (1, 7, 61, 97, 0)
DEPTHS = (1, 3, 64, 67, 1000)
COLUMNS = (1, 17, 64, 129)


def _values(dtype, shape, seed):
    info = np.iinfo(dtype.numpy)  # the type's whole range, its limits included
    values = np.random.default_rng(seed).integers(info.min, info.max + 1, shape)
    values.flat[:2] = [info.min, info.max][:values.size]
    return values.astype(dtype.numpy)


def _weights_product(n: int, k: int, transposed=False):
    """a (M x k, M symbolic, uint8) times constant b (int8), as the template matches it."""
    M = Var("M")
    a = Buffer("a", uint8, (M, k))
    b = Buffer("b", int8, (n, k) if transposed else (k, n))
    c = reduce("c", [M, n], [k], lambda i, j, r: cast(a[i, r], int32) * cast(
        b[j, r] if transposed else b[r, j], int32))
    return a, b, replace(with_constants(match_gemm_output(c, integer=True), [b]), inputs=(a, b))


def _kernel(pattern, target, cfg=GemmConfig()):
    return emit(resolve(pattern, cfg, target), "tiles")


def _cases(b, kernel, n, k, rows, transposed=False):
    """(x, out, panels, expected) for each row count."""
    y = _values(int8, (n, k) if transposed else (k, n), seed=n + k)
    panels = np.ascontiguousarray(tabulate(kernel.derived[0], {b: y}))
    for m in rows:
        x = _values(uint8, (m, k), seed=m + 1)
        expected = x.astype(np.int64) @ (y.T if transposed else y).astype(np.int64)
        yield x, np.full((m, n), -7, np.int32), panels, expected


@needs_amx
@pytest.mark.parametrize("n", COLUMNS)
@pytest.mark.parametrize("k", DEPTHS)
def test_tile_products_exact(n, k):
    _, b, pattern = _weights_product(n, k)
    kernel = _kernel(pattern, host())
    assert "tile_dot_u8s8" in str(kernel.function)
    run = runner(kernel)
    for x, out, panels, expected in _cases(b, kernel, n, k, ROWS):
        run(x, out, panels, M=len(x))
        np.testing.assert_array_equal(out, expected, err_msg=f"{len(x)}x{n}x{k}")


# Small blocks: several K blocks (the C tiles through the accumulator between them), K
# ragged in its last block, several macro-tiles each way; and A packed once for all K.
BLOCKED = [GemmConfig(64, 64, 32, MICRO_M, MICRO_N), GemmConfig(32, 32, 16, 6, 16),
           GemmConfig(256, 64, 64, MICRO_M, MICRO_N)]


@needs_amx
@pytest.mark.parametrize("cfg", BLOCKED, ids=str)
def test_k_blocks_and_macro_tiles_exact(cfg):
    n, k = 129, 1000
    _, b, pattern = _weights_product(n, k, transposed=True)
    kernel = _kernel(pattern, host(), cfg)
    run = runner(kernel)
    for x, out, panels, expected in _cases(b, kernel, n, k, (97, 200), transposed=True):
        run(x, out, panels, M=len(x))
        np.testing.assert_array_equal(out, expected)


@needs_amx
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # runner's NaN fill
def test_left_packed_once_for_all_k():
    """Constant M within one block of rows, several column blocks and K blocks: A packed
    for every K block first (resolve._one_row_of_tiles), in tile order."""
    n, k, m = 129, 1000, 61
    a, b = Buffer("a", uint8, (m, k)), Buffer("b", int8, (k, n))
    c = reduce("c", [m, n], [k], lambda i, j, r: cast(a[i, r], int32) * cast(b[r, j], int32))
    pattern = replace(with_constants(match_gemm_output(c, integer=True), [b]), inputs=(a, b))
    with override(num_threads=1):  # two would split the rows in two blocks
        gemm = resolve(pattern, GemmConfig(64, 32, 128, MICRO_M, MICRO_N), host())
        assert gemm.whole_left and gemm.tiled
        run = runner(emit(gemm, "tiles"))
        for x, out, panels, expected in _cases(b, run.kernel, n, k, (m,)):
            run(x, out, panels)
            np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("n, k", [(17, 67), (33, 3)])
def test_interpreter_runs_tile_products_on_any_cpu(n, k):
    """The tile program, K ragged, rows and columns past the matrix, in the numpy
    interpreter: tile_dot_u8s8 by its definition, no AMX needed."""
    _, b, pattern = _weights_product(n, k)
    kernel = _kernel(pattern, WITH_TILES, GemmConfig(64, 32, 16, MICRO_M, MICRO_N))
    for x, out, panels, expected in _cases(b, kernel, n, k, (1, 35)):
        interpret(kernel.function, x, out, panels, M=len(x))
        np.testing.assert_array_equal(out, expected)


def test_tile_product_meaning():
    """tile_dot_u8s8 against the product of the tiles' bytes, written out."""
    gen = np.random.default_rng(0)
    acc, a, b = (gen.integers(-2**31, 2**31, 256).astype(np.int32) for _ in range(3))
    a_bytes = a.view(np.uint8).reshape(16, 16, 4).astype(np.int64)  # [m, k word, byte]
    b_bytes = b.view(np.int8).reshape(16, 16, 4).astype(np.int64)   # [k word, n, byte]
    expected = acc.reshape(16, 16) + np.einsum("mki,kni->mn", a_bytes, b_bytes)
    got = lookup("tile_dot_u8s8").numpy(acc, a, b)
    np.testing.assert_array_equal(got.reshape(16, 16), expected.astype(np.int32))


@pytest.mark.parametrize("target, word", [(VNNI, "dot_u8s8"), (AVX2, "dot_s16")],
                         ids=["vnni", "avx2"])
def test_without_amx_the_vector_register_tile_runs(target, word):
    """A target without AMX (forced as the AVX2 one is) keeps the vector register tile,
    its space and its compiler flags."""
    if word == "dot_u8s8" and not target.int8_dot(16):
        pytest.skip("the CPU lacks AVX-512 VNNI")
    n, k = 17, 67
    _, b, pattern = _weights_product(n, k)
    kernel = _kernel(pattern, target)
    text = str(kernel.function)
    assert word in text and "tile_" not in text
    assert not any("amx" in flag for flag in compiler_flags(target))
    assert all(cfg.micro_m != MICRO_M for cfg in GEMM.space(pattern, 1, target))
    run = runner(kernel)
    for x, out, panels, expected in _cases(b, kernel, n, k, (1, 61)):
        run(x, out, panels, M=len(x))
        np.testing.assert_array_equal(out, expected)


def test_tile_space_and_fitted_configs():
    """The tile space's points, and any other config (a vector space's, a constructed
    one, a size-specific variant's) fitted to the tiles' register tile."""
    _, _, pattern = _weights_product(129, 1000)
    space = GEMM.space(pattern, 2, WITH_TILES)
    assert len(GEMM.space(pattern, 0, WITH_TILES)) == 1 and len(space) > 3
    for cfg in space + [GemmConfig(), GemmConfig(12, 32, 5, 6, 16, split_k=3)]:
        GEMM.check(pattern, cfg, WITH_TILES)
        fitted = resolve(pattern, cfg, WITH_TILES).cfg
        assert (fitted.micro_m, fitted.micro_n, fitted.split_k) == (MICRO_M, MICRO_N, 1)
        assert fitted.block_m % MICRO_M == fitted.block_n % MICRO_N == fitted.block_k % 16 == 0
    variant = sized_config(pattern, space[0], WITH_TILES, {Var("M"): 7})
    assert resolve(pattern, variant, WITH_TILES).tiled
    with pytest.raises(ScheduleConfigError):
        GEMM.check(pattern, GemmConfig(block_k=0), WITH_TILES)
    assert any("amx-int8" in flag for flag in compiler_flags(WITH_TILES))


def test_products_of_two_activations_keep_the_vector_register_tile():
    """Tiles read B laid out when compiling: a right factor computed at run time is
    packed for the vector register tile instead."""
    M, K, N = Var("M"), Var("K"), Var("N")
    a, b = Buffer("a", uint8, (M, K)), Buffer("b", int8, (K, N))
    c = reduce("c", [M, N], [K], lambda i, j, r: cast(a[i, r], int32) * cast(b[r, j], int32))
    gemm = resolve(replace(match_gemm_output(c, integer=True), inputs=(a, b)), GemmConfig(),
                   WITH_TILES)
    assert not gemm.tiled and "tile_" not in str(emit(gemm, "words").function)


def _tile_function(scopes: list[int]):
    """A function declaring tile buffers of the given sizes, each in a block of its own
    (a loop body), zeroing them and storing them to memory."""
    with FunctionBuilder("tiles") as fb:
        out = fb.param("out", "int32", [8 * 256])
        for count in scopes:
            for _ in fb.range(1, name="block"):
                tiles = fb.buffer("t", TILE, [count])
                for t in range(count):
                    tiles[t] = broadcast(as_expr(0, int32), 256)
                    out[t * 256] = tiles[t]
    return fb.function


def test_tile_registers_are_numbered_per_block():
    """Tile buffers take AMX's registers in declaration order and give them back at the
    end of their block; more than eight at once is an error naming the buffer."""
    source = generate([_tile_function([8, 8])])
    assert source.count("_tile_zero(7)") == 2 and "_tile_stored(7, &out[1792], 64)" in source
    with pytest.raises(IRError, match="tile buffer t"):
        generate([_tile_function([9])])


@pytest.mark.parametrize("target", [WITH_TILES, VNNI], ids=["tiles", "vnni"])
def test_words_of_four_bytes_are_read_at_once(target):
    """Packing reads each word of four consecutive bytes of A as one 32-bit load (which
    gcc vectorises), not byte by byte; K a multiple of 4 (the ragged last word of other K
    keeps its bounds checks). AVX2's words are two 16-bit halves, each a widened byte."""
    _, _, pattern = _weights_product(64, 64)
    source = generate([lower(_kernel(pattern, target).function, target)])
    assert "treadle_word_load(&" in source and "<< 24" not in source
