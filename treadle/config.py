"""Every knob treadle reads from the environment, read once at import.

    from treadle.config import config, override
    with override(dump_dir="/tmp/dump"):
        ...

| variable             | field        | meaning                                                |
|----------------------|--------------|--------------------------------------------------------|
| TREADLE_CACHE_DIR    | cache_dir    | compiled kernels and tuning records (~/.cache/treadle) |
| TREADLE_DUMP         | dump_dir     | write every IR after every pass and generated sources  |
| TREADLE_NUM_THREADS  | num_threads  | worker threads of generated kernels (usable cores)     |
| TREADLE_PIN_WORKERS  | pin_workers  | pin each kernel worker thread to a core of its own (1) |
| TREADLE_VERIFY       | verify       | verify the IR after every pass (1) or only at the end  |
| TREADLE_CC           | cc           | the C compiler (gcc)                                   |
| TREADLE_NVCC         | nvcc         | the CUDA compiler (nvcc)                               |
| TREADLE_PLAN_CACHE   | plan_cache   | memory plans a model keeps, one per set of sizes (64)  |
| TREADLE_CHECK_BOUNDS | check_bounds | check every access of lang and builder kernels (0)     |
| TREADLE_RUNNER       | runner       | where tuning times candidates: local (default), ray,   |
|                      |              | ray://host:port (a Ray cluster; docs/tuning.md)        |
| TREADLE_RECORDS      | records      | the tuning record store: a directory or a .sqlite file |
|                      |              | (default: the tuning folder of the cache directory)    |
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Iterator, Optional


def usable_cores() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Config:
    cache_dir: Path
    dump_dir: Optional[Path]
    num_threads: int
    pin_workers: bool
    verify: bool
    cc: str
    nvcc: str
    plan_cache: int
    check_bounds: bool
    runner: str
    records: Optional[Path]


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name}={text!r}: expected a positive integer")
    return value


def runner_name(text: str, name: str = "runner") -> str:
    """``text`` where it names a runner of tuning measurements: ``local``, ``ray`` (the
    cluster RAY_ADDRESS names, or one already joined) or ``ray://host:port`` (a Ray
    client address)."""
    if text in ("local", "ray") or (text.startswith("ray://") and len(text) > len("ray://")):
        return text
    raise ValueError(f"{name}={text!r}: expected 'local', 'ray' or 'ray://host:port'")


def from_environment(env=os.environ) -> Config:
    dump = env.get("TREADLE_DUMP")
    threads = env.get("TREADLE_NUM_THREADS")
    plans = env.get("TREADLE_PLAN_CACHE")
    records = env.get("TREADLE_RECORDS")
    return Config(
        cache_dir=Path(env.get("TREADLE_CACHE_DIR") or Path.home() / ".cache" / "treadle"),
        dump_dir=Path(dump) if dump else None,
        num_threads=_positive_int("TREADLE_NUM_THREADS", threads) if threads else usable_cores(),
        pin_workers=env.get("TREADLE_PIN_WORKERS", "1") not in ("", "0"),
        verify=env.get("TREADLE_VERIFY", "0") not in ("", "0"),
        cc=env.get("TREADLE_CC") or "gcc",
        nvcc=env.get("TREADLE_NVCC") or "nvcc",
        plan_cache=_positive_int("TREADLE_PLAN_CACHE", plans) if plans else 64,
        check_bounds=env.get("TREADLE_CHECK_BOUNDS", "0") not in ("", "0"),
        runner=runner_name(env.get("TREADLE_RUNNER") or "local", "TREADLE_RUNNER"),
        records=Path(records) if records else None,
    )


class _Current:
    """Holds the active Config; attribute reads go to it so `config.x` is always current."""

    def __init__(self, value: Config):
        self.value = value

    def __getattr__(self, name: str):
        return getattr(self.value, name)


config = _Current(from_environment())


@contextlib.contextmanager
def override(**changes) -> Iterator[Config]:
    """Temporarily replaces some fields of the active configuration."""
    known = {f.name for f in fields(Config)}
    unknown = set(changes) - known
    if unknown:
        raise TypeError(f"unknown config fields {sorted(unknown)}; known: {sorted(known)}")
    for key in ("cache_dir", "dump_dir", "records"):
        if changes.get(key) is not None:
            changes[key] = Path(changes[key])
    if "runner" in changes:
        runner_name(changes["runner"])
    previous = config.value
    config.value = replace(previous, **changes)
    try:
        yield config.value
    finally:
        config.value = previous
