"""The controller's durable state (SQLite, or PostgreSQL shared by HA replicas), one module per
domain over one database.

- ``nodes``: each node's state, its agent's spool and the last seq received;
- ``incidents``: the signals received and the incidents they opened or folded into;
- ``actions``: the actions asked for and what became of them;
- ``records``: small facts, operators' requests, check results and sweeps.

A received batch commits its signals, incidents, actions and the node's state in one transaction
(``Store.tx``). Only after it is on disk (``group_commit``: one flush for many commits, off the event
loop) does the controller acknowledge, so a controller or its machine stopped at any point neither
forgets an incident nor loses a signal; actions left PENDING resume at start.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from controller.store.action_log import ActionLog, PendingAction
from controller.store.coalesce import Later
from controller.store.database import Database, SqliteDatabase, Tx
from controller.store.group_commit import GroupCommit
from controller.store.health import StoreHealth, WatchedDatabase
from controller.store.identity import DatabaseRefused, Opened, check_identity, open_database, stamp
from controller.store.incidents import ActionView, IncidentLog, IncidentView
from controller.store.nodes import NodeRow, NodeTable
from controller.store.records import Records
from controller.store.retention import prune
from controller.store.write_behind import StoreUnavailable, WriteBehind

__all__ = [
    "ActionLog",
    "ActionView",
    "Database",
    "DatabaseRefused",
    "GroupCommit",
    "IncidentLog",
    "IncidentView",
    "Later",
    "NodeRow",
    "NodeTable",
    "Opened",
    "PendingAction",
    "Records",
    "SqliteDatabase",
    "Store",
    "StoreHealth",
    "StoreUnavailable",
    "Tx",
    "WriteBehind",
]


class Store:
    def __init__(self, target: Path | str, cluster: str = "default", coalesce: bool = True) -> None:
        """Open (or create) the database a file path or a ``postgresql://`` DSN names; raises
        DatabaseRefused for one that is damaged, foreign, or newer than this controller
        (``controller.store.identity``). ``opened`` says what it was. ``coalesce``: the writer merges
        its statements per table (off only to measure it, ``bench.store_writer``)."""
        raw, self.opened = open_database(target)
        try:
            check_identity(raw, cluster)
        except DatabaseRefused:
            raw.close()
            raise
        self.health = StoreHealth(raw.where)
        # The hot writes leave the event loop (controller.store.write_behind); the health sees the writer's.
        self.writer = WriteBehind(WatchedDatabase(raw, self.health), coalesce=coalesce)
        self.db: Database = self.writer
        self.nodes = NodeTable(self.db)
        self.incidents = IncidentLog(self.db)
        self.actions = ActionLog(self.db)
        self.records = Records(self.db)
        self.group = GroupCommit(self.db)  # the hot writes' durability, one flush for many
        stamp(self.db, cluster)

    @property
    def shared(self) -> bool:
        """Other replicas may write this database (PostgreSQL): a new leader reads it again."""
        return self.db.shared

    @contextmanager
    def tx(self, durable: bool = True) -> Iterator[Tx]:
        """One transaction across the domains (a received batch: ``durable=False``, its ack awaiting
        ``group.durable()``)."""
        with self.db.tx(durable) as db:
            yield db

    def prune(self, before: float) -> dict[str, int]:
        """Retention: delete what finished before ``before`` (``controller.store.retention``)."""
        return prune(self.db, before)

    def read(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """A read-only query, for views and tests that look at a table directly."""
        return self.db.read(sql, args)

    def close(self) -> None:
        self.group.close()
        self.db.close()
