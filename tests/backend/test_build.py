"""The kernel cache: hits, rebuilding broken entries, compiler errors, parallel builds."""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import threading

import pytest

from treadle.backend import build as build_module
from treadle.backend.build import build, build_many, compiler_flags
from treadle.config import override
from treadle.errors import CompileError
from treadle.target.cpu import host


def _source(value: int) -> str:
    return f"int answer(void) {{ return {value}; }}\n"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache dir, and a list recording the entry of every compilation."""
    compiled = []
    real = build_module._compile

    def counting(entry, source, name):
        compiled.append(entry)
        return real(entry, source, name)

    monkeypatch.setattr(build_module, "_compile", counting)
    with override(cache_dir=tmp_path):
        yield compiled


def _answer(path) -> int:
    return ctypes.CDLL(str(path)).answer()


def test_build_writes_an_entry_and_hits_it(cache, tmp_path):
    path = build(_source(1), "one")
    assert path.parent.parent == tmp_path / "kernels"
    assert (path.parent / "kernel.c").read_text() == _source(1)
    meta = json.loads((path.parent / "meta.json").read_text())
    assert meta["flags"] == list(compiler_flags())
    mtime = path.stat().st_mtime_ns
    assert build(_source(1), "again") == path
    assert path.stat().st_mtime_ns == mtime and len(cache) == 1
    assert build(_source(2), "two") != path and len(cache) == 2
    assert _answer(path) == 1


def test_flags_are_the_documented_ones():
    flags = compiler_flags()
    assert {"-O3", "-std=gnu11", "-fPIC", "-shared", "-fopenmp-simd"} <= set(flags)
    assert "-fopenmp" not in flags  # parallel loops run on treadle's pool, not libgomp
    assert "-ffast-math" not in flags
    # ISA flags are the host's features treadle emits code for, nothing more.
    assert {f for f in flags if f.startswith("-m")} == {f"-m{f}" for f in host().features}


@pytest.mark.parametrize("damage", ["truncate", "garbage", "no_json", "bad_json", "no_so"])
def test_broken_entries_are_rebuilt(cache, damage):
    path = build(_source(3), "three")
    meta = path.parent / "meta.json"
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:200])
    elif damage == "garbage":
        path.write_bytes(os.urandom(path.stat().st_size))
    elif damage == "no_json":
        meta.unlink()
    elif damage == "bad_json":
        meta.write_text('{"sha256": "')
    else:
        path.unlink()
    assert build(_source(3), "three") == path
    assert len(cache) == 2
    assert _answer(path) == 3


def test_compiler_error_raises_with_log_and_source_path(cache):
    with pytest.raises(CompileError) as info:
        build("int broken( { return; }\n", "broken")
    message = str(info.value)
    assert "'broken'" in message and "error" in message
    source = message.split("(source: ")[1].split(")")[0]
    assert open(source).read() == "int broken( { return; }\n"
    assert not any(p.name.endswith(".tmp") for p in cache[0].iterdir())


def test_missing_compiler_raises_compile_error(tmp_path):
    with override(cache_dir=tmp_path, cc=str(tmp_path / "no-such-cc")):
        with pytest.raises(CompileError, match="no-such-cc"):
            build(_source(4), "four")


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")
def test_build_many_compiles_in_parallel(cache, monkeypatch):
    # Each compiler run waits until another one runs at the same time; run one at a time,
    # the barrier would time out and break.
    together = threading.Barrier(2, timeout=30)
    real_run = subprocess.run

    def run(command, **kwargs):
        if "-o" in command:
            together.wait()
        return real_run(command, **kwargs)

    monkeypatch.setattr(build_module.subprocess, "run", run)
    items = [(_source(10 + k), f"k{k}") for k in range(4)]
    paths = build_many(items)
    assert [_answer(p) for p in paths] == [10, 11, 12, 13]
    assert len(set(paths)) == 4 and len(cache) == 4
    assert build_many([]) == []
