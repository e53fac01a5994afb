"""The controller's SQLite database: one connection, its lock, and transactions.

Each domain's tables (``nodes``, ``incidents``, ``action_log``, ``records``, and the local
actuator's) bring their own schema and share this connection, so one transaction can span them:
a received batch commits its signals, incidents, actions and the node's state together.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class Database:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._lock = threading.RLock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")

    def create(self, schema: str) -> None:
        with self._lock:
            self._db.executescript(schema)

    def add_column(self, table: str, column: str, definition: str) -> None:
        """Bring a table written by an older controller up to this schema (no-op if it is new or has it)."""
        with self._lock:
            columns = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}
            if columns and column not in columns:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; it commits when the block ends and rolls back if it raises."""
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            yield self._db

    def read(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    def close(self) -> None:
        with self._lock:
            self._db.close()
