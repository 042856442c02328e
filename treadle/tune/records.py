"""Tuning records: the best schedule found for a workload, kept on disk so a second compile
of the same model measures nothing.

A record is ``<cache_dir>/tuning/<key>.json``. The key is a sha256 of the *workload*: the
schedule-independent GEMM — the operands' dtypes and shapes, the roles of the axes, the
left and right factors and the epilogue, printed with every name replaced by its order of
first appearance — plus what decides which schedule wins: the target's features, cache
sizes, registers and threads, the tuning level, and the template's source (a rewritten
template is tuned afresh). Records are written under a temporary name and renamed into
place; a record that is unreadable, whose workload text differs, or whose config the
template rejects (valid JSON with impossible values: a block of 0, a string) is ignored
with a warning naming the file, and overwritten by the next tuning. A stored config
replays to the same IR.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Sequence

from treadle.config import config
from treadle.ir.expr import Buffer, Load
from treadle.ir.functor import free_vars, walk
from treadle.ir.printer import format_buffer_type, format_expr
from treadle.schedule.templates import matmul_cpu
from treadle.schedule.templates.matmul_cpu import GemmConfig, GemmPattern
from treadle.target.cpu import CpuTarget

log = logging.getLogger(__name__)
FORMAT = "treadle-tuning-record-1"


@dataclass(frozen=True)
class Record:
    workload: str
    config: GemmConfig
    # (config, median seconds or None when it failed) for every measured point.
    timings: tuple[tuple[GemmConfig, float | None], ...]


def workload_text(inputs: Sequence[Buffer | None], pattern: GemmPattern, level: int,
                  target: CpuTarget) -> str:
    c = pattern.compute
    used = {b for e in _sources(pattern) for b in _buffers(e)}
    operands = [b for b in inputs if b is not None and b in used]
    lines = [f"inputs: {'; '.join(f'{b.name}: {format_buffer_type(b)}' for b in operands)}",
             f"output: {pattern.output.buffer.name}: {format_buffer_type(pattern.output.buffer)}",
             f"batch: {_names(pattern.batch_axes)}", f"m: {_names(pattern.m_axes)}",
             f"n: {_names(pattern.n_axes)}", f"axes: {_names(c.axes)}",
             f"k: {_names(c.reduce_axes)} in {', '.join(map(format_expr, c.reduce_extents))}",
             f"left: {format_expr(pattern.left)}", f"right: {format_expr(pattern.right)}",
             f"epilogue: {format_expr(pattern.epilogue.value) if pattern.epilogue else '-'}"]
    names = [b.name for b in operands] + [pattern.output.buffer.name, c.buffer.name]
    names += [v.name for v in c.axes + c.reduce_axes]
    if pattern.epilogue is not None:  # its own axes, numbered afresh by every compile
        names += [v.name for v in pattern.epilogue.axes]
    names += sorted(v.name for b in operands for d in b.shape for v in free_vars(d))
    text = _canonical_names("\n".join(lines), names)
    return "\n".join([text, f"target: {target}", f"threads: {config.num_threads}",
                      f"level: {level}", f"template: {_template_digest()}"])


def record_key(workload: str) -> str:
    return hashlib.sha256(workload.encode()).hexdigest()


def load_record(workload: str, check: Callable[[GemmConfig], object] = lambda cfg: None
                ) -> Record | None:
    """The stored record of ``workload``, or None when there is none or it is unusable;
    ``check(config)`` raises ScheduleConfigError where the template cannot use it."""
    path = _path(workload)
    try:
        data = json.loads(path.read_text())
        if data["format"] != FORMAT or data["workload"] != workload:
            raise ValueError("written for another workload or format")
        record = Record(workload, _config(data["config"]),
                        tuple((_config(c), t) for c, t in data["timings"]))
        check(record.config)
        return record
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:  # ScheduleConfigError too
        log.warning("ignoring unusable tuning record %s (%s); it will be rewritten", path, err)
        return None


def store_record(record: Record) -> Path:
    path = _path(record.workload)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, "workload": record.workload, "config": asdict(record.config),
            "timings": [(asdict(c), t) for c, t in record.timings]}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def records_dir() -> Path:
    return Path(config.cache_dir) / "tuning"


def _path(workload: str) -> Path:
    return records_dir() / f"{record_key(workload)}.json"


def _config(data: dict) -> GemmConfig:
    known = {f.name for f in fields(GemmConfig)}
    if not isinstance(data, dict) or set(data) != known or \
            not all(type(v) is int for v in data.values()):  # bool is an int too
        raise ValueError(f"not a GemmConfig: {data!r}")
    return GemmConfig(**data)


def _sources(pattern: GemmPattern):
    yield pattern.left
    yield pattern.right
    if pattern.epilogue is not None:
        yield pattern.epilogue.value


def _buffers(expr) -> set[Buffer]:
    return {n.buffer for n in walk(expr) if isinstance(n, Load)}


def _names(axes) -> str:
    return "(" + ", ".join(v.name for v in axes) + ")"


def _canonical_names(text: str, names: Sequence[str]) -> str:
    """``text`` with each of ``names`` replaced by ``_<order of first appearance>``, so
    the counters in generated names do not change the key."""
    order = {}
    for name in names:
        order.setdefault(name, len(order))
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(order, key=len, reverse=True)))
                         + r")\b")
    return pattern.sub(lambda m: f"_{order[m.group(1)]}", text)


def _template_digest() -> str:
    return hashlib.sha256(Path(matmul_cpu.__file__).read_bytes()).hexdigest()[:16]
