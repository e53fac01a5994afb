"""What the controller files for later: small durable facts (the breaker's state, the pager's thread
ids), what people asked of it, and the checks and sweeps it ran."""

from __future__ import annotations

import json
from collections.abc import Mapping

from controller.store.coalesce import Later
from controller.store.database import Database, Tx

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS operator_actions (
  at REAL NOT NULL, what TEXT NOT NULL, node TEXT, requested_by TEXT, reason TEXT, detail TEXT);
CREATE TABLE IF NOT EXISTS sweeps (
  id TEXT PRIMARY KEY, requested_by TEXT, started_at REAL NOT NULL, finished_at REAL NOT NULL,
  summary TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS check_results (
  request_id TEXT, node TEXT, check_name TEXT, verdict TEXT, reason TEXT, figures TEXT,
  started_at REAL, finished_at REAL);
"""


class Records:
    def __init__(self, db: Database) -> None:
        self._db = db
        db.create(SCHEMA)

    def get_meta(self, key: str) -> str | None:
        rows = self._db.read("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str) -> None:
        self.set_metas({key: value})

    def set_metas(self, values: dict[str, str], durable: bool = True) -> None:
        with self._db.tx(durable) as db:
            Records.put_metas(db, values)

    @staticmethod
    def put_metas(db: Tx, values: Mapping[str, str | Later]) -> None:
        """Within a transaction of the caller's (a decision's, so the two are stored together). A
        ``Later`` value only in a write-behind transaction (``tx(durable=False)``): the writer makes
        it, and of a group's writes of one key makes only the last (``controller.store.coalesce``)."""
        db.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            list(values.items()),
        )

    def operator_action(self, what: str, node: str, requested_by: str, reason: str, detail: str, now: float) -> None:
        with self._db.tx() as db:
            db.execute(
                "INSERT INTO operator_actions VALUES (?, ?, ?, ?, ?, ?)",
                (now, what, node, requested_by, reason, detail),
            )

    def operator_actions(self) -> list[tuple[float, str, str, str, str, str]]:
        return [tuple(r) for r in self._db.read("SELECT * FROM operator_actions ORDER BY at")]

    def passed_checks(self, node: str = "") -> dict[str, list[float]]:
        """Node -> when each check of it passed (OK), oldest first; ``node``: that node's only."""
        where, args = ("AND node = ?", (node,)) if node else ("", ())
        rows = self._db.read(
            f"SELECT node, finished_at FROM check_results WHERE verdict = 'OK' {where} ORDER BY finished_at", args
        )
        found: dict[str, list[float]] = {}
        for n, at in rows:
            found.setdefault(str(n), []).append(float(at))
        return found

    def check_result(
        self,
        request_id: str,
        node: str,
        check: str,
        verdict: str,
        reason: str,
        figures: dict[str, float],
        started_at: float,
        finished_at: float,
    ) -> None:
        with self._db.tx() as db:
            db.execute(
                "INSERT INTO check_results VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (request_id, node, check, verdict, reason, json.dumps(figures), started_at, finished_at),
            )

    def sweep(self, sweep_id: str, requested_by: str, started: float, finished: float, summary: str) -> None:
        """A finished sweep: its summary (JSON), next to its checks' results in check_results."""
        with self._db.tx() as db:
            db.execute(
                "INSERT INTO sweeps VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                "requested_by = excluded.requested_by, started_at = excluded.started_at, "
                "finished_at = excluded.finished_at, summary = excluded.summary",
                (sweep_id, requested_by, started, finished, summary),
            )

    def sweep_summary(self, sweep_id: str) -> str | None:
        rows = self._db.read("SELECT summary FROM sweeps WHERE id = ?", (sweep_id,))
        return str(rows[0][0]) if rows else None
