"""Tuning records: keys from the workload's canonical text, round trips that replay to
the same IR, and recovery from corrupt files."""
import json

import numpy as np
import pytest

from treadle.config import override
from treadle.ir.compute import reduce
from treadle.ir.dtypes import float32
from treadle.ir.expr import Buffer, Var
from treadle.ir.printer import format_function
from treadle.schedule.templates.matmul_cpu import GemmConfig, match_gemm, schedule_gemm
from treadle.target.cpu import host
from treadle.tune.records import (Record, load_record, record_key, records_dir, store_record,
                                  workload_text)


def matmul(m=Var("M"), k=64, n=48, names=("a", "b", "c")):
    a, b = Buffer(names[0], float32, (m, k)), Buffer(names[1], float32, (k, n))
    c = reduce(names[2], [m, n], [k], lambda i, j, r: a[i, r] * b[r, j])
    return [a, b], match_gemm(c)


@pytest.fixture
def cache(tmp_path):
    with override(cache_dir=tmp_path):
        yield tmp_path


def test_key_ignores_names_but_not_shapes():
    text = workload_text(*matmul(), 1, host())
    assert workload_text(*matmul(names=("x", "w", "y")), 1, host()) == text
    assert workload_text(*matmul(m=Var("rows")), 1, host()) == text
    assert workload_text(*matmul(k=65), 1, host()) != text
    assert workload_text(*matmul(), 2, host()) != text
    with override(num_threads=host().cores + 1):
        assert workload_text(*matmul(), 1, host()) != text


def test_key_of_an_operator_with_an_epilogue_is_the_same_every_time():
    # A convolution with a bias defines its output as an epilogue over the product; both
    # are built afresh, with new axis names, each time the model is compiled.
    from treadle.graph.operator import apply
    from treadle.graph.tensor import Tensor, constant
    from treadle.schedule.templates.matmul_cpu import match_gemm_output

    def conv_text():
        x = Tensor("x", "float32", [1, 3, 8, 8])
        w, b = constant(np.ones((4, 3, 3, 3), np.float32)), constant(np.ones(4, np.float32))
        op = apply("Conv", [x, w, b], {})[0].producer
        return workload_text(op.input_buffers, match_gemm_output(op.definition[0]), 1, host())
    assert conv_text() == conv_text()


def test_round_trip_replays_to_the_same_ir(cache):
    inputs, pattern = matmul()
    text = workload_text(inputs, pattern, 1, host())
    best = GemmConfig(block_m=96, block_n=96, block_k=128, micro_m=6, micro_n=16)
    timings = ((best, 1e-3), (GemmConfig(), None))
    store_record(Record(text, best, timings))
    record = load_record(text)
    assert record == Record(text, best, timings)
    replayed = schedule_gemm("g", inputs, pattern, record.config).function
    assert format_function(replayed) == format_function(
        schedule_gemm("g", inputs, pattern, best).function)
    assert [p.name for p in records_dir().iterdir()] == [f"{record_key(text)}.json"]


@pytest.mark.parametrize("damage", ["", "{not json", '{"format": "other"}',
                                    '{"format": "treadle-tuning-record-1", "workload": "x"}'])
def test_corrupt_record_is_ignored_and_rewritten(cache, damage, caplog):
    text = workload_text(*matmul(), 1, host())
    store_record(Record(text, GemmConfig(), ()))
    path = next(records_dir().iterdir())
    path.write_text(damage)
    assert load_record(text) is None
    assert "ignoring unusable tuning record" in caplog.text
    store_record(Record(text, GemmConfig(split_k=2), ()))
    assert load_record(text).config == GemmConfig(split_k=2)
    assert json.loads(path.read_text())["config"]["split_k"] == 2


def test_missing_record(cache):
    assert load_record(workload_text(*matmul(), 1, host())) is None
