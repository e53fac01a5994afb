"""Write-behind: the hot writes leave the event loop.

A received batch, an agent's Hello and an action's outcome are written as ``tx(durable=False)``
(``controller.store.group_commit``). Against PostgreSQL each of their statements is a round trip to
the server, and on the controller's event loop those round trips are what fills it under load (at
2,000 agents and 800 signals/s, 28 agents connected a minute: ``bench/results/scale.jsonl``). Here
such a transaction only records its statements; one writer thread writes them, in the order they
were made, many transactions' worth in one of the server's. Everything else first lets the writer
catch up with what was recorded before it: a durable transaction, a read, and ``sync`` (the group
commit, so an agent's ack), so whoever reads sees every write made before.

A value may be recorded as ``Later`` (``controller.store.coalesce``): made by the writer as it writes
the statement, and not at all where a later write replaces it in the same group.

A failure keeps the order and loses nothing. The writer keeps what it could not write and tries it
again, backing off, until the database takes it; meanwhile the store's health says so
(``StoreHealth``), and a new hot transaction fails at once, as it would without the writer: its
batch is not decided and waits in its agent's spool. Only what was recorded before the first failure
is acted on before it is on disk; it is written once the database is back, and if the controller
dies first, its agent (not acknowledged yet) sends it again. A statement the database refuses by its
content (a bug, not an outage) is written alone, refused, and said (``store_write_refused``) without
holding up the rest.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import structlog

from controller.store.coalesce import Statement, coalesced, made
from controller.store.database import Cursor, Database, Tx
from controller.store.health import is_database_error

log = structlog.get_logger(__name__)


class StoreUnavailable(OSError):
    """The database does not take writes now (the writer's last error says why)."""


class _NotWritten:
    """What ``execute`` answers inside a recorded transaction: nothing is known until it is written."""

    @property
    def rowcount(self) -> int:
        raise TypeError("a write-behind transaction's statements are not written yet: use tx(durable=True)")

    def fetchall(self) -> list[Any]:
        raise TypeError("a write-behind transaction cannot read: use read()")

    def fetchone(self) -> Any:
        raise TypeError("a write-behind transaction cannot read: use read()")


_NOT_WRITTEN = _NotWritten()


class _Recording:
    def __init__(self) -> None:
        self.statements: list[Statement] = []

    def execute(self, sql: str, args: Sequence[Any] = (), /) -> Cursor:
        self.statements.append((sql, tuple(args), False))
        return _NOT_WRITTEN

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]], /) -> None:
        self.statements.append((sql, [tuple(r) for r in rows], True))


def _replay(tx: Tx, unit: Sequence[Statement]) -> None:
    for sql, args, many in unit:
        if many:
            tx.executemany(sql, [made(row) for row in args])
        else:
            tx.execute(sql, made(args))


