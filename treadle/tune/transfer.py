"""Moving tuning records between machines (``treadle tune --export FILE / --import FILE``).

An export is a JSON-lines file: a header line ``{"format": EXPORT_FORMAT}``, then one
``{"key": ..., "record": ...}`` per record of the store (``tune.store``). An import is
checked whole before anything is written, as far as a record can be without its model:
every line must hold a record whose workload hashes to its key, in a record format of
this treadle, whose configs are mappings of names to integers; a damaged file is refused
with an error naming it and the line. Whether a record still replays for its template is
checked when a compile loads it, as for every record (``records.load_record``: an
unusable one is ignored with a warning and tuned again).
"""
from __future__ import annotations

import json
from pathlib import Path

from treadle.atomic import write_bytes
from treadle.errors import TreadleError
from treadle.tune import dynamic, records
from treadle.tune.records import record_store
from treadle.tune.store import Store

EXPORT_FORMAT = "treadle-tuning-export-1"
# The record formats, each with its fields holding configs (one, or a list of them).
CONFIG_FIELDS = {records.FORMAT: ("config", "resolved"),
                 dynamic.FORMAT: ("configs", "resolved")}


class RecordImportError(TreadleError, ValueError):
    """A file to import records from is not an export of them, or is damaged."""


def export_records(path: str | Path, store: Store | None = None) -> int:
    """Writes every record of ``store`` (the configured one) to ``path``; their number."""
    store = store or record_store()
    lines = [json.dumps({"format": EXPORT_FORMAT})]
    for key in store.keys():
        text = store.read(key)
        if text is not None:
            lines.append(json.dumps({"key": key, "record": json.loads(text)},
                                    separators=(",", ":")))
    write_bytes(Path(path), ("\n".join(lines) + "\n").encode())
    return len(lines) - 1


def import_records(path: str | Path, store: Store | None = None) -> int:
    """Adds the records exported to ``path`` to ``store`` (the configured one), replacing
    those of the same keys, once every one is checked; their number."""
    store = store or record_store()
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise RecordImportError(f"{path}: cannot read the records to import ({err})") from None
    if not lines or _json(path, 1, lines[0]) != {"format": EXPORT_FORMAT}:
        raise RecordImportError(f"{path}: not an export of tuning records (its first line "
                                f"is not {{\"format\": \"{EXPORT_FORMAT}\"}})")
    entries = [_entry(path, number, line) for number, line in enumerate(lines[1:], 2)
               if line.strip()]
    for key, record in entries:
        store.write(key, json.dumps(record, indent=1))
    return len(entries)


def _json(path, number: int, line: str):
    try:
        return json.loads(line)
    except ValueError as err:
        raise RecordImportError(f"{path}, line {number}: not JSON ({err})") from None


def _entry(path, number: int, line: str) -> tuple[str, dict]:
    """The key and record of one line of an export, checked."""
    entry = _json(path, number, line)
    if not isinstance(entry, dict):
        raise RecordImportError(f"{path}, line {number}: not a {{\"key\", \"record\"}} object")
    problem = _problem(entry.get("key"), entry.get("record"))
    if problem:
        raise RecordImportError(f"{path}, line {number}: {problem}")
    return entry["key"], entry["record"]


def _problem(key, record) -> str | None:
    """What is wrong with ``record`` stored under ``key``; None when nothing is."""
    if not isinstance(record, dict) or not isinstance(record.get("workload"), str):
        return "not a tuning record (it has no workload)"
    if key != records.record_key(record["workload"]):
        return f"its key {key!r} is not the sha256 of its workload"
    fields = CONFIG_FIELDS.get(record.get("format"))
    if fields is None:
        return f"its format {record.get('format')!r} is none of {', '.join(CONFIG_FIELDS)}"
    for field in fields:
        value = record.get(field)
        if not all(map(_is_config, value if isinstance(value, list) else [value])):
            return f"its {field!r} is not a config (a mapping of names to integers)"
    return None


def _is_config(value) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and type(v) is int
                                           for k, v in value.items())
