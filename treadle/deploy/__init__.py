"""Deployment from C: a compiled model as a folder a C program uses without Python.

    libtreadle_model.so  every kernel, the thread pool and model.c (the model's tables and
                         the runtime that reads them); it exports the C API alone
    treadle_model.h      the C API: create from the folder, query the inputs and outputs,
                         run on caller-owned buffers, destroy
    constants.bin        the constants, with the folder format, treadle version, model id,
                         size and checksum the library checks
    main.c, Makefile     an example program; README.txt says how to build and run it
    src/                 the sources the library was built from

The kernels are the ones the Python runtime calls, printed again from their lowered IR
and compiled with the same flags; the steps, the memory plan and the binding of symbolic
sizes are C over the same tables (``program``, ``model_source``, ``runtime_source``).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from treadle.deploy import build, constants, example
from treadle.deploy.header import DTYPES, HEADER_NAME, header
from treadle.deploy.model_source import kernel_sources, model_source, write_sources
from treadle.deploy.program import Layout, layout
from treadle.errors import ExportError
from treadle.runtime.executor import Executable
from treadle.version import __version__
from treadle.runtime.pool import SOURCE as POOL_SOURCE
from treadle.target.cpu import host

CONSTANTS = "constants.bin"
# What marks a folder as an earlier export, which a new one may replace.
MARKERS = (HEADER_NAME, CONSTANTS, build.LIBRARY)


def export(executable: Executable, name: str, directory: str | os.PathLike) -> Path:
    """Writes the exported folder of ``executable`` (a model called ``name``) into
    ``directory``, which must be missing, empty or an earlier export (replaced);
    ExportError where C cannot run the model."""
    tables = layout(executable)
    folder = Path(directory)
    _check_target(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.export."))
    staging.chmod(0o755)  # mkdtemp's folder is private; the export is a plain folder
    try:
        _write(tables, staging, name, __version__)
        _replace(folder, staging)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return folder


def _write(tables: Layout, folder: Path, name: str, version: str) -> None:
    objects = kernel_sources(tables)
    payload, offsets = constants.pack(tables.constants)
    model_c, model_id = model_source(tables, objects, version, offsets, len(payload),
                                     constants.checksum(payload), host().features)
    kernels = [f"src/kernels_{k}.c" for k in range(len(objects))]
    sources = {**dict(zip(kernels, (source for source, _ in objects))),
               "src/thread_pool.c": POOL_SOURCE, "src/model.c": model_c}
    write_sources(folder, sources)
    (folder / HEADER_NAME).write_text(header(version))
    constants.write(folder / CONSTANTS, payload, version, model_id)
    steps = build.commands(kernels, "src/thread_pool.c", "src/model.c")
    build.build(folder, steps)
    (folder / "main.c").write_text(example.MAIN_C)
    (folder / "Makefile").write_text(example.MAKEFILE)
    described = [_describe(tables, k) for k in tables.inputs]
    outputs = [_describe(tables, k) for k in tables.outputs]
    (folder / "README.txt").write_text(example.readme(version, name, described, outputs,
                                                      steps))


def _describe(tables: Layout, index: int) -> str:
    t = tables.tensors[index]
    dims = ", ".join(str(tables.dims[d]) for d in t.shape)
    return f"{t.name}: {DTYPES[t.dtype]}[{dims}]"


def _check_target(folder: Path) -> None:
    """Refuses a folder holding anything but an earlier export: nothing the user owns is
    overwritten."""
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"{folder} exists and is not a directory")
    if folder.is_dir() and any(folder.iterdir()) and \
            not all((folder / marker).is_file() for marker in MARKERS):
        raise FileExistsError(f"{folder} is not empty and not an exported treadle model; "
                              "choose another directory")


def _replace(folder: Path, staging: Path) -> None:
    """Moves the new export into place; an earlier one goes only once it is there."""
    if not folder.exists() or not any(folder.iterdir()):
        os.replace(staging, folder)
        return
    old = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.old."))
    os.replace(folder, old / "model")
    os.replace(staging, folder)
    shutil.rmtree(old)


__all__ = ["ExportError", "export"]
