"""Compiling an exported model's sources into its one shared library.

The kernels keep the flags they were compiled with for Python (``backend.build``); the
thread pool and ``model.c`` need no instruction-set flags, so that creating a model on a
CPU without them reports the missing one instead of faulting. Kernel and pool symbols
are hidden: the library exports the C API alone. The commands run in the export folder
with relative paths, so the README can show them as they ran.
"""
from __future__ import annotations

import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from treadle.backend.build import compiler_flags
from treadle.config import config, usable_cores
from treadle.errors import CompileError
from treadle.target.cpu import host

LIBRARY = "libtreadle_model.so"
PLAIN_FLAGS = ("-O2", "-std=gnu11", "-fPIC")


def commands(kernels: Sequence[str], pool: str, model: str) -> list[list[str]]:
    """The compiler commands, object by object, then the link (sources relative to the
    folder)."""
    kernel_flags = [f for f in compiler_flags(host()) if f != "-shared"]
    hidden = "-fvisibility=hidden"
    steps = [[config.cc, *kernel_flags, hidden, "-c"] for _ in kernels]
    steps += [[config.cc, *PLAIN_FLAGS, hidden, "-c"], [config.cc, *PLAIN_FLAGS, "-I.", "-c"]]
    objects = []
    for step, source in zip(steps, [*kernels, pool, model]):
        objects.append(str(Path(source).with_suffix(".o")))
        step += ["-o", objects[-1], source]
    link = [config.cc, "-shared", f"-Wl,-soname,{LIBRARY}", "-Wl,-z,defs", "-o", LIBRARY,
            *objects, "-lm", "-lpthread"]
    return [*steps, link]


def build(folder: Path, steps: list[list[str]]) -> None:
    """Runs the compiles at once, then the link, in ``folder``; removes the objects."""
    *compiles, link = steps
    with ThreadPoolExecutor(max_workers=usable_cores()) as pool:
        list(pool.map(lambda command: _run(folder, command), compiles))
    _run(folder, link)
    for command in compiles:
        (folder / command[command.index("-o") + 1]).unlink()


def _run(folder: Path, command: list[str]) -> None:
    try:
        result = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    except OSError as err:
        raise CompileError(f"cannot run {command[0]!r}: {err}") from None
    if result.returncode != 0:
        raise CompileError(f"{command[0]} failed building the exported model in {folder}:\n"
                           f"$ {shlex.join(command)}\n{result.stderr}{result.stdout}")
