"""The measure step on a Ray cluster, and the record store it shares.

A local cluster started here (one node of two CPUs on the loopback: this process is its
head and drives it, its worker processes time the trials) tunes a small model to the
configs and records of the local runner when the timer is deterministic; a worker that
dies or hangs loses only its trial; a cluster without the target's device is refused
with both keys named. Records round-trip through a SQLite store and an export file, and
a damaged export is refused naming the file. Without a runner named, nothing imports
Ray."""
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array
from tests.tune.test_measure import broken, gemm
from treadle.cli import main
from treadle.config import from_environment, override
from treadle.ir.printer import format_function
from treadle.schedule.templates.gemm import GemmConfig
from treadle.target.cpu import host
from treadle.tune import runners
from treadle.tune.measure import measure_functions
from treadle.tune.progress import Progress
from treadle.errors import DeviceMismatchError
from treadle.tune.runners import device_key
from treadle.tune.store import DirectoryStore, SqliteStore
from treadle.tune.transfer import RecordImportError, export_records, import_records

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.2"
ROWS, INNER, MIDDLE, COLS = 131, 512, 384, 97  # prime rows and columns: padded tiles


@pytest.fixture(scope="module")
def local_cluster():
    """A Ray cluster on this machine: two CPUs, so two trials of one thread at once. Its
    address is on the loopback (Ray swaps 127.0.0.1 for the machine's own address, not
    127.0.0.2). Ray comes with the test extra; the tests without a cluster run without it."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address=LOOPBACK,
             log_to_driver=False, logging_level=logging.WARNING)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """One kernel cache for the module: each test builds the same candidates."""
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture
def cache(tmp_path, kernels):
    """A fresh record store (a folder of the test's) and one thread per trial."""
    with override(cache_dir=kernels, records=tmp_path / "records", num_threads=1):
        yield tmp_path


def weights():
    return random_array((INNER, MIDDLE), seed=1), random_array((MIDDLE, COLS), seed=2)


def two_layers() -> onnx.ModelProto:
    """relu(x @ w1) @ w2: two GEMM kernels to tune."""
    w1, w2 = weights()
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    return make_model(nodes, [tensor("x", [ROWS, INNER])], [tensor("y", [ROWS, COLS])],
                      {"w1": w1, "w2": w2})


def check_outputs(model) -> None:
    x = random_array((ROWS, INNER), seed=3)
    w1, w2 = weights()
    (y,) = model(x)
    assert_close(y, np.maximum(x @ w1, 0) @ w2, reduction=INNER + MIDDLE)


def stored(store) -> dict[str, dict]:
    return {key: json.loads(store.read(key)) for key in store.keys()}


# ---- deterministic timers: module functions, which a Ray worker imports by name ---------------

def steady_timer(trials, settings, settle):
    """Seconds that depend only on each candidate's program, wherever it is timed; None
    where its library did not arrive whole (as an ELF file)."""
    times = {t.index: _steady_seconds(t) for t in trials}
    settle(list(times.values()))
    return times


def _steady_seconds(trial) -> float | None:
    if Path(trial.library).read_bytes()[:4] != b"\x7fELF":
        return None
    digest = hashlib.sha256(format_function(trial.function).encode()).digest()
    return 1e-4 * (1 + int.from_bytes(digest[:4], "little") / 2 ** 32)


def dying_timer(trials, settings, settle):
    """The steady timer, but the worker timing the second candidate of a call dies."""
    if any(t.index == 1 for t in trials):
        os._exit(1)
    return steady_timer(trials, settings, settle)


def hanging_timer(trials, settings, settle):
    """The steady timer, but the second candidate of a call never comes back."""
    if any(t.index == 1 for t in trials):
        time.sleep(600)
    return steady_timer(trials, settings, settle)


# ---- the runner --------------------------------------------------------------------------------

def test_ray_tunes_to_the_configs_and_records_of_the_local_runner(local_cluster, cache,
                                                                   monkeypatch):
    monkeypatch.setattr(runners, "TRIAL_TIMER", steady_timer)
    with override(records=cache / "local"):
        check_outputs(treadle.compile(two_layers(), tune=1))
    with override(records=cache / "ray.sqlite"):
        check_outputs(treadle.compile(two_layers(), tune=1, runner="ray"))
    local = stored(DirectoryStore(cache / "local"))
    remote = stored(SqliteStore(cache / "ray.sqlite"))
    assert len(local) == 2 and remote == local
    for record in local.values():  # every point was timed, on the cluster too
        assert all(seconds is not None for _, seconds in record["timings"])


def test_a_crashing_candidate_fails_alone_on_the_cluster(local_cluster, cache):
    """The real measuring child on a worker, from the library's shipped bytes."""
    good = gemm(GemmConfig())
    with override(runner="ray"):
        times = measure_functions([good, broken("crash"), gemm(GemmConfig(12, 16, 32, 6, 16))],
                                  target=host(), repeats=3)
    assert times[1] is None
    assert all(isinstance(t, float) and 0 < t < 1 for t in (times[0], times[2]))


def test_a_worker_that_dies_loses_only_its_trial(local_cluster, cache, monkeypatch, caplog):
    monkeypatch.setattr(runners, "TRIAL_TIMER", dying_timer)
    with override(records=cache / "records"), caplog.at_level(logging.WARNING):
        check_outputs(treadle.compile(two_layers(), tune=1, runner="ray"))
    records = stored(DirectoryStore(cache / "records"))
    assert len(records) == 2  # the tuning completed
    for record in records.values():  # each measuring call lost its second point, once
        assert [k for k, (_, seconds) in enumerate(record["timings"]) if seconds is None] == [1]
    assert "was lost on node" in caplog.text and "lost twice" in caplog.text


def test_a_trial_past_its_deadline_is_cancelled(local_cluster, cache, monkeypatch, caplog):
    from treadle.tune import cluster  # it imports Ray
    functions = [gemm(GemmConfig()), gemm(GemmConfig(12, 16, 32, 6, 16)),
                 gemm(GemmConfig(8, 24, 64, 4, 24))]
    with override(runner="ray"):
        # Both workers warmed up first (a worker's first task imports this module), so
        # that only the hung trial meets the short deadline.
        monkeypatch.setattr(runners, "TRIAL_TIMER", steady_timer)
        assert None not in measure_functions(functions, target=host())
        monkeypatch.setattr(runners, "TRIAL_TIMER", hanging_timer)
        monkeypatch.setattr(cluster, "START_S", 4.0)
        start = time.monotonic()
        with caplog.at_level(logging.WARNING):
            times = measure_functions(functions, target=host(), timeout=0.5)
    assert time.monotonic() - start < 40
    assert times[1] is None and times[0] is not None and times[2] is not None
    assert "ran past its deadline" in caplog.text


def test_a_cluster_without_the_targets_device_is_refused(local_cluster, cache, monkeypatch):
    here = device_key(host())
    monkeypatch.setattr(runners, "cpu_model", lambda: "Imaginary CPU 9000")
    with override(runner="ray"), pytest.raises(DeviceMismatchError) as caught:
        measure_functions([gemm(GemmConfig())], target=host(), repeats=3)
    message = str(caught.value)
    assert "Imaginary CPU 9000" in message and here in message


def test_the_default_runner_never_imports_ray(tmp_path):
    """A compile that measures, with no runner named, in a process of its own; where Ray
    is missing, the ray runner is refused saying how to install it."""
    code = ("import sys, numpy as np, treadle\n"
            "from treadle import ops\n"
            f"x = ops.input('x', 'float32', [{ROWS}, {INNER}])\n"
            f"w = ops.constant(np.ones(({INNER}, {MIDDLE}), np.float32))\n"
            "model = treadle.compile(ops.graph([x], [ops.matmul(x, w)], 'mm'), tune=1)\n"
            f"y = model(np.ones(({ROWS}, {INNER}), np.float32))[0]\n"
            f"assert (y == {INNER}).all()\n"
            "assert 'ray' not in sys.modules, 'ray was imported'\n"
            "sys.modules['ray'] = None  # as where Ray is not installed\n"
            "from treadle.errors import RunnerUnavailableError\n"
            "try:\n"
            f"    v = ops.input('v', 'float32', [{ROWS}, {MIDDLE}])\n"
            f"    u = ops.constant(np.ones(({MIDDLE}, {COLS}), np.float32))\n"
            "    treadle.compile(ops.graph([v], [ops.matmul(v, u)], 'mm'), tune=1, runner='ray')\n"
            "except RunnerUnavailableError as err:\n"
            "    assert 'treadle[cluster]' in str(err), err\n"
            "else:\n"
            "    raise AssertionError('no error without Ray')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TREADLE_RUNNER", "TREADLE_RECORDS")}
    env.update(TREADLE_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(DirectoryStore(tmp_path / "tuning").keys()) == 1  # it measured


@pytest.mark.parametrize("bad", ["ray:/head", "cluster", "ray://", ""])
def test_runner_names_are_checked(bad):
    if bad:
        with pytest.raises(ValueError, match="TREADLE_RUNNER"):
            from_environment({"TREADLE_RUNNER": bad})
    with pytest.raises(ValueError, match="runner"):
        treadle.compile(two_layers(), runner=bad)


def test_runner_names_from_the_environment():
    assert from_environment({}).runner == "local"
    assert from_environment({"TREADLE_RUNNER": "ray://head:10001"}).runner == "ray://head:10001"
    assert from_environment({"TREADLE_RECORDS": "/x/r.sqlite"}).records == Path("/x/r.sqlite")


def test_progress_says_trials_done_failed_and_the_best(caplog):
    """Where no bar shows (a log, a test), a line at the end of each measuring call."""
    with caplog.at_level(logging.INFO, logger="treadle.tune.progress"), \
            Progress(4, "mm1") as progress:
        progress.settle([2e-3, None])
        progress.settle([1e-3])
        progress(1)  # settled, its time unknown
    assert "tuning mm1: 4 of 4 trials done, 1 failed, best 1 ms" in caplog.text


# ---- the record store --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exported(kernels, tmp_path_factory) -> tuple[Path, dict]:
    """The model tuned into a store of files (steady times, the local runner), that
    store's records and their export."""
    folder = tmp_path_factory.mktemp("exported")
    with pytest.MonkeyPatch.context() as patch, \
            override(cache_dir=kernels, records=folder / "records", num_threads=1):
        patch.setattr(runners, "TRIAL_TIMER", steady_timer)
        treadle.compile(two_layers(), tune=1)
        assert export_records(folder / "records.jsonl") == 2
    return folder / "records.jsonl", stored(DirectoryStore(folder / "records"))


def test_records_round_trip_through_an_export(exported, cache, monkeypatch):
    path, records = exported
    sqlite = SqliteStore(cache / "other" / "records.db")
    assert import_records(path, sqlite) == 2
    assert stored(sqlite) == records
    # A compile reading the imported store measures nothing.
    monkeypatch.setattr(runners, "TRIAL_TIMER", None)
    with override(records=sqlite.path):
        check_outputs(treadle.compile(two_layers(), tune=1))


@pytest.mark.parametrize("damage, problem", [
    (lambda lines: lines[:1] + ["{not json"] + lines[2:], "line 2: not JSON"),
    (lambda lines: ["{}"] + lines[1:], "not an export of tuning records"),
    (lambda lines: lines[:2] + [lines[2].replace('"key":"', '"key":"0')], "line 3: its key"),
    (lambda lines: lines[:2] + [lines[2].replace('"block_m":', '"block_m":"x","_":')],
     "line 3: its 'config' is not a config"),
    (lambda lines: [lines[0], json.dumps({"key": "k", "record": []})], "line 2: not a tuning"),
])
def test_a_damaged_export_is_refused_naming_the_file(exported, cache, damage, problem):
    path = cache / "records.jsonl"
    path.write_text("\n".join(damage(exported[0].read_text().splitlines())) + "\n")
    target = SqliteStore(cache / "other.sqlite")
    with pytest.raises(RecordImportError, match=str(path)) as caught:
        import_records(path, target)
    assert problem in str(caught.value)
    assert target.keys() == []  # nothing imported from a damaged file


def test_the_tune_command_tunes_imports_and_exports(cache, monkeypatch, capsys):
    monkeypatch.setattr(runners, "TRIAL_TIMER", steady_timer)
    model, out = cache / "model.onnx", cache / "records.jsonl"
    onnx.save(two_layers(), model)
    with override(records=cache / "first"):
        assert main(["tune", str(model), "--level", "1", "--export", str(out)]) == 0
    assert "2 new records" in capsys.readouterr().out
    with override(records=cache / "second.sqlite"):
        assert main(["tune", "--import", str(out)]) == 0
    assert stored(SqliteStore(cache / "second.sqlite")) == stored(DirectoryStore(cache / "first"))
    out.write_text("garbage\n")
    assert main(["tune", "--import", str(out)]) == 2
    assert str(out) in capsys.readouterr().err
    assert main(["tune", str(model), "--cluster", "head:6379"]) == 2
    assert "ray://host:port" in capsys.readouterr().err
