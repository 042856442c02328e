"""treadle's outputs against ONNX Runtime's, with tolerances for composed float32 ops.

A random graph may compute an output whose float32 value depends on rounding far more
than one op's tolerance allows: a difference of nearly equal sums, a square root near 0,
a rounding cast. Rather than keeping such graphs out, the comparison measures it: ONNX
Runtime runs again on inputs moved by a few units in the last place, and an element may
differ from the reference by several times what that moved it (its sensitivity to
rounding), plus the harness's float32 tolerance widened for the terms summed on the way.
NaN positions must match exactly.
"""
from __future__ import annotations

import numpy as np
import onnx

import treadle
from tests.harness import TOLERANCE, run_onnxruntime

NUDGE = 2.0 ** -20  # relative size of the input perturbations, 8 float32 ulp
NUDGES = 2
SLACK = 8.0         # how many times the perturbations' effect an element may differ by


def assert_matches_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                               terms: dict[str, int] | None = None) -> None:
    """treadle's outputs equal ONNX Runtime's in shape, dtype and value; ``terms`` gives
    per output the most float terms summed along a path to it (default 1)."""
    expected = run_onnxruntime(model, feeds)
    actual = treadle.compile(model)(**feeds)
    names = [o.name for o in model.graph.output]
    assert len(actual) == len(expected), f"{len(actual)} outputs, ONNX Runtime has {len(expected)}"
    slack = sensitivity(model, feeds, expected)
    for name, a, e, s in zip(names, actual, expected, slack):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape, f"output {name!r}: shape {a.shape} != {e.shape}"
        assert a.dtype == e.dtype, f"output {name!r}: dtype {a.dtype} != {e.dtype}"
        # Elements within their sensitivity's slack count as equal; the rest must pass
        # the float32 tolerance, scaled as a sum of ``terms`` values is.
        with np.errstate(invalid="ignore"):
            a = np.where(np.abs(a - e) <= SLACK * s, e, a)
        rtol, atol = TOLERANCE[e.dtype.name]
        scale = np.sqrt((terms or {}).get(name, 1))
        np.testing.assert_allclose(a, e, rtol=rtol * scale, atol=atol * scale, equal_nan=True,
                                   err_msg=f"output {name!r} differs from ONNX Runtime's")


def sensitivity(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                expected: list[np.ndarray]) -> list[np.ndarray]:
    """Per output element, the most that ONNX Runtime's value moves when the finite
    inputs move by NUDGE relatively (inf where it turns NaN or infinite)."""
    gen = np.random.default_rng(0)
    most = [np.zeros(e.shape) for e in expected]
    for _ in range(NUDGES):
        nudged = {k: np.asarray(v * (1 + NUDGE * gen.choice([-1, 1], size=v.shape)), v.dtype)
                  for k, v in feeds.items()}
        for m, e, p in zip(most, expected, run_onnxruntime(model, nudged)):
            with np.errstate(invalid="ignore"):
                moved = np.where(p == e, 0.0, np.abs(p.astype(np.float64) - e))
            np.maximum(m, np.nan_to_num(moved, nan=np.inf), out=m)
    return most
