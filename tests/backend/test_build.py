"""The kernel cache: hits, rebuilding broken entries, compiler errors, parallel builds."""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from treadle.backend import build as build_module
from treadle.backend.build import compiler_flags
from treadle.backend.cpu import build, build_many
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

    def counting(entry, toolchain, source, name):
        compiled.append(entry)
        return real(entry, toolchain, source, name)

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
    assert meta["flags"] == list(compiler_flags(host()))
    mtime = path.stat().st_mtime_ns
    assert build(_source(1), "again") == path
    assert path.stat().st_mtime_ns == mtime and len(cache) == 1
    assert build(_source(2), "two") != path and len(cache) == 2
    assert _answer(path) == 1


def test_flags_are_the_documented_ones():
    flags = compiler_flags(host())
    assert {"-O3", "-std=gnu11", "-fPIC", "-shared", "-fopenmp-simd"} <= set(flags)
    assert "-fopenmp" not in flags  # parallel loops run on treadle's pool, not libgomp
    assert "-ffast-math" not in flags
    assert "-fno-tree-loop-distribute-patterns" in flags  # short copies stay loops
    # ISA flags are the host's features treadle emits code for, nothing more, in the
    # compiler's spelling (AVX-512 VNNI is avx512_vnni to the kernel, -mavx512vnni to gcc).
    spelling = {"avx512_vnni": "avx512vnni", "avx_vnni": "avxvnni", "amx_tile": "amx-tile",
                "amx_int8": "amx-int8"}
    assert {f for f in flags if f.startswith("-m")} == \
        {"-m" + spelling.get(f, f) for f in host().features}


@pytest.mark.parametrize("count,cores,most,sizes", [
    (16, 2, 24, [8, 8]), (1, 2, 24, [1]), (0, 2, 24, []), (50, 2, 24, [16, 17, 17]),
    (7, 4, 8, [1, 2, 2, 2]), (63, 2, 8, [7, 8, 8, 8, 8, 8, 8, 8])])
def test_functions_are_split_into_an_object_per_core_at_least(monkeypatch, count, cores,
                                                               most, sizes):
    monkeypatch.setattr(build_module, "usable_cores", lambda: cores)
    groups = build_module.object_groups(list(range(count)), most)
    assert [len(g) for g in groups] == sizes
    assert [k for g in groups for k in g] == list(range(count))


def _rehash(path) -> None:
    """Makes the entry's meta.json agree with whatever its kernel.so now holds."""
    meta = path.parent / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()),
                                "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}))


@pytest.mark.parametrize("damage", ["truncate", "garbage", "no_json", "bad_json", "no_so",
                                    "other_symbols", "file_for_folder"])
def test_broken_entries_are_rebuilt(cache, damage):
    path = build(_source(3), "three", ["answer"])
    meta = path.parent / "meta.json"
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:200])
    elif damage == "garbage":
        path.write_bytes(os.urandom(path.stat().st_size))
    elif damage == "no_json":
        meta.unlink()
    elif damage == "bad_json":
        meta.write_text('{"sha256": "')
    elif damage == "other_symbols":  # a sound library, with its hash, that lacks `answer`
        path.write_bytes(build("int question(void) { return 0; }\n", "other").read_bytes())
        _rehash(path)
    elif damage == "file_for_folder":
        shutil.rmtree(path.parent)
        path.parent.write_text("not a cache entry")
    else:
        path.unlink()
    assert build(_source(3), "three", ["answer"]) == path
    assert len(cache) == 2 + (damage == "other_symbols")
    assert _answer(path) == 3


def test_truncated_entry_with_a_matching_hash_is_rebuilt_not_loaded(tmp_path):
    """dlopen of a truncated library kills the process (SIGBUS), so the damaged entry is
    used by a child: a regression fails this test instead of ending the test run."""
    script = ("import sys, ctypes\n"
              "from treadle.backend.cpu import build\n"
              "path = build(sys.argv[1], 'five', ['answer'])\n"
              "print(ctypes.CDLL(str(path)).answer())\n")
    source = Path(build_module.__file__).parents[2]
    env = {**os.environ, "TREADLE_CACHE_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(source), os.environ.get("PYTHONPATH", "")])}
    with override(cache_dir=tmp_path):
        path = build(_source(5), "five")
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:size // 2])
    _rehash(path)
    result = subprocess.run([sys.executable, "-c", script, _source(5)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout == "5\n", result.stderr
    assert path.stat().st_size == size


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


def test_build_many_compiles_each_item_as_it_is_produced(cache, monkeypatch):
    # The generator produces its second item only once the first one's compiler has
    # started: collecting every item before compiling would wait forever (here 30 s).
    started = threading.Event()
    real_run = subprocess.run

    def run(command, **kwargs):
        if "-o" in command:
            started.set()
        return real_run(command, **kwargs)

    def items():
        yield _source(20), "first"
        assert started.wait(timeout=30), "the first item was not compiled before the next"
        yield _source(21), "second"

    monkeypatch.setattr(build_module.subprocess, "run", run)
    assert [_answer(p) for p in build_many(items())] == [20, 21]