class WriteBehind:
    """A ``Database`` whose ``durable=False`` transactions are written by a thread of their own."""

    def __init__(
        self,
        inner: Database,
        max_pending: int = 20_000,
        group_max: int = 500,
        retry_s: tuple[float, float] = (0.1, 2.0),
        close_wait_s: float = 10.0,
        coalesce: bool = True,
    ) -> None:
        """``max_pending``: recorded transactions not yet written, past which a new one waits (the
        event loop, then, as without the writer); ``group_max``: transactions in one of the
        database's; ``retry_s``: the first and the longest pause between tries while it fails;
        ``coalesce``: a group's statements merged per table (``controller.store.coalesce``; off
        only to measure it)."""
        self.inner = inner
        self.where = inner.where
        self.shared = inner.shared
        self._max_pending = max_pending
        self._group_max = group_max
        self._retry_s = retry_s
        self._close_wait_s = close_wait_s
        self._coalesce = coalesce
        self._cond = threading.Condition()
        self._queue: deque[list[Statement]] = deque()
        self._recorded = 0  # hot transactions recorded
        self._written = 0  # ...and written, in order
        self._error: BaseException | None = None  # the writer's last failure, while it fails
        self._closing = False
        self.refused = 0  # transactions the database refused by their content (said, not retried)
        self.on_refused: Callable[[], None] = lambda: None  # the metrics' counter, once they exist
        self._thread = threading.Thread(target=self._write_loop, name="write-behind", daemon=True)
        self._thread.start()

    # The Database interface ------------------------------------------------------------------

    def create(self, schema: str) -> None:
        self.catch_up()
        self.inner.create(schema)

    def add_column(self, table: str, column: str, definition: str) -> None:
        self.catch_up()
        self.inner.add_column(table, column, definition)

    def tx(self, durable: bool = True) -> AbstractContextManager[Tx]:
        return self._durable_tx() if durable else self._recorded_tx()

    @contextmanager
    def _durable_tx(self) -> Iterator[Tx]:
        self.catch_up()
        with self.inner.tx(True) as tx:
            yield tx

    @contextmanager
    def _recorded_tx(self) -> Iterator[Tx]:
        if self._error is not None:  # an outage: fail at once, the caller's batch waits in its spool
            raise self._unavailable(self._error)
        recording = _Recording()
        yield recording
        if not recording.statements:
            return
        with self._cond:
            while len(self._queue) >= self._max_pending and self._error is None and not self._closing:
                self._cond.wait(0.5)  # the writer is behind: wait for it, as a direct write would
            self._queue.append(recording.statements)
            self._recorded += 1
            self._cond.notify_all()

    @property
    def lazy_commits(self) -> int:
        return self._recorded

    @property
    def thread_id(self) -> int:
        """The writer thread's id in the operating system (its CPU, measured by ``bench.store_writer``)."""
        return self._thread.native_id or 0

    @property
    def pending(self) -> int:
        """Recorded transactions not written yet."""
        return self._recorded - self._written

    def sync(self) -> None:
        self.catch_up()
        self.inner.sync()

    def read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self.catch_up()
        return self.inner.read(sql, args)

    def tables(self) -> set[str]:
        self.catch_up()
        return self.inner.tables()

    def check(self) -> list[str]:
        return self.inner.check()

    def size_bytes(self) -> int:
        return self.inner.size_bytes()

    def close(self) -> None:
        """Write what is recorded (up to ``close_wait_s``), then close; what could not be written is said."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(self._close_wait_s)
        if left := self.pending:
            log.error(
                "store_writes_not_written",
                database=self.where,
                transactions=left,
                detail="their agents were not acknowledged and send them again; actions run again",
            )
        self.inner.close()

    # The writer ------------------------------------------------------------------------------

    def catch_up(self) -> None:
        """Return once every transaction recorded before the call is written; raises
        StoreUnavailable while the writer cannot write."""
        with self._cond:
            target = self._recorded
            while self._written < target:
                if self._error is not None:
                    raise self._unavailable(self._error)
                if not self._thread.is_alive():
                    raise StoreUnavailable(f"{self.where}: the writer has stopped")
                self._cond.wait(0.5)

    def _unavailable(self, error: BaseException) -> StoreUnavailable:
        return StoreUnavailable(f"{self.where} does not take writes now: {error!r}"[:400])

    def _write_loop(self) -> None:
        pause = self._retry_s[0]
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                units = [self._queue[i] for i in range(min(len(self._queue), self._group_max))]
            try:
                with self.inner.tx(durable=False) as tx:
                    if self._coalesce:
                        _replay(tx, coalesced(units))
                    else:
                        for unit in units:
                            _replay(tx, unit)
            except Exception as exc:
                if not is_database_error(exc):
                    self._write_one_by_one(units)
                    continue
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                    if self._closing:
                        return  # close() says what is left
                time.sleep(pause)
                pause = min(pause * 2, self._retry_s[1])
                continue
            self._done(len(units))
            pause = self._retry_s[0]

    def _write_one_by_one(self, units: list[list[Statement]]) -> None:
        """A group the database refused by its content: each transaction alone, the refused ones said
        and set aside (an outage meanwhile stops here: the group is tried again whole)."""
        for unit in units:
            try:
                with self.inner.tx(durable=False) as tx:
                    _replay(tx, unit)
            except Exception as exc:
                if is_database_error(exc):
                    return
                self.refused += 1
                self.on_refused()
                log.error("store_write_refused", database=self.where, error=repr(exc)[:300], sql=unit[0][0][:200])
            self._done(1)

    def _done(self, count: int) -> None:
        with self._cond:
            for _ in range(count):
                self._queue.popleft()
            self._written += count
            self._error = None
            self._cond.notify_all()
