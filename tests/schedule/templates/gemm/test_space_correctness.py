"""Every point of the full GEMM space computes the right product: symbolic sizes that
include 1, odd and prime extents, and a concrete prime shape (where tiles are clamped)."""
import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle.errors import ScheduleConfigError
from treadle.ir.compute import reduce
from treadle.ir.dtypes import float32
from treadle.ir.expr import Buffer, Var
from treadle.runtime.build import build
from treadle.schedule.templates.gemm import match_gemm, schedule_gemm
from treadle.schedule.templates.gemm.space import gemm_space
from treadle.target.cpu import host

SYMBOLIC_SIZES = [(1, 1, 1), (7, 61, 13), (97, 3, 257), (13, 130, 2), (0, 61, 13),
                  (5, 0, 7), (4, 9, 0), (3, 17, 2039)]
CONCRETE = (61, 37, 97)


def kernels(m, n, k):
    a, b = Buffer("a", float32, (m, k)), Buffer("b", float32, (k, n))
    c = reduce("c", [m, n], [k], lambda i, j, r: a[i, r] * b[r, j])
    pattern = match_gemm(c)
    functions = {}
    for index, cfg in enumerate(gemm_space(2, host())):
        try:
            kernel = schedule_gemm(f"cfg{index}", [a, b], pattern, cfg)
        except ScheduleConfigError:
            continue  # the template may refuse a point for these sizes; the tuner skips it
        functions[cfg] = kernel.function
    return functions


def check_all(functions, sizes):
    compiled = build(list(functions.values()), host(), "space")
    for cfg, function in functions.items():
        for m, n, k in sizes:
            a, b = random_array((m, k), seed=m), random_array((k, n), seed=n)
            c = np.full((m, n), np.nan, np.float32)
            compiled[function.name](a, b, c)
            assert_close(c, a @ b, reduction=k, context=f"{cfg} at {m}x{n}x{k}")


@pytest.mark.parametrize("symbolic", [True, False], ids=["symbolic", "concrete"])
def test_every_config_of_the_full_space(symbolic):
    if symbolic:
        functions = kernels(Var("M"), Var("N"), Var("K"))
        assert len(functions) == len(gemm_space(2, host()))
        check_all(functions, SYMBOLIC_SIZES)
    else:
        functions = kernels(*CONCRETE)
        assert functions
        check_all(functions, [CONCRETE])
