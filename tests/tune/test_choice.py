"""Choosing a config through the template protocol: exhaustive tuning picks the
measured-fastest distinct point, stores it, and serves later lookups (a whole second
compile too) from the record without measuring."""
import json
import logging
from dataclasses import replace

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
from treadle.schedule.templates.gemm import GEMM, GemmConfig, GemmTemplate, match_gemm
from treadle.schedule.templates.gemm.space import gemm_space
from treadle.target.cpu import host
from treadle.tune import choice as tuner
from treadle.tune.records import load_record, workload_text

SPACE = [GemmConfig(12, 16, 32, 6, 16), GemmConfig(24, 32, 64, 6, 16),
         GemmConfig(8, 24, 64, 4, 24)]


@pytest.fixture
def cache(tmp_path):
    with override(cache_dir=tmp_path):
        yield tmp_path


@pytest.fixture
def small_space(monkeypatch):
    """Every level's space is SPACE, so SPACE[0] is the level-0 point."""
    monkeypatch.setattr(GemmTemplate, "space", lambda self, pattern, level, target: list(SPACE))


class FakeClock:
    """Stands in for measure_functions: times from a table, counting the calls."""

    def __init__(self, monkeypatch, times):
        self.times, self.calls = times, 0
        monkeypatch.setattr(tuner, "measure_functions", self)

    def __call__(self, functions, target, progress=lambda n: None, labels=None):
        self.calls += 1
        assert len(functions) == len(self.times)
        progress(len(functions))
        return list(self.times)


def matmul(k=40):
    a, b = Buffer("a", float32, (Var("M"), k)), Buffer("b", float32, (k, 24))
    c = reduce("c", [a.shape[0], 24], [k], lambda i, j, r: a[i, r] * b[r, j])
    return replace(match_gemm(c), inputs=(a, b))


def choose(pattern, level):
    return tuner.choose(GEMM, pattern, "g", level, host())


def record_of(pattern, level=1):
    return load_record(workload_text(GEMM, pattern, level, host()), GEMM, pattern, host())


def test_picks_the_fastest_and_records_it(cache, small_space, monkeypatch):
    clock = FakeClock(monkeypatch, [3e-3, None, 1e-3])
    pattern = matmul()
    choice = choose(pattern, 1)
    assert (choice.config, choice.source) == (SPACE[2], "measured")
    assert choice.resolved == GEMM.resolve(pattern, SPACE[2], host())
    record = record_of(pattern)
    assert record.config == SPACE[2] and record.resolved == choice.resolved.config
    assert dict(record.timings) == {SPACE[0]: 3e-3, SPACE[1]: None, SPACE[2]: 1e-3}
    again = choose(matmul(), 1)  # new buffers and axes: the same workload
    assert (again.config, again.source) == (SPACE[2], "record")
    assert clock.calls == 1


def test_points_that_resolve_alike_are_measured_once(cache, monkeypatch):
    """On a 5 x 24 x 40 product, configs differing only in blocks larger than the problem
    resolve alike: one candidate each, and no program is generated to find that."""
    emitted = []
    real = GemmTemplate.emit
    monkeypatch.setattr(GemmTemplate, "emit",
                        lambda self, resolved, name: emitted.append(resolved) or
                        real(self, resolved, name))
    a, b = Buffer("a", float32, (5, 40)), Buffer("b", float32, (40, 24))
    pattern = replace(match_gemm(reduce("c", [5, 24], [40], lambda i, j, r: a[i, r] * b[r, j])),
                      inputs=(a, b))
    space = gemm_space(2, host())
    points = tuner.distinct_points(GEMM, pattern, 2, host())
    assert emitted == []
    assert len(points) < len(space)
    assert len({resolved for _, resolved in points}) == len(points)
    clock = FakeClock(monkeypatch, [1e-3] + [2e-3] * (len(points) - 1))
    tuner.choose(GEMM, pattern, "g", 2, host())  # the level-0 point is in the space
    assert clock.calls == 1 and len(emitted) == len(points)


def test_keeps_the_default_unless_a_point_is_clearly_faster(cache, small_space, monkeypatch):
    """SPACE[0] is the level-0 point: 3% faster is within the noise of one measurement,
    10% is not."""
    FakeClock(monkeypatch, [1e-3, None, 0.97e-3])
    assert choose(matmul(k=40), 1).config == SPACE[0]
    FakeClock(monkeypatch, [1e-3, None, 0.9e-3])
    assert choose(matmul(k=41), 1).config == SPACE[2]


