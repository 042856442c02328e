"""Differential fuzzing: random ONNX graphs (``graphs.cases``) run by treadle and by ONNX
Runtime, outputs compared (``compare.assert_matches_onnxruntime``).

The default run checks a fixed sequence of graphs (derandomized, so CI is reproducible).
The long run explores new ones each time::

    pytest -m slow tests/fuzz/test_differential.py            # 2000 graphs
    TREADLE_FUZZ_EXAMPLES=300 pytest -m slow tests/fuzz/...   # fewer

A failure prints the shrunk graph as ONNX text, its feeds and a ``@reproduce_failure`` line
that replays it (shrinking a slow case may stop early; ``--hypothesis-seed`` then replays the
run); add it to ``test_regressions.py`` as a fixed model. A crash of the process
(a segfault in a kernel) prints nothing of the sort, so the long run writes each graph to
``$TMPDIR/treadle-fuzz-last.onnx`` (feeds in ``.npz``) before compiling it: after a crash
that file holds the culprit. Any exception is a failure: the generator builds only
models that ONNX Runtime runs and treadle supports (one ONNX Runtime refuses is skipped,
and counted in ``--hypothesis-show-statistics``).
"""
from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, assume, event, given, note, settings

from tests.harness import run_onnxruntime
from tests.fuzz.compare import assert_matches_onnxruntime
from tests.fuzz.graphs import Case, cases

# Each example draws hundreds of choices and compiles a model (0.3-2 s of gcc).
COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                    HealthCheck.data_too_large])
LAST = os.path.join(tempfile.gettempdir(), "treadle-fuzz-last")


@settings(max_examples=40, derandomize=True, **COMMON)
@given(case=cases())
def test_treadle_matches_onnxruntime(case: Case):
    check(case)


@pytest.mark.slow
@settings(max_examples=int(os.environ.get("TREADLE_FUZZ_EXAMPLES", 2000)), print_blob=True,
          **COMMON)
@given(case=cases())
def test_treadle_matches_onnxruntime_long(case: Case):
    onnx.save(case.model, LAST + ".onnx")
    np.savez(LAST + ".npz", **case.feeds)
    check(case)


def check(case: Case) -> None:
    note(onnx.printer.to_text(case.model))
    try:
        run_onnxruntime(case.model, case.feeds)
    except Exception as err:  # onnxruntime's error classes derive from Exception only
        # A model ONNX Runtime refuses is the generator's mistake, not treadle's; rare.
        event(f"ONNX Runtime refused the model: {type(err).__name__}")
        assume(False)
    assert_matches_onnxruntime(case.model, case.feeds, case.terms)
