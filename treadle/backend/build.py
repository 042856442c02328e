"""Compiling generated C into shared objects, through a content-addressed on-disk cache.

An entry is the folder ``<cache_dir>/kernels/<key>/`` holding ``kernel.c``, ``kernel.so``
and ``meta.json`` (with the .so's sha256). The key hashes everything that decides the
binary: the source, the flags, the compiler's version line and the target's features.
Files are written under temporary names in the entry folder and renamed into place, the
json last. A hit is used only when the .so matches the hash in the json and, read as ELF
(``backend.elf``), is complete and defines the symbols the caller will look up; the check
never opens it, since opening a truncated .so kills the process. Anything else (a corrupt,
truncated or half-written entry, a file where the folder should be) is rebuilt.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Sequence, TypeVar

from treadle.backend.elf import check_shared_object
from treadle.config import config, usable_cores
from treadle.errors import CompileError
from treadle.target.cpu import host

# Every flag generated code is compiled with; the ISA flags (-mavx2 -mfma) come from the
# target. No -ffast-math: kernels keep IEEE semantics (NaN, inf, signed zeros); standard
# excess precision, so that a cast to _Float16 rounds (ir.passes.widen_half relies on it).
# No loop becomes a memcpy or memset: a tile's rows are short, and gcc expanded a copy of a
# run-time length (a row of a packed panel whose length is a symbol) into `rep movsb`,
# whose start-up made attention's P V at T = 17 run 1.6-2x slower.
BASE_FLAGS = ("-O3", "-std=gnu11", "-fPIC", "-shared", "-fopenmp-simd", "-fno-math-errno",
              "-fexcess-precision=standard", "-fno-tree-loop-distribute-patterns",
              "-Werror=implicit-function-declaration")

T = TypeVar("T")

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def compiler_flags() -> tuple[str, ...]:
    return BASE_FLAGS + host().compiler_flags


@functools.lru_cache(maxsize=None)
def compiler_version(cc: str) -> str:
    """The first line of ``cc --version``, which names the compiler and its version."""
    try:
        result = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as err:
        raise CompileError(f"cannot run the C compiler {cc!r} ({err}); install gcc or set "
                           "TREADLE_CC") from None
    return result.stdout.splitlines()[0] if result.stdout else cc


def cache_key(source: str) -> str:
    identity = [source, list(compiler_flags()), compiler_version(config.cc),
                list(host().features)]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()


def build(source: str, name: str, symbols: Iterable[str] = ()) -> Path:
    """The path of a shared object compiled from ``source``, from the cache when a valid
    entry that defines ``symbols`` exists; ``name`` only labels messages."""
    key = cache_key(source)
    entry = Path(config.cache_dir) / "kernels" / key
    with lock_for(key):
        if _valid(entry, symbols):
            return entry / "kernel.so"
        return _compile(entry, source, name)


def build_many(items: Iterable[tuple]) -> list[Path]:
    """``build(*item)`` for each ``(source, name)`` or ``(source, name, symbols)``, running
    compilers in parallel. Each item starts compiling as soon as ``items`` yields it, so a
    generator that lowers and prints the next group overlaps with the compilers running
    (Inception-V3 spends 9 s lowering and 11 s compiling)."""
    with ThreadPoolExecutor(max_workers=usable_cores()) as pool:
        futures = [pool.submit(build, *item) for item in items]
        return [future.result() for future in futures]


def object_groups(items: Sequence[T], most: int) -> list[Sequence[T]]:
    """``items`` (functions) split in order into shared objects of at most ``most``, in
    as many objects as compilers run at once where there are enough items: BERT's model
    (23 functions, 180 KB of C) compiled in one object took 9 s on one core of two."""
    count = len(items)
    parts = max(-(-count // most), min(usable_cores(), count))
    return [items[count * k // parts:count * (k + 1) // parts] for k in range(parts)]


def lock_for(key: str) -> threading.Lock:
    """One lock per key, so threads never compile the same source twice at once."""
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _valid(entry: Path, symbols: Iterable[str]) -> bool:
    try:
        meta = json.loads((entry / "meta.json").read_text())
        if meta["sha256"] != sha256_of(entry / "kernel.so"):
            return False
        check_shared_object(entry / "kernel.so", symbols)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _compile(entry: Path, source: str, name: str) -> Path:
    if entry.is_file() or entry.is_symlink():  # a stray file where the entry's folder
        entry.unlink()                             # belongs; the cache owns every name here
    entry.mkdir(parents=True, exist_ok=True)
    src, so = entry / "kernel.c", entry / "kernel.so"
    write_atomic(src, source.encode())
    fd, tmp = tempfile.mkstemp(dir=entry, prefix="kernel.so.", suffix=".tmp")
    os.close(fd)
    command = [config.cc, *compiler_flags(), "-o", tmp, str(src)]
    try:
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise CompileError(f"{config.cc} failed to compile {name!r} (source: {src}):\n"
                               f"$ {' '.join(command)}\n{result.stderr}")
        digest = sha256_of(Path(tmp))
        os.replace(tmp, so)
    except OSError as err:
        raise CompileError(f"cannot compile {name!r} with {config.cc!r}: {err}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    meta = {"name": name, "sha256": digest, "compiler": compiler_version(config.cc),
            "flags": list(compiler_flags())}
    write_atomic(entry / "meta.json", json.dumps(meta, indent=1).encode())
    return so
