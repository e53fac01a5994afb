"""The controller's database: one interface, two backends.

- ``SqliteDatabase`` (the default: a file, one controller; the demo): one connection, its lock,
  ``BEGIN IMMEDIATE`` transactions, WAL.
- ``PostgresDatabase`` (``controller.store.postgres``; HA replicas sharing one database): a
  connection pool, one transaction per ``tx``.

Each domain's tables (``nodes``, ``incidents``, ``action_log``, ``records``, and the local
actuator's) bring their own schema and share the database, so one transaction can span them: a
received batch commits its signals, incidents, actions and the node's state together. The SQL is
written once, in the subset both speak (``?`` placeholders, ``ON CONFLICT`` upserts, ``INTEGER``,
``REAL`` and ``TEXT`` columns); the PostgreSQL backend translates placeholders and column types.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchall(self) -> list[Any]: ...

    def fetchone(self) -> Any: ...


class Tx(Protocol):
    """A transaction's connection: statements run in it commit together."""

    def execute(self, sql: str, args: Sequence[Any] = ..., /) -> Cursor: ...

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]], /) -> Any: ...


class Database(Protocol):
    where: str  # for messages: the file, or the server and database (never a password)
    shared: bool  # other controller replicas may write it (a standby reads it again when it leads)

    def create(self, schema: str) -> None: ...

    def add_column(self, table: str, column: str, definition: str) -> None:
        """Bring a table written by an older controller up to this schema (no-op if it is new or has it)."""
        ...

    def tx(self, durable: bool = True) -> AbstractContextManager[Tx]:
        """One write transaction; it commits when the block ends and rolls back if it raises.
        ``durable=False``: the commit does not wait for the disk (it survives the process, not the
        machine) until ``sync`` (``controller.store.group_commit``); it is counted in ``lazy_commits``."""
        ...

    @property
    def lazy_commits(self) -> int:
        """How many ``durable=False`` transactions have committed."""
        ...

    def sync(self) -> None:
        """Make every commit before it durable (blocking: called off the event loop)."""
        ...

    def read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def tables(self) -> set[str]: ...

    def check(self) -> list[str]:
        """What is wrong with the database itself (empty: nothing)."""
        ...

    def size_bytes(self) -> int:
        """How much room it takes (SQLite: the file and its write-ahead log)."""
        ...

    def close(self) -> None: ...


class SqliteDatabase:
    shared = False

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.where = str(path)
        self._path = path
        self._wal = path.with_name(path.name + "-wal")
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._lock = threading.RLock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._lazy = 0
        self._wal_fd: int | None = None
        self._sync_lock = threading.Lock()

    def create(self, schema: str) -> None:
        with self._lock:
            self._db.executescript(schema)

    def add_column(self, table: str, column: str, definition: str) -> None:
        with self._lock:
            columns = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}
            if columns and column not in columns:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")

    @contextmanager
    def tx(self, durable: bool = True) -> Iterator[Tx]:
        with self._lock:
            if durable:
                with self._db:
                    self._db.execute("BEGIN IMMEDIATE")
                    yield self._db
                return
            # WAL with synchronous=NORMAL: the commit is written to the log, not yet synced; a later
            # FULL commit or ``sync`` makes it durable, with every commit before it.
            self._db.execute("PRAGMA synchronous=NORMAL")
            try:
                with self._db:
                    self._db.execute("BEGIN IMMEDIATE")
                    yield self._db
                self._lazy += 1
            finally:
                self._db.execute("PRAGMA synchronous=FULL")

    @property
    def lazy_commits(self) -> int:
        return self._lazy

    def sync(self) -> None:
        """fdatasync the write-ahead log: every commit written to it so far is then on disk (what was
        checkpointed out of it, SQLite synced itself)."""
        with self._sync_lock:
            try:
                inode = os.stat(self._wal).st_ino
            except FileNotFoundError:
                return  # nothing written since the log was last removed (a clean close)
            if self._wal_fd is not None and os.fstat(self._wal_fd).st_ino != inode:
                os.close(self._wal_fd)
                self._wal_fd = None
            if self._wal_fd is None:
                self._wal_fd = os.open(self._wal, os.O_RDONLY)
            os.fdatasync(self._wal_fd)

    def read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, tuple(args)).fetchall())

    def tables(self) -> set[str]:
        return {str(r[0]) for r in self.read("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def check(self) -> list[str]:
        problems = [str(r[0]) for r in self.read("PRAGMA quick_check")]
        return [] if problems == ["ok"] else problems

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in (self._path, self._path.with_name(self._path.name + "-wal")) if p.exists())

    def close(self) -> None:
        with self._lock:
            self._db.close()
        with self._sync_lock:
            if self._wal_fd is not None:
                os.close(self._wal_fd)
                self._wal_fd = None
