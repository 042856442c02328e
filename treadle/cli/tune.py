"""The ``treadle tune`` command: a model's kernels tuned into the record store, here or
on a Ray cluster, and the store's records moved between machines.

    treadle tune model.onnx --level 1                          # measured on this machine
    treadle tune model.onnx --level 1 --cluster ray://head:10001
    treadle tune --export records.jsonl                         # every record of the store
    treadle tune --import records.jsonl                         # into this machine's store

An import comes first, the tuning next, an export last: one command can take records in,
tune what they lack and hand the whole store on. The records go to the store
TREADLE_RECORDS names (``tune.store``); a later ``treadle.compile(model, tune=LEVEL)``
reading the same store measures nothing.
"""
from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Iterator

from treadle.api import compile as compile_model
from treadle.config import config
from treadle.tune.records import record_store, records_dir
from treadle.tune.transfer import export_records, import_records


def tune(model: str | None, level: int | str, cluster: str | None = None,
         export: str | None = None, imported: str | None = None) -> None:
    """What ``treadle tune`` does (see the module's docstring), saying so on stdout."""
    if model is None and export is None and imported is None:
        raise ValueError("nothing to do: give a model to tune, --import FILE or --export FILE")
    runner = cluster_runner(cluster) if cluster else None
    where = config.records or records_dir()
    if imported is not None:
        print(f"imported {import_records(Path(imported))} records from {imported} into {where}")
    if model is not None:
        _tune_model(model, level, runner, where)
    if export is not None:
        print(f"exported {export_records(Path(export))} records from {where} to {export}")


def cluster_runner(address: str) -> str:
    """The runner ``--cluster ADDRESS`` names: a Ray client address, or ``auto``."""
    if address == "auto":
        return "ray"
    if address.startswith("ray://") and len(address) > len("ray://"):
        return address
    raise ValueError(f"--cluster {address}: expected ray://host:port (the Ray client port "
                     "of the cluster's head, 10001 by default) or auto (the cluster this "
                     "machine has joined, or the one RAY_ADDRESS names)")


def _tune_model(model: str, level: int | str, runner: str | None, where: Path) -> None:
    before = set(record_store().keys())
    start = time.perf_counter()
    with _progress_lines():
        compile_model(model, tune=level, runner=runner)
    seconds = time.perf_counter() - start
    added = len(set(record_store().keys()) - before)
    print(f"tuned {model} at level {level} in {seconds:.1f} s on "
          f"{runner or config.runner}: {added} new records in {where}")


@contextlib.contextmanager
def _progress_lines() -> Iterator[None]:
    """Tuning's progress lines on stderr while the block runs, where no bar shows them
    (``tune.progress``)."""
    logger = logging.getLogger("treadle.tune.progress")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
