"""Writes what the compiler sees at each step under ``TREADLE_DUMP`` when it is set.

Layout: ``<dump>/<kernel>/ir/NN_<pass>.txt`` for each pass of a kernel, ``<dump>/<kernel>/
kernel.c`` for its source, ``<dump>/graph/NN_<pass>.txt`` for graph passes. Names coming
from models are reduced to safe path components, so a node name cannot escape the folder.
"""
from __future__ import annotations

import re
from pathlib import Path

from treadle.config import config


def safe_component(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip(".") or "_"
    return cleaned[:100]


def dump_text(parts: tuple[str, ...], text: str) -> Path | None:
    """Writes ``text`` to ``<dump>/<parts...>`` if dumping is on; returns the path."""
    if config.dump_dir is None:
        return None
    path = Path(config.dump_dir).joinpath(*(safe_component(p) for p in parts))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")
    return path
