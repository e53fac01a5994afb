"""The hot writes leave the event loop (``controller.store.write_behind``), held to what the store
promised before: every write in order, read back by whoever reads after it, nothing lost through an
outage, an outage said and refused at once, and a statement the database refuses by its content set
aside without holding the rest. On both backends where the contract is the database's own."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from controller.store import Store, StoreHealth, StoreUnavailable, WriteBehind
from controller.store.database import SqliteDatabase, Tx
from controller.store.health import WatchedDatabase
from tests.helpers import poll_until

SCHEMA = "CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v INTEGER NOT NULL);"


class Gated:
    """A database whose transactions wait while ``gate`` is shut and fail (as a full disk does)
    while ``broken`` is set: what the writer meets, driven by the test."""

    def __init__(self, inner: SqliteDatabase) -> None:
        self.inner = inner
        self.where, self.shared = inner.where, inner.shared
        self.gate = threading.Event()
        self.gate.set()
        self.broken = False
        self.transactions = 0

    def tx(self, durable: bool = True) -> AbstractContextManager[Tx]:
        return self._tx(durable)

    @contextmanager
    def _tx(self, durable: bool) -> Iterator[Tx]:
        self.gate.wait(30)
        if self.broken:
            raise sqlite3.OperationalError("database or disk is full")
        self.transactions += 1
        with self.inner.tx(durable) as tx:
            yield tx

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def writer(tmp_path: Path, **options: Any) -> tuple[WriteBehind, Gated, StoreHealth]:
    raw = SqliteDatabase(tmp_path / "w.db")
    raw.create(SCHEMA)
    gated = Gated(raw)
    health = StoreHealth(raw.where)
    return WriteBehind(WatchedDatabase(gated, health), retry_s=(0.02, 0.1), **options), gated, health  # type: ignore[arg-type]


def put(db: WriteBehind, key: str, value: int) -> None:
    with db.tx(durable=False) as tx:
        tx.execute("INSERT INTO t VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v", (key, value))


def rows(db: WriteBehind) -> dict[str, int]:
    return {k: v for k, v in db.read("SELECT k, v FROM t")}


def test_writes_are_recorded_at_once_and_read_back_in_order_by_whoever_reads_after(tmp_path: Path) -> None:
    db, gated, _ = writer(tmp_path)
    gated.gate.clear()  # the database is slow: nothing is written yet
    for i in range(300):
        put(db, f"k{i % 7}", i)  # the same rows over and over: the last write must win
    assert db.pending == 300 and db.lazy_commits == 300  # recorded without waiting for the database
    gated.gate.set()
    assert rows(db) == {f"k{j}": max(i for i in range(300) if i % 7 == j) for j in range(7)}
    assert db.pending == 0 and gated.transactions < 300  # many recorded transactions in one of the database's
    db.close()


def test_a_durable_transaction_waits_for_what_was_recorded_before_it(tmp_path: Path) -> None:
    db, _, _ = writer(tmp_path)
    put(db, "a", 1)
    with db.tx() as tx:  # UPDATE of a row recorded a moment ago: it must be there
        assert tx.execute("UPDATE t SET v = v + 1 WHERE k = 'a'").rowcount == 1
    assert rows(db) == {"a": 2}
    with db.tx(durable=False) as tx, pytest.raises(TypeError, match="not written yet"):
        _ = tx.execute("UPDATE t SET v = 0").rowcount
    db.close()


def test_an_outage_is_said_refused_at_once_and_loses_nothing_written_before_it(tmp_path: Path) -> None:
    db, gated, health = writer(tmp_path)
    put(db, "before", 1)
    db.sync()
    gated.broken = True
    put(db, "during", 2)  # recorded before anyone knew: kept, written once the database is back
    poll_until(lambda: health.problem, what="the outage said")
    with pytest.raises(StoreUnavailable, match="does not take writes now"):
        put(db, "refused", 3)  # known down: the caller's batch waits in its agent's spool
    with pytest.raises(StoreUnavailable):
        db.sync()  # so no agent is acknowledged meanwhile
    gated.broken = False
    poll_until(lambda: not health.problem and db.pending == 0, what="written once it is back")
    assert rows(db) == {"before": 1, "during": 2}
    assert health.outages == 1 and health.failures >= 1
    db.close()


def test_a_statement_refused_by_its_content_is_said_and_the_rest_written(tmp_path: Path) -> None:
    db, gated, _ = writer(tmp_path)
    gated.gate.clear()  # so the three land in one group
    put(db, "a", 1)
    with db.tx(durable=False) as tx:
        tx.execute("INSERT INTO no_such_table VALUES (?)", (1,))  # a bug, not an outage
    put(db, "b", 2)
    gated.gate.set()
    assert rows(db) == {"a": 1, "b": 2}
    assert db.refused == 1
    db.close()


def test_a_refused_write_is_exported_as_a_metric(tmp_path: Path) -> None:
    from controller.act.actuators import NullPager
    from controller.act.local_actuator import LocalActuator
    from controller.compose import node_route
    from controller.metrics import ControllerMetrics
    from controller.vocab.policy import Policy

    store, metrics = Store(tmp_path / "ctl.db"), ControllerMetrics()
    node_route(store, Policy(), LocalActuator(store.db), NullPager(), metrics=metrics)
    with store.tx(durable=False) as tx:
        tx.execute("INSERT INTO no_such_table VALUES (?)", (1,))
    store.db.sync()
    assert metrics.store_writes_refused._value.get() == 1
    store.close()


def test_close_writes_what_was_recorded(tmp_path: Path) -> None:
    db, gated, _ = writer(tmp_path)
    gated.gate.clear()
    put(db, "late", 9)
    threading.Timer(0.2, gated.gate.set).start()
    db.close()
    again = SqliteDatabase(tmp_path / "w.db")
    assert again.read("SELECT k, v FROM t") == [("late", 9)]
    again.close()


def test_a_full_writer_holds_the_next_transaction_until_it_has_room(tmp_path: Path) -> None:
    db, gated, _ = writer(tmp_path, max_pending=5)
    gated.gate.clear()
    for i in range(5):
        put(db, f"k{i}", i)
    sixth = threading.Thread(target=put, args=(db, "k5", 5))
    sixth.start()
    sixth.join(0.3)
    assert sixth.is_alive() and db.lazy_commits == 5  # waits, as a direct write to a slow database would
    gated.gate.set()
    sixth.join(10)
    assert rows(db) == {f"k{i}": i for i in range(6)}
    db.close()


def test_the_store_writes_through_it_on_both_backends(store_target: Path | str) -> None:
    store = Store(store_target)
    assert isinstance(store.db, WriteBehind)
    with store.tx(durable=False) as tx:
        tx.execute(
            "INSERT INTO nodes (node, health, state, spool_id, last_seq, last_heartbeat, gpus) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            ("n1", "HEALTHY", "{}", "s1", 0, 0.0, 8),
        )
    with store.tx(durable=False) as tx:
        tx.execute("UPDATE nodes SET last_seq = ? WHERE node = ?", (7, "n1"))
    assert store.read("SELECT node, last_seq FROM nodes") == [("n1", 7)]
    store.close()


def test_what_counts_as_an_outage_and_what_as_the_statements_fault() -> None:
    """An outage is retried until the database is back; a statement's own fault never is (it would
    hold every write behind it for good)."""
    import psycopg
    from psycopg_pool import PoolTimeout

    from controller.store.health import is_database_error

    outages = [
        psycopg.OperationalError("server closed the connection"),
        psycopg.errors.DiskFull(),
        PoolTimeout("couldn't get a connection"),
        sqlite3.OperationalError("database or disk is full"),
        OSError(28, "No space left on device"),
    ]
    faults = [
        psycopg.errors.UndefinedTable(),
        psycopg.errors.UniqueViolation(),
        psycopg.errors.InvalidTextRepresentation(),
        sqlite3.OperationalError("no such table: t"),
        sqlite3.ProgrammingError("wrong number of bindings"),
        TypeError("a bug"),
    ]
    assert [is_database_error(e) for e in outages] == [True] * len(outages)
    assert [is_database_error(e) for e in faults] == [False] * len(faults)