def test_level_zero_measures_nothing(cache, monkeypatch):
    clock = FakeClock(monkeypatch, [])
    choice = choose(matmul(), 0)
    assert (choice.config, choice.source) == (gemm_space(0, host())[0], "default")
    assert clock.calls == 0


def test_rejected_and_failing_points(cache, small_space, monkeypatch, caplog):
    real = GemmTemplate.check

    def check(self, pattern, cfg, target):
        if cfg == SPACE[0]:
            raise ScheduleConfigError("rejected by the template")
        real(self, pattern, cfg, target)
    monkeypatch.setattr(GemmTemplate, "check", check)
    FakeClock(monkeypatch, [None, None])
    with caplog.at_level(logging.WARNING):
        choice = choose(matmul(), 1)
    assert (choice.config, choice.source) == (SPACE[1], "default")  # the first accepted
    assert "every candidate failed" in caplog.text
    assert record_of(matmul()) is None


@pytest.mark.parametrize("field, impossible", [
    ("config", {"block_m": 0}), ("config", {"block_n": -16}), ("config", {"micro_n": 7}),
    ("config", {"block_m": 7}), ("config", {"micro_m": "6"}), ("config", {"split_k": True}),
    ("resolved", {"block_k": 8})])  # no longer what the config resolves to
def test_a_record_of_impossible_values_is_ignored_and_tuned_again(cache, small_space, monkeypatch,
                                                                  caplog, field, impossible):
    """Valid JSON that the template cannot use (an edited or damaged record) must not
    break every later compile of the model."""
    FakeClock(monkeypatch, [3e-3, None, 1e-3])
    pattern = matmul()
    choose(pattern, 1)
    path = next((cache / "tuning").iterdir())
    data = json.loads(path.read_text())
    data[field].update(impossible)
    path.write_text(json.dumps(data))
    clock = FakeClock(monkeypatch, [3e-3, None, 1e-3])
    with caplog.at_level(logging.WARNING):
        assert choose(pattern, 1).config == SPACE[2]
    assert f"ignoring unusable tuning record {path}" in caplog.text
    assert clock.calls == 1  # tuned again, and the record rewritten:
    assert record_of(pattern).config == SPACE[2]


def test_unknown_level_is_refused():
    with pytest.raises(ValueError, match="tuning level 3"):
        choose(matmul(), 3)


def two_layer_model():
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="dense1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="dense2")]
    weights = {"w1": random_array((24, 32), seed=1), "w2": random_array((32, 16), seed=2)}
    return make_model(nodes, [tensor("x", ["batch", 24])], [tensor("y", ["batch", 16])],
                      weights), weights


def test_second_compile_is_served_from_records(cache, small_space, monkeypatch):
    measured = []
    real = tuner.measure_functions
    monkeypatch.setattr(tuner, "measure_functions",
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


def test_construct_measures_nothing_and_says_so(cache, monkeypatch):
    clock = FakeClock(monkeypatch, [])
    pattern = matmul()
    choice = choose(pattern, "construct")
    assert choice.source == "constructed" and clock.calls == 0
    assert choice.resolved == GEMM.resolve(pattern, choice.config, host())


def test_construct_and_measure_times_the_best_constructed_points(cache, monkeypatch):
    """The level-0 point and up to TOP_K constructed ones are measured; the winner is
    recorded and replayed like a tuned one."""
    pattern = matmul(k=96)
    ranked = tuner.construct(GEMM, pattern, host())
    default = tuner.default_point(GEMM, pattern, host())
    expected = 1 + len([p for p in ranked[:tuner.TOP_K] if p[1] != default[1]])
    assert expected >= 2  # construction ranks other points than the level-0 one here
    clock = FakeClock(monkeypatch, [2e-3] + [1e-3] + [3e-3] * (expected - 2))
    choice = choose(pattern, "construct+measure")
    assert clock.calls == 1 and choice.source == "measured"
    assert choice.resolved != default[1]
    assert record_of(pattern, "construct+measure").config == choice.config
    assert choose(matmul(k=96), "construct+measure").source == "record"
