"""Tuning records: keys from the workload's canonical text, round trips that replay to
the same resolved config and IR, and recovery from corrupt files."""
import json
from dataclasses import replace

import numpy as np
import pytest

from treadle.config import override
from treadle.ir.compute import reduce
from treadle.ir.dtypes import float32
from treadle.ir.expr import Buffer, Var
from treadle.ir.printer import format_function
from treadle.schedule.templates.gemm import GEMM, GemmConfig, match_gemm
from treadle.target.cpu import host
from treadle.tune.records import (Record, load_record, record_key, records_dir, store_record,
                                  workload_text)


def matmul(m=Var("M"), k=64, n=48, names=("a", "b", "c")):
    a, b = Buffer(names[0], float32, (m, k)), Buffer(names[1], float32, (k, n))
    c = reduce(names[2], [m, n], [k], lambda i, j, r: a[i, r] * b[r, j])
    return replace(match_gemm(c), inputs=(a, b))


def text_of(pattern, level=1):
    return workload_text(GEMM, pattern, level, host())


def load(pattern, level=1):
    return load_record(text_of(pattern, level), GEMM, pattern, host())


def resolved(pattern, cfg):
    return GEMM.resolve(pattern, cfg, host())


@pytest.fixture
def cache(tmp_path):
    with override(cache_dir=tmp_path):
        yield tmp_path


def test_key_ignores_names_but_not_shapes():
    text = text_of(matmul())
    assert text_of(matmul(names=("x", "w", "y"))) == text
    assert text_of(matmul(m=Var("rows"))) == text
    assert text_of(matmul(k=65)) != text
    assert text_of(matmul(), 2) != text
    with override(num_threads=host().cores + 1):
        assert text_of(matmul()) != text


def test_key_of_an_operator_with_an_epilogue_is_the_same_every_time():
    # A convolution with a bias defines its output as an epilogue over the product; both
    # are built afresh, with new axis names, each time the model is compiled.
    from treadle.graph.operator import apply
    from treadle.graph.tensor import Tensor, constant

    def conv_text():
        x = Tensor("x", "float32", [1, 3, 8, 8])
        w, b = constant(np.ones((8, 3, 3, 3), np.float32)), constant(np.ones(8, np.float32))
        op = apply("Conv", [x, w, b], {})[0].producer
        return text_of(GEMM.match(op))
    assert conv_text() == conv_text()


def test_round_trip_replays_to_the_same_resolved_config_and_ir(cache):
    pattern = matmul()
    text = text_of(pattern)
    best = GemmConfig(block_m=96, block_n=96, block_k=128, micro_m=6, micro_n=16)
    timings = ((best, 1e-3), (GemmConfig(), None))
    record = Record(text, best, resolved(pattern, best).config, timings)
    store_record(record)
    assert load(pattern) == record
    replayed = resolved(matmul(), load(pattern).config)  # a new compile's pattern
    assert replayed.config == record.resolved
    assert format_function(GEMM.emit(replayed, "g").function) == format_function(
        GEMM.emit(resolved(pattern, best), "g").function)
    assert [p.name for p in records_dir().iterdir()] == [f"{record_key(text)}.json"]


@pytest.mark.parametrize("damage", ["", "{not json", '{"format": "other"}',
                                    '{"format": "treadle-tuning-record-2", "workload": "x"}'])
def test_corrupt_record_is_ignored_and_rewritten(cache, damage, caplog):
    pattern = matmul()
    default, split = GemmConfig(), GemmConfig(split_k=2)
    store_record(Record(text_of(pattern), default, resolved(pattern, default).config, ()))
    path = next(records_dir().iterdir())
    path.write_text(damage)
    assert load(pattern) is None
    assert "ignoring unusable tuning record" in caplog.text
    store_record(Record(text_of(pattern), split, resolved(pattern, split).config, ()))
    assert load(pattern).config == split
    assert json.loads(path.read_text())["config"]["split_k"] == 2


def test_missing_record(cache):
    assert load(matmul()) is None
