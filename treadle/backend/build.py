"""Compiling generated source into binaries, through one content-addressed on-disk cache.

C for the CPU becomes a shared object (gcc), CUDA C a cubin (nvcc); a ``Toolchain`` holds
all that differs between them: the compiler command and the binary's name and check.
An entry is the folder ``<cache_dir>/kernels/<key>/`` holding the source, the binary and
``meta.json`` (the binary's sha256 and the compiler's messages, where ptxas reports a
CUDA kernel's registers). The key hashes everything that decides the binary: the source,
the command (flags, target features) and the compiler's version line. Files are written
under temporary names in the entry folder and renamed into place, the json last. A hit is
used only when the binary matches the hash in the json and passes the toolchain's check
(a shared object, read as ELF by ``backend.elf``, is complete and defines the symbols the
caller will look up; the check never opens it, since opening a truncated .so kills the
process). Anything else (a corrupt, truncated or half-written entry, a file where the
folder should be) is rebuilt.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence, TypeVar

from treadle.atomic import write_bytes
from treadle.backend.elf import check_shared_object
from treadle.config import config, usable_cores
from treadle.errors import CompileError

# Every flag generated code is compiled with; the ISA flags (-mavx2 -mfma) come from the
# target. No -ffast-math: kernels keep IEEE semantics (NaN, inf, signed zeros); standard
# excess precision, so that a cast to _Float16 rounds (ir.passes.widen_half relies on it).
# Floating-point exception flags are nobody's to read, so no trapping math: with it gcc
# kept a clamp followed by a conversion to an integer (every QuantizeLinear) as branches,
# and a quantised ResNet-50's epilogues ran scalar.
# No loop becomes a memcpy or memset: a tile's rows are short, and gcc expanded a copy of a
# run-time length (a row of a packed panel whose length is a symbol) into `rep movsb`,
# whose start-up made attention's P V at T = 17 run 1.6-2x slower.
BASE_FLAGS = ("-O3", "-std=gnu11", "-fPIC", "-shared", "-fopenmp-simd", "-fno-math-errno",
              "-fno-trapping-math", "-fexcess-precision=standard", "-fno-tree-loop-distribute-patterns",
              "-Werror=implicit-function-declaration")

T = TypeVar("T")

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


@dataclass(frozen=True)
class Toolchain:
    """How one kind of source becomes a binary: the compiler command (its program and
    flags, before ``-o <binary> <source>``), the version line that identifies the
    compiler, the names of the source and binary files, and the check a cached binary
    must pass (raising OSError or ValueError) for the symbols a caller will look up."""
    command: tuple[str, ...]
    version: str
    source_name: str
    binary_name: str
    check: Callable[[Path, Iterable[str]], None]


@dataclass(frozen=True)
class Built:
    path: Path  # the binary
    log: str  # what the compiler printed while building it


def compiler_flags(target) -> tuple[str, ...]:
    """Every flag C for ``target`` (a ``CpuTarget``) is compiled with."""
    return BASE_FLAGS + target.compiler_flags


def c_toolchain(target) -> Toolchain:
    """gcc (TREADLE_CC) for ``target`` (a ``CpuTarget``): shared objects checked as ELF."""
    version = compiler_version(config.cc, "the C compiler", "install gcc or set TREADLE_CC")
    return Toolchain((config.cc, *compiler_flags(target)), version, "kernel.c", "kernel.so",
                     check_shared_object)


@functools.lru_cache(maxsize=None)
def compiler_version(program: str, label: str, advice: str) -> str:
    """What ``program --version`` prints, which names the compiler and its version; where
    it cannot run, the error names the compiler by ``label`` and says what to do
    (``advice``)."""
    try:
        result = subprocess.run([program, "--version"], capture_output=True, text=True,
                                check=True)
    except (OSError, subprocess.CalledProcessError) as err:
        raise CompileError(f"cannot run {label} ({program!r}: {err}); {advice}") from None
    return result.stdout.strip() or program


def build_with(toolchain: Toolchain, source: str, name: str, symbols: Iterable[str] = ()
               ) -> Built:
    """The binary ``toolchain`` compiles from ``source``, from the cache when a valid
    entry that defines ``symbols`` exists; ``name`` only labels messages."""
    identity = [source, list(toolchain.command), toolchain.version]
    key = hashlib.sha256(json.dumps(identity).encode()).hexdigest()
    entry = Path(config.cache_dir) / "kernels" / key
    with lock_for(key):
        return _cached(entry, toolchain, symbols) or _compile(entry, toolchain, source, name)


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


def _cached(entry: Path, toolchain: Toolchain, symbols: Iterable[str]) -> Built | None:
    binary = entry / toolchain.binary_name
    try:
        meta = json.loads((entry / "meta.json").read_text())
        if meta["sha256"] != sha256_of(binary):
            return None
        toolchain.check(binary, symbols)
        return Built(binary, str(meta["log"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _compile(entry: Path, toolchain: Toolchain, source: str, name: str) -> Built:
    if entry.is_file() or entry.is_symlink():  # a stray file where the entry's folder
        entry.unlink()                             # belongs; the cache owns every name here
    src = write_bytes(entry / toolchain.source_name, source.encode())
    binary = entry / toolchain.binary_name
    fd, tmp = tempfile.mkstemp(dir=entry, prefix=toolchain.binary_name + ".", suffix=".tmp")
    os.close(fd)
    command = [*toolchain.command, "-o", tmp, str(src)]
    program = toolchain.command[0]
    try:
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise CompileError(f"{program} failed to compile {name!r} (source: {src}):\n"
                               f"$ {' '.join(command)}\n{result.stderr}{result.stdout}")
        digest = sha256_of(Path(tmp))
        os.replace(tmp, binary)
    except OSError as err:
        raise CompileError(f"cannot compile {name!r} with {program!r}: {err}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log = result.stderr + result.stdout
    meta = {"name": name, "sha256": digest, "compiler": toolchain.version,
            "flags": list(toolchain.command[1:]), "log": log}
    write_bytes(entry / "meta.json", json.dumps(meta, indent=1).encode())
    return Built(binary, log)
