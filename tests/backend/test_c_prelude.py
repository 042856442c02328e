"""The C prelude's float32 math: accuracy against float64 references over a sweep with
special values, and loops calling it vectorising under treadle's compiler flags."""
from __future__ import annotations

import math
import subprocess

import numpy as np
import pytest

from treadle.backend.build import compiler_flags
from treadle.backend.cpu import build, generate
from treadle.config import config
from treadle.ir.builder import FunctionBuilder
from treadle.ir.expr import call
from treadle.runtime.module import load
from treadle.target.cpu import host

SPECIALS = [0.0, -0.0, 1e-45, -1e-45, 1e-38, 1e-30, -1e-30, 1e-4, 0.5, 1.0, 3.9, 4.0, 7.9,
            8.0, 20.0, 88.72, 88.73, -87.3, -100.0, -103.9, -104.5, 1e30, -1e30,
            math.inf, -math.inf, math.nan]

# primitive -> (float64 reference, inputs beyond the specials, max relative error).
# Relative errors are for normal results; a subnormal result may also be off by one
# unit of the subnormal spacing (2^-149).
CASES = {
    "exp": (np.exp, np.linspace(-120.0, 120.0, 240_001), 1.2e-7),  # < 1 ulp; clamped past 104
    "log": (np.log, np.concatenate([np.linspace(0.0, 4.0, 200_001),
                                    np.logspace(-45, 38, 100_001)]), 1.2e-7),  # < 2 ulp
    "erf": (np.vectorize(math.erf), np.linspace(-6.0, 6.0, 120_001), 4e-7),  # < 6.5 ulp
    "tanh": (np.tanh, np.linspace(-12.0, 12.0, 120_001), 3e-7),  # < 5 ulp
}


def _apply(name: str, divide: bool = False):
    """y[i] = f(x[i]), or f(x[i]) / x[0]: a division after the call must vectorise too."""
    with FunctionBuilder(f"apply_{name}") as fb:
        n = fb.symbol("n")
        x = fb.param("x", "float32", [n])
        y = fb.param("y", "float32", [n])
        for i in fb.range(n):
            y[i] = call(name, x[i]) / x[0] if divide else call(name, x[i])
    return fb.function


@pytest.mark.parametrize("name", CASES)
def test_float32_math_matches_float64_reference(name):
    reference, sweep, rtol = CASES[name]
    tiny = np.logspace(-44, 1, 2000)
    x = np.concatenate([SPECIALS, sweep, tiny, -tiny]).astype(np.float32)
    func = _apply(name)
    y = np.empty_like(x)
    getattr(load(build(generate([func]), "test_prelude"), [func]), func.name)(x, y)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        expected = reference(x.astype(np.float64))
        expected_specials = expected[:len(SPECIALS)].astype(np.float32)
    finite = np.isfinite(expected) & (np.abs(expected) <= np.finfo(np.float32).max)
    error = np.abs(y[finite] - expected[finite])
    bound = np.maximum(rtol * np.abs(expected[finite]), 2.0 ** -149)
    worst = np.argmax(error / bound)
    assert np.all(error <= bound), (x[finite][worst], y[finite][worst], expected[finite][worst])
    # Overflow, infinities, NaN and signed zeros exactly as float32 libm gives them.
    np.testing.assert_array_equal(y[:len(SPECIALS)][~finite[:len(SPECIALS)]],
                                  expected_specials[~finite[:len(SPECIALS)]])
    assert np.array_equal(np.signbit(y[:2]), np.signbit(expected_specials[:2]))
    if name in ("erf", "tanh"):  # odd functions: exact +-1 at infinity
        np.testing.assert_array_equal(y[SPECIALS.index(math.inf)], 1.0)
        np.testing.assert_array_equal(y[SPECIALS.index(-math.inf)], -1.0)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("divide", [False, True])
def test_loop_calling_float32_math_vectorises(name, divide, tmp_path):
    source = tmp_path / "kernel.c"
    source.write_text(generate([_apply(name, divide)]))
    flags = [f for f in compiler_flags(host()) if f != "-shared"]
    report = subprocess.run([config.cc, *flags, "-c", "-fopt-info-vec-optimized", "-o",
                             str(tmp_path / "kernel.o"), str(source)],
                            capture_output=True, text=True, check=True).stderr
    assert "loop vectorized" in report, report
