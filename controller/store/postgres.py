"""The PostgreSQL backend of the controller's database (``database: postgresql://...``).

HA replicas share one database, so a new leader continues every incident, count, breaker window
and held action where the old one left them. psycopg 3 with a small connection pool; the SQL is
the store's own (``controller.store.database``), its ``?`` placeholders and SQLite column types
translated here. psycopg is imported only when a PostgreSQL database is configured (the ``postgres``
extra; the controller's image has it).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import structlog

from controller.store.database import Cursor, Tx

log = structlog.get_logger(__name__)

_TYPES = ((re.compile(r"\bINTEGER\b"), "BIGINT"), (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"))


def is_postgres(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


def redacted(dsn: str) -> str:
    """The DSN without its password, for messages and logs."""
    parts = urlsplit(dsn)
    user = f"{parts.username}@" if parts.username else ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{user}{parts.hostname or ''}{port}{parts.path}"


def to_postgres(sql: str, has_args: bool) -> str:
    """A statement in the store's SQL, as PostgreSQL (psycopg) takes it. Pure."""
    if not has_args:
        return sql  # without parameters psycopg leaves % alone
    return sql.replace("%", "%%").replace("?", "%s")


def ddl_to_postgres(schema: str) -> list[str]:
    """A schema script, one statement per item, in PostgreSQL's column types. Pure."""
    for pattern, replacement in _TYPES:
        schema = pattern.sub(replacement, schema)
    return [s.strip() for s in schema.split(";") if s.strip()]


class _PgTx:
    def __init__(self, connection: Any) -> None:
        self._c = connection

    def execute(self, sql: str, args: Sequence[Any] = (), /) -> Cursor:
        cursor: Cursor = self._c.execute(to_postgres(sql, bool(args)), tuple(args) if args else None)
        return cursor

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]], /) -> None:
        with self._c.cursor() as cursor:
            cursor.executemany(to_postgres(sql, True), [tuple(r) for r in rows])


def _pool_timeout() -> type[Exception]:
    from psycopg_pool import PoolTimeout

    return PoolTimeout


class PostgresDatabase:
    shared = True

    def __init__(
        self,
        dsn: str,
        pool_size: int = 4,
        timeout_s: float = 10.0,
        away_wait_s: float = 0.2,
        reconnect_s: float = 8.0,
    ) -> None:
        """``timeout_s``: how long a transaction waits for a connection while the server answers;
        ``away_wait_s``: how long once it has failed, until it answers again. The store runs on the
        controller's event loop, so a server that is away must not hold the loop for ``timeout_s``
        per write: the write fails at once, is said (``StoreHealth``) and waits in its agent's spool,
        while the pool reconnects in the background (``reconnect_s``: one reconnection's tries, at
        most). A wait that began before the server was seen away ends within ``away_wait_s`` of the
        first sign of it (``_checkout``)."""
        try:
            from psycopg_pool import ConnectionPool
        except ImportError as exc:
            raise ValueError(
                f"database {redacted(dsn)} needs psycopg: pip install 'vigil-gpu[postgres]' ({exc})"
            ) from None
        self.where = redacted(dsn)
        self._wait_s = timeout_s
        self._away_wait_s = away_wait_s
        self._away = False
        self._lazy = 0
        # The pool's reconnection backs off exponentially (1, 2, 4, 8, 16 s ...) while the server is
        # away, and nothing asks again before its next try: after a long outage the server could be
        # back for a minute before the controller wrote again. A reconnection that gives up after
        # ``reconnect_s`` bounds that wait; the next write starts a new one at once.
        self._pool = ConnectionPool(
            dsn,
            min_size=1,
            max_size=pool_size,
            timeout=timeout_s,
            open=False,
            reconnect_timeout=reconnect_s,
            reconnect_failed=lambda _pool: log.warning(
                "store_reconnect_gave_up", database=self.where, after_s=reconnect_s
            ),
        )
        try:
            self._pool.open(wait=True, timeout=timeout_s)
        except Exception as exc:  # PoolTimeout: the server is away, or refuses us
            self._pool.close()
            raise ValueError(f"cannot connect to {self.where}: {exc}") from None

    def create(self, schema: str) -> None:
        with self.tx() as tx:
            for statement in ddl_to_postgres(schema):
                tx.execute(statement)

    def add_column(self, table: str, column: str, definition: str) -> None:
        if table in self.tables():
            (definition,) = ddl_to_postgres(definition)
            with self.tx() as tx:
                tx.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {definition}")

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        import psycopg

        broken = (psycopg.OperationalError, psycopg.InterfaceError, _pool_timeout())
        try:
            connection = self._checkout()
        except broken:
            self._away = True
            raise
        try:
            with connection:  # commits, or rolls back on an error (a pooled connection stays open)
                yield connection
        except broken:
            self._away = True
            raise
        finally:
            self._pool.putconn(connection)
        self._away = False

    def _checkout(self) -> Any:
        """A connection from the pool. While the server answers, the wait (up to ``timeout_s``: the
        pool busy) is taken in slices of ``away_wait_s``, and ends after the slice in which the server
        was seen away: another caller's failure, or a connection attempt of the pool's that failed.
        Without that, a caller that began waiting just before the outage held the event loop for the
        whole ``timeout_s``."""
        if self._away:
            return self._pool.getconn(timeout=self._away_wait_s)
        failed_before = self._pool.get_stats().get("connections_errors", 0)
        deadline = time.monotonic() + self._wait_s
        while True:
            left = deadline - time.monotonic()
            try:
                return self._pool.getconn(timeout=max(min(self._away_wait_s, left), 0.001))
            except _pool_timeout():
                failed = self._pool.get_stats().get("connections_errors", 0) > failed_before
                if self._away or failed or left <= self._away_wait_s:
                    raise

    @contextmanager
    def tx(self, durable: bool = True) -> Iterator[Tx]:
        """``durable=False`` (the store's writer: write-only statements, nobody reads their results)
        runs in pipeline mode: the statements go out without waiting for each answer, so a group
        of them costs one round trip, not one each."""
        with self._connection() as connection:
            if durable:
                with connection.transaction():
                    yield _PgTx(connection)
                return
            with connection.pipeline(), connection.transaction():
                connection.execute("SET LOCAL synchronous_commit = off")  # no wait for the WAL flush
                yield _PgTx(connection)
            self._lazy += 1

    @property
    def lazy_commits(self) -> int:
        return self._lazy

    def sync(self) -> None:
        """A transaction that writes its own commit record and waits for its flush: the WAL is one
        sequence, so every commit before it (any connection's) is then on disk too."""
        with self._connection() as connection, connection.transaction():
            connection.execute("SELECT txid_current()")

    def read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._connection() as connection:
            rows: list[tuple[Any, ...]] = connection.execute(
                to_postgres(sql, bool(args)), tuple(args) if args else None
            ).fetchall()
            return rows

    def tables(self) -> set[str]:
        rows = self.read("SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")
        return {str(r[0]) for r in rows}

    def check(self) -> list[str]:
        return []  # the server keeps its own files whole; what it holds is checked by identity

    def size_bytes(self) -> int:
        return int(self.read("SELECT pg_database_size(current_database())")[0][0])

    def close(self) -> None:
        self._pool.close()
