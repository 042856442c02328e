"""Tuning records: the best config found for a workload, kept on disk so a second compile
of the same model measures nothing.

A record is a JSON text in the record store (``tune.store``: by default the file
``<cache_dir>/tuning/<key>.json``). The key is a sha256 of the *workload*: the
template's schedule-independent description of the problem (``Template.workload``: for
GEMM, the operands' dtypes and shapes, the roles of the axes, the factors and the
epilogue, names numbered by first appearance) plus what decides which config wins: the
target's features, cache sizes, registers and threads, the tuning level, and the
template's name and source (a rewritten template is tuned afresh). A record holds the
chosen point of the space, the config it resolved to, and every measured point's time.
Records are written whole or not at all (``tune.store``); a record that is
unreadable, whose workload text differs, whose config the template rejects (valid JSON
with impossible values: a block of 0, a string) or no longer resolves to the stored
config, is ignored with a warning naming where it is, and overwritten by the next tuning. A
record therefore replays to the resolved config it stored, and to the same program.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from treadle.config import config
from treadle.schedule.template import Template
from treadle.target.cpu import CpuTarget
from treadle.tune.store import SQLITE_SUFFIXES, DirectoryStore, SqliteStore, Store

log = logging.getLogger(__name__)
FORMAT = "treadle-tuning-record-2"


@dataclass(frozen=True)
class Record:
    workload: str
    config: Any  # the chosen point of the space
    resolved: Any  # the config it resolved to (the one the program is generated from)
    # (config, median seconds or None when it failed) for every measured point.
    timings: tuple[tuple[Any, float | None], ...]


def workload_text(template: Template, pattern: Any, level: int, target: CpuTarget) -> str:
    return "\n".join([template.workload(pattern), f"target: {target}",
                      f"threads: {config.num_threads}", f"level: {level}",
                      f"template: {template.name} {_source_digest(type(template))}"])


def record_key(workload: str) -> str:
    return hashlib.sha256(workload.encode()).hexdigest()


def load_record(workload: str, template: Template, pattern: Any, target: CpuTarget
                ) -> Record | None:
    """The stored record of ``workload``, or None when there is none or it is unusable
    (see the module's docstring)."""
    kind = template.config_type
    try:
        data = read_record(workload, FORMAT)
        record = Record(workload, config_of(data["config"], kind),
                        config_of(data["resolved"], kind),
                        tuple((config_of(c, kind), t) for c, t in data["timings"]))
        replay(template, pattern, record.config, record.resolved, target)
        return record
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:  # ScheduleConfigError too
        log.warning("ignoring unusable tuning record %s (%s); it will be rewritten",
                    record_location(workload), err)
        return None


def read_record(workload: str, form: str) -> dict:
    """The stored JSON of ``workload``; ValueError when it was written for another
    workload or in another format."""
    text = record_store().read(record_key(workload))
    if text is None:
        raise FileNotFoundError(record_location(workload))
    data = json.loads(text)
    if data["format"] != form or data["workload"] != workload:
        raise ValueError("written for another workload or format")
    return data


def replay(template: Template, pattern: Any, config: Any, resolved: Any, target: CpuTarget
           ) -> Any:
    """``config`` checked and resolved for ``pattern``; ValueError (or ScheduleConfigError)
    when it no longer resolves to the stored ``resolved`` config."""
    template.check(pattern, config, target)
    result = template.resolve(pattern, config, target)
    if result.config != resolved:
        raise ValueError(f"its config {config} now resolves to {result.config}, not {resolved}")
    return result


def store_record(record: Record) -> None:
    write_record(record.workload, {
        "format": FORMAT, "workload": record.workload, "config": asdict(record.config),
        "resolved": asdict(record.resolved),
        "timings": [(asdict(c), t) for c, t in record.timings]})


def write_record(workload: str, data: dict) -> None:
    record_store().write(record_key(workload), json.dumps(data, indent=1))


def record_store() -> Store:
    """The store TREADLE_RECORDS names (``config.records``): a SQLite file, another
    directory, or by default ``records_dir()``."""
    path = config.records
    if path is None:
        return DirectoryStore(records_dir())
    return SqliteStore(path) if path.suffix in SQLITE_SUFFIXES else DirectoryStore(path)


def records_dir() -> Path:
    """The folder of the default store."""
    return Path(config.cache_dir) / "tuning"


def record_location(workload: str) -> str:
    """Where the record of ``workload`` is, for messages."""
    return record_store().location(record_key(workload))


def config_of(data: dict, kind: type) -> Any:
    known = {f.name for f in fields(kind)}
    if not isinstance(data, dict) or set(data) != known or \
            not all(type(v) is int for v in data.values()):  # bool is an int too
        raise ValueError(f"not a {kind.__name__}: {data!r}")
    return kind(**data)


@functools.lru_cache(maxsize=None)  # read once per process, not once per kernel
def _source_digest(kind: type) -> str:
    """A digest of a template's source: its module, or every module of its package."""
    path = Path(inspect.getfile(kind))
    files = sorted(path.parent.glob("*.py")) if path.name == "__init__.py" else [path]
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]
