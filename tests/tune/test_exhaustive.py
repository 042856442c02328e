"""The exhaustive tuner: picks the measured-fastest point, stores it, and serves later
lookups — including a whole second compile — from the record without measuring."""
import json
import logging

import numpy as np
import pytest
from onnx import helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array
from treadle.config import override
from treadle.errors import ScheduleConfigError
from treadle.ir.compute import reduce
from treadle.ir.dtypes import float32
from treadle.ir.expr import Buffer, Var
from treadle.schedule.templates.matmul_cpu import GemmConfig, match_gemm
from treadle.target.cpu import host
from treadle.tune import exhaustive
from treadle.tune.records import load_record, workload_text
from treadle.tune.space import gemm_space

SPACE = [GemmConfig(12, 16, 32, 6, 16), GemmConfig(24, 32, 64, 6, 16),
         GemmConfig(8, 24, 64, 4, 24)]


@pytest.fixture
def cache(tmp_path):
    with override(cache_dir=tmp_path):
        yield tmp_path


@pytest.fixture
def small_space(monkeypatch):
    monkeypatch.setattr(exhaustive, "gemm_space", lambda level, target: list(SPACE))


class FakeClock:
    """Stands in for measure_functions: times from a table, counting the calls."""

    def __init__(self, monkeypatch, times):
        self.times, self.calls = times, 0
        monkeypatch.setattr(exhaustive, "measure_functions", self)

    def __call__(self, functions, progress=lambda n: None, labels=None):
        self.calls += 1
        assert len(functions) == len(self.times)
        progress(len(functions))
        return list(self.times)


def matmul(k=40):
    a, b = Buffer("a", float32, (Var("M"), k)), Buffer("b", float32, (k, 24))
    c = reduce("c", [a.shape[0], 24], [k], lambda i, j, r: a[i, r] * b[r, j])
    return [a, b], match_gemm(c)


def test_picks_the_fastest_and_records_it(cache, small_space, monkeypatch):
    clock = FakeClock(monkeypatch, [3e-3, None, 1e-3])
    inputs, pattern = matmul()
    assert exhaustive.tune_gemm("g", inputs, pattern, 1) == SPACE[2]
    record = load_record(workload_text(inputs, pattern, 1, host()))
    assert record.config == SPACE[2]
    assert dict(record.timings) == {SPACE[0]: 3e-3, SPACE[1]: None, SPACE[2]: 1e-3}
    assert exhaustive.tune_gemm("g", *matmul(), 1) == SPACE[2]
    assert clock.calls == 1


def test_keeps_the_default_unless_a_point_is_clearly_faster(cache, small_space, monkeypatch):
    """SPACE[0] is the analytic default: 3% faster is within the noise of one
    measurement, 10% is not."""
    FakeClock(monkeypatch, [1e-3, None, 0.97e-3])
    assert exhaustive.tune_gemm("g", *matmul(k=40), 1) == SPACE[0]
    FakeClock(monkeypatch, [1e-3, None, 0.9e-3])
    assert exhaustive.tune_gemm("g", *matmul(k=41), 1) == SPACE[2]


def test_level_zero_measures_nothing(cache, monkeypatch):
    clock = FakeClock(monkeypatch, [])
    assert exhaustive.tune_gemm("g", *matmul(), 0) == gemm_space(0, host())[0]
    assert clock.calls == 0


def test_rejected_and_failing_points(cache, small_space, monkeypatch, caplog):
    real = exhaustive.schedule_gemm

    def schedule(name, inputs, pattern, cfg):
        if cfg == SPACE[0]:
            raise ScheduleConfigError("rejected by the template")
        return real(name, inputs, pattern, cfg)
    monkeypatch.setattr(exhaustive, "schedule_gemm", schedule)
    FakeClock(monkeypatch, [None, None])
    with caplog.at_level(logging.WARNING):
        cfg = exhaustive.tune_gemm("g", *matmul(), 1)
    assert cfg == exhaustive.default_gemm_config("g", *matmul(), host())
    assert "every candidate failed" in caplog.text
    assert load_record(workload_text(*matmul(), 1, host())) is None


@pytest.mark.parametrize("impossible", [{"block_m": 0}, {"block_n": -16}, {"micro_n": 7},
                                        {"block_m": 7}, {"micro_m": "6"}, {"split_k": True}])
def test_a_record_of_impossible_values_is_ignored_and_tuned_again(cache, small_space, monkeypatch,
                                                                  caplog, impossible):
    """Valid JSON that the template cannot use (an edited or damaged record) must not
    break every later compile of the model."""
    FakeClock(monkeypatch, [3e-3, None, 1e-3])
    inputs, pattern = matmul()
    exhaustive.tune_gemm("g", inputs, pattern, 1)
    path = next((cache / "tuning").iterdir())
    data = json.loads(path.read_text())
    data["config"].update(impossible)
    path.write_text(json.dumps(data))
    clock = FakeClock(monkeypatch, [3e-3, None, 1e-3])
    with caplog.at_level(logging.WARNING):
        assert exhaustive.tune_gemm("g", inputs, pattern, 1) == SPACE[2]
    assert f"ignoring unusable tuning record {path}" in caplog.text
    assert clock.calls == 1  # tuned again, and the record rewritten:
    assert load_record(workload_text(inputs, pattern, 1, host())).config == SPACE[2]


def two_layer_model():
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="dense1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="dense2")]
    weights = {"w1": random_array((24, 32), seed=1), "w2": random_array((32, 16), seed=2)}
    return make_model(nodes, [tensor("x", ["batch", 24])], [tensor("y", ["batch", 16])],
                      weights), weights


def test_second_compile_is_served_from_records(cache, small_space, monkeypatch):
    measured = []
    real = exhaustive.measure_functions
    monkeypatch.setattr(exhaustive, "measure_functions",
                        lambda functions, **kw: measured.append(len(functions))
                        or real(functions, **kw))
    model, w = two_layer_model()
    x = random_array((5, 24), seed=3)
    expected = np.maximum(x @ w["w1"], 0) @ w["w2"]
    assert_close(treadle.compile(model, tune=1)(x)[0], expected, reduction=32)
    assert measured == [3, 3]
    assert_close(treadle.compile(model, tune=1)(x)[0], expected, reduction=32)
    assert measured == [3, 3]
    assert len(list((cache / "tuning").iterdir())) == 2


def test_compile_rejects_unknown_levels():
    with pytest.raises(ValueError, match="tune=5"):
        treadle.compile(two_layer_model()[0], tune=5)
