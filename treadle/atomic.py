"""Files in the cache written whole or not at all: under a temporary name beside the
target, then renamed into place, so a reader never sees half a file."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_bytes(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_json(path: Path, data) -> Path:
    return write_bytes(path, json.dumps(data, indent=1).encode())
