"""Knobs are read from the environment once and can be overridden in a block."""
from pathlib import Path

import pytest

from treadle.config import config, from_environment, override


def test_defaults_and_values_from_environment():
    defaults = from_environment({})
    assert defaults.dump_dir is None and defaults.num_threads >= 1 and defaults.cc == "gcc"
    assert defaults.cache_dir == Path.home() / ".cache" / "treadle"
    custom = from_environment({"TREADLE_CACHE_DIR": "/tmp/c", "TREADLE_DUMP": "/tmp/d",
                               "TREADLE_NUM_THREADS": "3", "TREADLE_VERIFY": "1",
                               "TREADLE_CC": "clang"})
    assert (custom.cache_dir, custom.dump_dir) == (Path("/tmp/c"), Path("/tmp/d"))
    assert (custom.num_threads, custom.verify, custom.cc) == (3, True, "clang")


@pytest.mark.parametrize("env, pinned", [
    ({}, True), ({"TREADLE_PIN_WORKERS": "0"}, False), ({"TREADLE_PIN_WORKERS": ""}, False),
    ({"OMP_PROC_BIND": "close"}, True), ({"TREADLE_PIN_WORKERS": "1"}, True),
])
def test_workers_pinned_unless_turned_off(env, pinned):
    assert from_environment(env).pin_workers is pinned


@pytest.mark.parametrize("bad", ["0", "-2", "two"])
def test_bad_thread_count_is_named(bad):
    with pytest.raises(ValueError, match="TREADLE_NUM_THREADS"):
        from_environment({"TREADLE_NUM_THREADS": bad})


def test_override_is_scoped():
    before = config.num_threads
    with override(num_threads=before + 5):
        assert config.num_threads == before + 5
    assert config.num_threads == before
    with pytest.raises(TypeError, match="unknown config"):
        with override(threads=1):
            pass


def test_plan_cache_size():
    assert from_environment({}).plan_cache == 64
    assert from_environment({"TREADLE_PLAN_CACHE": "8"}).plan_cache == 8
    with pytest.raises(ValueError, match="TREADLE_PLAN_CACHE"):
        from_environment({"TREADLE_PLAN_CACHE": "0"})


def test_bounds_checks_are_off_unless_turned_on():
    assert from_environment({}).check_bounds is False
    assert from_environment({"TREADLE_CHECK_BOUNDS": "0"}).check_bounds is False
    assert from_environment({"TREADLE_CHECK_BOUNDS": "1"}).check_bounds is True
