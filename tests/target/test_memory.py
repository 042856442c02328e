"""The memory hierarchy: probed once per machine and cached, levels ordered and
plausible, a damaged cache entry probed again, defaults where probing fails; a CPU
target's ``memory()`` is the host's probe or, for another CPU, the defaults."""
import json
import logging

import pytest

from treadle.config import override
from treadle.target import memory
from treadle.target.cpu import CpuTarget, host


@pytest.fixture
def fresh(tmp_path):
    memory.memory_hierarchy.cache_clear()
    with override(cache_dir=tmp_path):
        yield tmp_path
    memory.memory_hierarchy.cache_clear()


def test_probe_orders_the_levels_and_is_cached(fresh, monkeypatch):
    hierarchy = memory.memory_hierarchy()
    assert hierarchy.source == "probed"
    names = [level.name for level in hierarchy.levels]
    assert names == ["registers", "L1", "L2", "L3", "DRAM"]
    l1, dram = hierarchy.level("L1"), hierarchy.level("DRAM")
    assert l1.capacity == host().l1d_bytes
    # Memory is farther than L1 by any measure a machine can show.
    assert dram.latency_ns > l1.latency_ns and dram.bandwidth < l1.bandwidth
    assert hierarchy.peak_gflops > 1
    (entry,) = (fresh / "target").iterdir()
    memory.memory_hierarchy.cache_clear()
    monkeypatch.setattr(memory, "probe", lambda target: pytest.fail("probed again"))
    assert memory.memory_hierarchy() == hierarchy
    assert "L2" in hierarchy.format() and "GB/s" in hierarchy.format()


def test_a_damaged_entry_is_probed_again(fresh, caplog):
    memory.memory_hierarchy()
    (entry,) = (fresh / "target").iterdir()
    data = json.loads(entry.read_text())
    data["levels"][2]["bandwidth"] = -1
    entry.write_text(json.dumps(data))
    memory.memory_hierarchy.cache_clear()
    with caplog.at_level(logging.WARNING):
        assert memory.memory_hierarchy().source == "probed"
    assert f"ignoring unusable memory probe {entry}" in caplog.text


def test_defaults_where_probing_fails(fresh, monkeypatch, caplog):
    def broken(target):
        raise OSError("no compiler")
    monkeypatch.setattr(memory, "probe", broken)
    with caplog.at_level(logging.WARNING):
        hierarchy = memory.memory_hierarchy()
    assert hierarchy.source == "defaults" and "no compiler" in caplog.text
    assert [level.name for level in hierarchy.levels][1:] == ["L1", "L2", "L3", "DRAM"]
    assert not (fresh / "target").exists()  # nothing cached: the next process probes


def test_a_cpu_target_gives_its_hierarchy(fresh, monkeypatch):
    monkeypatch.setattr(memory, "probe", lambda target: memory.defaults(target))
    assert host().memory() == memory.memory_hierarchy()
    other = CpuTarget(("avx2", "fma"), 32 * 1024, 1 << 20, 16 << 20)
    assert other.memory() == memory.defaults(other)
    assert other.memory().level("L3").capacity == 16 << 20
