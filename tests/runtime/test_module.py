"""Loading and calling compiled kernels: threads, argument errors, dumps."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from treadle.config import override
from treadle.errors import ArgumentError, DTypeError, ShapeError
from treadle.ir.builder import FunctionBuilder
from treadle.ir.expr import cast
from treadle.ir.stmt import Module
from treadle.runtime.build import compile_module


def _affine():
    """Y[i, j] = X[i, j] * 2 + i, rows in parallel."""
    with FunctionBuilder("affine") as fb:
        M, N = fb.symbol("M"), fb.symbol("N")
        X = fb.param("X", "float32", [M, N])
        Y = fb.param("Y", "float32", [M, N])
        for i in fb.range(M, kind="parallel"):
            for j in fb.range(N, name="j"):
                Y[i, j] = X[i, j] * 2.0 + cast(i, "float32")
    return fb.function


def _fill():
    """Z[k] = value for k < count: a symbol that no shape determines."""
    with FunctionBuilder("fill") as fb:
        n, count = fb.symbol("n"), fb.symbol("count")
        Z = fb.param("Z", "int32", [n])
        for k in fb.range(count, name="k"):
            Z[k] = cast(k, "int32")
    return fb.function


@pytest.fixture(scope="module")
def module():
    return compile_module(Module("test_module", (_affine(), _fill())))


def _expected(x: np.ndarray) -> np.ndarray:
    return x * 2 + np.arange(x.shape[0], dtype=np.float32)[:, None]


def test_calls_from_four_threads(module):
    kernel = module.affine

    def work(seed: int) -> bool:
        rng = np.random.default_rng(seed)
        for _ in range(25):
            x = rng.standard_normal((int(rng.integers(1, 40)), 33)).astype(np.float32)
            y = np.empty_like(x)
            kernel(x, y)
            if not np.allclose(y, _expected(x), rtol=1e-6):
                return False
        return True

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(work, range(4)))


def test_lookup_by_name(module):
    assert module["affine"] is module.affine
    with pytest.raises(KeyError, match="no function 'nope'"):
        module["nope"]
    with pytest.raises(AttributeError):
        module.nope


def test_symbols_from_shapes_and_keywords(module):
    z = np.full(6, -1, np.int32)
    module.fill(z, count=4)
    np.testing.assert_array_equal(z, [0, 1, 2, 3, -1, -1])
    with pytest.raises(ArgumentError, match="count"):
        module.fill(z)


def test_bad_arguments_name_the_argument(module):
    x = np.zeros((3, 4), np.float32)
    y = np.zeros((3, 4), np.float32)
    with pytest.raises(DTypeError, match="'X'"):
        module.affine(x.astype(np.float64), y)
    with pytest.raises(ShapeError, match="'Y'"):
        module.affine(x, np.zeros((3, 5), np.float32))
    with pytest.raises(ShapeError, match="'X'"):
        module.affine(np.zeros(12, np.float32), y)
    with pytest.raises(ArgumentError, match="'X'.*contiguous"):
        module.affine(np.zeros((4, 3), np.float32).T, y)
    readonly = y.copy()
    readonly.flags.writeable = False
    with pytest.raises(ArgumentError, match="'Y'.*read-only"):
        module.affine(x, readonly)
    with pytest.raises(ArgumentError, match="takes 2 arrays"):
        module.affine(x)
    with pytest.raises(ArgumentError, match="'X'.*'Y'|'Y'.*'X'"):
        module.affine(x, x)


def test_dump_writes_the_source(tmp_path):
    with override(dump_dir=tmp_path):
        compile_module(Module("dumped/../module", (_fill(),)))
    (source,) = tmp_path.rglob("kernel.c")
    assert "int32_t kernel_fill(" in source.read_text()
    assert source.is_relative_to(tmp_path)


def test_num_threads_setting(module):
    with override(num_threads=1):
        single = compile_module(Module("single_thread", (_affine(),))).affine
    x = np.ones((5, 3), np.float32)
    y = np.empty_like(x)
    single(x, y)
    np.testing.assert_array_equal(y, _expected(x))
