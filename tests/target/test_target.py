"""The ``Target`` protocol: the host CPU and every known CUDA architecture have a kind
that keys each per-target table (a table missing a kind would fail only when that target
first reached it), compiler flags as strings, and a memory hierarchy closest level first."""
import pytest

from treadle.ir.lower import PIPELINES, SPLITS
from treadle.orchestrate.cost import ROOFLINES
from treadle.runtime.build import _BUILDERS, _EXECUTABLES
from treadle.schedule.select import TEMPLATES
from treadle.target import Target
from treadle.target.cpu import host
from treadle.target.cuda import ARCHS, cuda_target
from treadle.target.memory import MemoryHierarchy
from treadle.tune.measure import TIMERS

TARGETS = [host(), *(cuda_target(arch) for arch in ARCHS)]
IDS = ["host", *ARCHS]
TABLES = {"ir.lower.PIPELINES": PIPELINES, "ir.lower.SPLITS": SPLITS,
          "schedule.select.TEMPLATES": TEMPLATES, "tune.measure.TIMERS": TIMERS,
          "orchestrate.cost.ROOFLINES": ROOFLINES, "runtime.build._BUILDERS": _BUILDERS,
          "runtime.build._EXECUTABLES": _EXECUTABLES}


def test_the_targets_are_the_host_and_every_cuda_architecture():
    assert [t.kind for t in TARGETS] == ["cpu"] + ["cuda"] * len(ARCHS)
    assert [t.arch for t in TARGETS[1:]] == list(ARCHS)


@pytest.mark.parametrize("table", TABLES)
def test_every_per_target_table_has_an_entry_for_each_kind_and_no_other(table):
    assert set(TABLES[table]) == {t.kind for t in TARGETS}, table


@pytest.mark.parametrize("target", TARGETS, ids=IDS)
def test_a_target_implements_the_protocol(target: Target):
    assert isinstance(type(target).kind, str)  # a class attribute, not per instance
    flags = target.compiler_flags
    assert isinstance(flags, tuple) and all(isinstance(f, str) and f for f in flags)
    if target.kind == "cuda":
        assert flags == (f"-arch={target.arch}",)


@pytest.mark.parametrize("target", TARGETS, ids=IDS)
def test_memory_levels_are_ordered_closest_first(target: Target):
    hierarchy = target.memory()
    assert isinstance(hierarchy, MemoryHierarchy)
    levels = hierarchy.levels
    assert levels[0].name == "registers" and levels[-1].name == "DRAM"
    assert len({level.name for level in levels}) == len(levels)
    for level in levels:
        assert level.capacity > 0 and level.bandwidth > 0 and level.latency_ns > 0, level
    latencies = [level.latency_ns for level in levels]
    assert latencies == sorted(latencies) and len(set(latencies)) == len(latencies)
    # Probed bandwidths of neighbouring caches may come out near equal; the ends may not.
    bandwidths = [level.bandwidth for level in levels]
    assert bandwidths[0] == max(bandwidths) and bandwidths[-1] == min(bandwidths)
    assert hierarchy.peak_gflops > 0
