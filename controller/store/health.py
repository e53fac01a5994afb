"""Whether the database takes writes now, said aloud.

Every write transaction goes through ``WatchedDatabase``: the first failure of an outage is logged
as an error (with the database and the error), each failure is counted, and the first success
after it logs the outage's end and length. While it fails, ``problem`` says so for ``vigil status``
and the readiness probe. Nothing is lost meanwhile: a batch whose transaction failed is not
acknowledged, so it waits in its agent's spool and is sent again once the database is back.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import structlog

from controller.store.database import Database, Tx

log = structlog.get_logger(__name__)


_PG_CONTENT_ERRORS = {"ProgrammingError", "DataError", "IntegrityError", "NotSupportedError"}  # psycopg's


def is_database_error(exc: BaseException) -> bool:
    """The database's own failure (a full disk, a server gone), not a bug of the code inside a transaction."""
    if isinstance(exc, sqlite3.ProgrammingError) or (
        isinstance(exc, sqlite3.OperationalError) and str(exc).startswith(("no such", "syntax error"))
    ):
        return False  # the SQL's fault, not the database's
    if type(exc).__module__.startswith(("psycopg", "psycopg_pool")):
        # The statement's own fault (a missing table, bad data, a broken constraint) is not an outage.
        return not any(k.__name__ in _PG_CONTENT_ERRORS for k in type(exc).__mro__)
    return isinstance(exc, (sqlite3.Error, OSError))


class StoreHealth:
    def __init__(self, where: str, clock: Callable[[], float] = time.time) -> None:
        self.where = where
        self._clock = clock
        self.failing_since: float | None = None
        self.last_error = ""
        self.failures = 0
        self.outages = 0
        self.on_failure: Callable[[], None] = lambda: None  # the metrics' counter, once they exist

    def failed(self, exc: BaseException) -> None:
        self.failures += 1
        self.last_error = repr(exc)[:300]
        self.on_failure()
        if self.failing_since is None:
            self.failing_since = self._clock()
            self.outages += 1
            log.error(
                "store_cannot_record",
                database=self.where,
                error=self.last_error,
                detail="incidents and node states cannot be written; agents keep their signals until it is back",
            )

    def succeeded(self) -> None:
        if self.failing_since is not None:
            log.warning(
                "store_recorded_again",
                database=self.where,
                outage_s=round(self._clock() - self.failing_since, 1),
                failures=self.failures,
            )
            self.failing_since = None

    @property
    def problem(self) -> str:
        """What ``vigil status`` and the readiness probe say; "" while the database takes writes."""
        if self.failing_since is None:
            return ""
        since = self._clock() - self.failing_since
        return f"cannot record in {self.where} for {since:.0f} s: {self.last_error}"


class WatchedDatabase:
    """A ``Database`` whose write transactions report to ``StoreHealth``."""

    def __init__(self, inner: Database, health: StoreHealth) -> None:
        self.inner = inner
        self.health = health
        self.where = inner.where
        self.shared = inner.shared

    def create(self, schema: str) -> None:
        self.inner.create(schema)

    def add_column(self, table: str, column: str, definition: str) -> None:
        self.inner.add_column(table, column, definition)

    def tx(self, durable: bool = True) -> AbstractContextManager[Tx]:
        return self._tx(durable)

    @contextmanager
    def _tx(self, durable: bool) -> Iterator[Tx]:
        try:
            with self.inner.tx(durable) as tx:
                yield tx
        except Exception as exc:
            if is_database_error(exc):
                self.health.failed(exc)
            raise
        self.health.succeeded()

    @property
    def lazy_commits(self) -> int:
        return self.inner.lazy_commits

    def sync(self) -> None:
        try:
            self.inner.sync()
        except Exception as exc:
            if is_database_error(exc):
                self.health.failed(exc)
            raise

    def read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return self.inner.read(sql, args)
        except Exception as exc:  # a server that is away fails reads first; a success proves no write
            if is_database_error(exc):
                self.health.failed(exc)
            raise

    def size_bytes(self) -> int:
        try:
            return self.inner.size_bytes()
        except Exception as exc:
            if is_database_error(exc):
                self.health.failed(exc)
            raise

    def tables(self) -> set[str]:
        return self.inner.tables()

    def check(self) -> list[str]:
        return self.inner.check()

    def close(self) -> None:
        self.inner.close()
