"""PyTorch's own OpInfo samples through ``torch.compile(backend="treadle")``
(bench/opinfo.py), against eager with the OpInfo's float32 tolerances.

By default, the first samples of a curated list of ops run in process: each must be
compiled by treadle whole (no part of it in eager) and match. The slow test runs the bench
over every OpInfo whose ATen operators treadle claims and asserts that no sample fails: a
sample may run in eager, never give wrong numbers or crash. Refresh CURATED from the
bench's output as converters are added.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch's testing package imports it

import torch  # noqa: E402

from bench.opinfo import (FAILED, PASSED, as_accurate_as_eager, float32_opinfos,  # noqa: E402
                          op_name, run_op)
from treadle.config import config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = 3
SUITE_TIMEOUT_S = 3600

CURATED = (
    # element-wise, with PyTorch's type promotion and python scalars
    "add", "mul", "div.floor_rounding", "remainder", "pow", "clamp", "where", "eq",
    "logical_not", "nn.functional.gelu", "nn.functional.silu", "nn.functional.selu",
    # reductions and softmax
    "sum", "var", "argmax", "max.reduction_with_dim", "softmax", "cumsum",
    # linear algebra
    "matmul", "addmm", "nn.functional.linear",
    # networks
    "nn.functional.conv2d", "nn.functional.conv_transpose2d", "nn.functional.layer_norm",
    "native_group_norm",
    "nn.functional.avg_pool1d", "nn.functional.adaptive_avg_pool2d",
    # data movement
    "cat", "index_select", "gather", "nn.functional.pad.constant",
)


@pytest.fixture(scope="module")
def opinfos():
    return {op_name(op): op for op in float32_opinfos(CURATED)}


@pytest.mark.parametrize("name", CURATED)
def test_curated_opinfo_compiles_and_matches_eager(opinfos, name):
    outcome = run_op(opinfos[name], SAMPLES)
    problems = [f"sample {s.index}: {s.status}: {s.detail}" for s in outcome.samples
                if s.status != PASSED]
    assert outcome.samples and not problems, "\n".join(problems)


def test_float64_decides_between_results_beyond_the_tolerance():
    """A sum that cancels: eager's float32 loses the 1 entirely, a result that kept it is
    closer to float64 and passes; one off by 9 does not."""
    values = torch.tensor([1e8, 1.0, -1e8])
    eager = values.sum()
    assert eager.item() == 0.0
    assert as_accurate_as_eager(torch.sum, [values], torch.tensor(1.0), eager)
    assert not as_accurate_as_eager(torch.sum, [values], torch.tensor(10.0), eager)


@pytest.mark.slow
def test_no_opinfo_sample_gives_wrong_results(tmp_path):
    report = tmp_path / "outcomes.json"
    env = {**os.environ, "TREADLE_CACHE_DIR": str(config.cache_dir)}
    result = subprocess.run([sys.executable, "-m", "bench.opinfo", "--json", str(report)],
                            cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=SUITE_TIMEOUT_S)
    assert report.exists(), result.stderr[-4000:]
    outcomes = json.loads(report.read_text())
    failed = [f"{o['name']} sample {s['index']}: {s['detail']}"
              for o in outcomes for s in o["samples"] if s["status"] == FAILED]
    assert not failed, f"{len(failed)} OpInfo samples failed:\n" + "\n".join(failed)
    assert sum(o["status"] == PASSED for o in outcomes) >= len(CURATED)
