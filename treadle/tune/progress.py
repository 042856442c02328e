"""How far a measuring call has got: trials settled, failed, and the fastest so far.

On a terminal where tqdm is installed the numbers go on a bar; otherwise (a log, a CI
run, tests) they are logged at INFO, every LOG_EVERY_S seconds and once at the end, so a
long tuning on a cluster says where it stands without a terminal.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Sequence

log = logging.getLogger(__name__)

LOG_EVERY_S = 10.0


class Progress:
    """``total`` trials of ``name``: ``settle(times)`` as trials finish (None: failed);
    called with a count, as a tqdm bar's ``update`` is, where the times are unknown."""

    def __init__(self, total: int, name: str):
        self.total, self.name = total, name
        self.done = self.failed = 0
        self.best: float | None = None
        self.bar = _bar(total, name)
        self.logged = time.monotonic()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.done:
            log.info("%s", self.summary())

    def __call__(self, n: int) -> None:
        self.update(n)

    def update(self, n: int = 1) -> None:
        self.done += n
        self._show(n)

    def settle(self, times: Sequence[float | None]) -> None:
        self.done += len(times)
        self.failed += sum(t is None for t in times)
        measured = [t for t in times if t is not None]
        if measured:
            self.best = min(measured + ([self.best] if self.best is not None else []))
        self._show(len(times))

    def summary(self) -> str:
        return (f"tuning {self.name}: {self.done} of {self.total} trials done, "
                f"{self._state()}")

    def _state(self) -> str:
        best = "none yet" if self.best is None else f"{self.best * 1e3:.4g} ms"
        return f"{self.failed} failed, best {best}"

    def _show(self, n: int) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(self._state(), refresh=False)
            self.bar.update(n)
        elif time.monotonic() - self.logged >= LOG_EVERY_S:
            self.logged = time.monotonic()
            log.info("%s", self.summary())


def _bar(total: int, name: str):
    """A tqdm bar on a terminal where tqdm is installed (it is optional); else None."""
    if not sys.stderr.isatty() or "PYTEST_CURRENT_TEST" in os.environ:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=f"tuning {name}", unit="trial", leave=False)
