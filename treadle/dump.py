"""Writes what the compiler sees at each step under ``TREADLE_DUMP`` when it is set.

Layout: each compiled model gets a folder of its own, ``<dump>/<model>/`` (``<model>-2``,
``-3``, ... when that name is taken, so compiling several models, or one model twice, into
one dump overwrites nothing), holding ``graph/NN_<pass>.txt`` for the graph passes,
``graph/partition.txt``, ``<kernel>/ir/NN_<pass>.txt`` for each pass of a kernel and
``kernels_N.c`` for the sources of its shared objects; a model compiled while compiling
another (constant folding runs kernels) gets a folder inside that one's. A kernel compiled
on its own (``compile_function``) writes ``<dump>/<kernel>/ir/NN_<pass>.txt`` and
``<dump>/<kernel>/kernel.c``. Names coming from models are reduced to safe path
components, so a node name cannot escape the folder.
"""
from __future__ import annotations

import contextlib
import itertools
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Iterator

from treadle.config import config

# The folder of the model being compiled in this thread, if any.
_folder: ContextVar[Path | None] = ContextVar("treadle_dump_folder", default=None)


def safe_component(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip(".") or "_"
    return cleaned[:100]


@contextlib.contextmanager
def dump_folder(name: str) -> Iterator[None]:
    """Within the block, dumps go to a new folder named after ``name`` (see above)."""
    if config.dump_dir is None:
        yield
        return
    parent = _folder.get() or Path(config.dump_dir)
    parent.mkdir(parents=True, exist_ok=True)
    for count in itertools.count(1):
        folder = parent / (safe_component(name) + ("" if count == 1 else f"-{count}"))
        with contextlib.suppress(FileExistsError):  # mkdir claims a name atomically
            folder.mkdir()
            break
    token = _folder.set(folder)
    try:
        yield
    finally:
        _folder.reset(token)


def dump_text(parts: tuple[str, ...], text: str) -> Path | None:
    """Writes ``text`` to ``<folder>/<parts...>`` if dumping is on; returns the path."""
    if config.dump_dir is None:
        return None
    root = _folder.get() or Path(config.dump_dir)
    path = root.joinpath(*(safe_component(p) for p in parts))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")
    return path
