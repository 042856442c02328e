"""Where tuning records live: one store, shared by every compile that reads the same one.

A record is a JSON text under a key (``records.record_key``: a sha256 of the workload,
whose text names the problem, the target, the threads, the level and the template's
source digest). The store is chosen by ``TREADLE_RECORDS`` (``records.record_store``):

- unset: a folder of files, ``<TREADLE_CACHE_DIR>/tuning/<key>.json`` (the default);
- a directory: the same folder of files there, which a cluster's machines may share (each
  file is written under a temporary name and renamed into place: a reader never sees half
  a record, and two writers of one key leave one whole record);
- a file named ``*.sqlite``, ``*.sqlite3`` or ``*.db``: one SQLite table, each write one
  transaction (SQLite's locking needs a local disk: on a network file system share a
  directory instead).

``tune.transfer`` moves a store's records to another machine's store.
"""
from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Iterator, Protocol

from treadle.atomic import write_bytes

SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
SQLITE_TIMEOUT_S = 60.0  # how long a writer waits for another's transaction


class Store(Protocol):
    def read(self, key: str) -> str | None:
        """The record stored under ``key``; None when there is none."""
        ...

    def write(self, key: str, text: str) -> None:
        """Stores ``text`` under ``key``, whole or not at all."""
        ...

    def keys(self) -> list[str]:
        ...

    def location(self, key: str) -> str:
        """Where ``key``'s record is, for messages."""
        ...


class DirectoryStore:
    """A folder of ``<key>.json`` files."""

    def __init__(self, path: Path):
        self.path = path

    def read(self, key: str) -> str | None:
        try:
            return (self.path / f"{key}.json").read_text()
        except FileNotFoundError:
            return None

    def write(self, key: str, text: str) -> None:
        write_bytes(self.path / f"{key}.json", text.encode())

    def keys(self) -> list[str]:
        return sorted(p.stem for p in self.path.glob("*.json"))

    def location(self, key: str) -> str:
        return str(self.path / f"{key}.json")


class SqliteStore:
    """One table of (key, record) in a SQLite file."""

    def __init__(self, path: Path):
        self.path = path

    def read(self, key: str) -> str | None:
        with self._connection() as db:
            row = db.execute("SELECT record FROM records WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def write(self, key: str, text: str) -> None:
        with self._connection() as db, db:  # the inner `with`: one transaction
            db.execute("INSERT OR REPLACE INTO records (key, record) VALUES (?, ?)",
                       (key, text))

    def keys(self) -> list[str]:
        with self._connection() as db:
            return [key for (key,) in db.execute("SELECT key FROM records ORDER BY key")]

    def location(self, key: str) -> str:
        return f"{self.path} (key {key})"

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=SQLITE_TIMEOUT_S)
        try:
            db.execute("CREATE TABLE IF NOT EXISTS records "
                       "(key TEXT PRIMARY KEY, record TEXT NOT NULL)")
            yield db
        finally:
            db.close()
