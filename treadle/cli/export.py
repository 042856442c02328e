"""``treadle export``: compile an ONNX model and write the folder that runs it from C
(``treadle.deploy``).

``--dim SYMBOL=SIZE`` fixes a symbolic dimension before compiling, so that the export
has that size built in; the dimensions left symbolic are bound from the input shapes at
each run of the exported library.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import treadle
from treadle.frontend.onnx import from_onnx
from treadle.ir.expr import Var


def export_model(path: str, directory: str, *, tune: int | str,
                 dims: Mapping[str, int], dynamic: Mapping[str, tuple[int, int]]) -> str:
    """Compiles the model at ``path`` and exports it into ``directory``; a summary."""
    graph = from_onnx(path)
    unknown = sorted(set(dims) - graph.symbols)
    if unknown:
        raise ValueError(f"--dim {', '.join(unknown)}: not a symbolic dimension of the "
                         f"model's inputs ({', '.join(sorted(graph.symbols)) or 'it has none'})")
    shapes = {t.name: [dims.get(d.name, d) if isinstance(d, Var) else d for d in t.shape]
              for t in graph.inputs}
    model = treadle.compile(graph, tune=tune, shapes=shapes if dims else None,
                            dynamic=dynamic or None)
    folder = model.export(directory)
    sizes = ", ".join(f"{p.name} ({_kib(p)} KiB)"
                      for p in (folder / "libtreadle_model.so", folder / "constants.bin"))
    return (f"exported {model.name!r} to {folder}: {sizes}\n"
            f"the C API: {folder / 'treadle_model.h'}; build the example with "
            f"make -C {folder}, run it as {folder / 'README.txt'} shows")


def _kib(path: Path) -> int:
    return -(-path.stat().st_size // 1024)
