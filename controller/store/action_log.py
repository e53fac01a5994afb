"""The actions asked for, each once per incident and kind, and what became of them.

An action is PENDING until the action runner carries it out (DONE), gives up (FAILED) or a person
drops it (SKIPPED); HELD while the circuit breaker holds it back. PENDING actions resume at start.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controller.store.database import Cursor, Database, Tx
from controller.vocab.actions import ExternalAction, action_from_json, action_kind, action_to_json

SCHEMA = """
CREATE TABLE IF NOT EXISTS actions (
  incident_id TEXT NOT NULL, kind TEXT NOT NULL, status TEXT NOT NULL, payload TEXT NOT NULL,
  requested_at REAL NOT NULL, done_at REAL, attempts INTEGER NOT NULL DEFAULT 0, detail TEXT DEFAULT '',
  seq INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (incident_id, kind));
CREATE INDEX IF NOT EXISTS actions_status ON actions (status);
"""


@dataclass(frozen=True, slots=True)
class PendingAction:
    incident_id: str
    action: ExternalAction
    attempts: int
    seq: int = 0  # the signal that asked for it: the agent's ack waits until the action is done


class ActionLog:
    def __init__(self, db: Database) -> None:
        self._db = db
        db.add_column("actions", "seq", "INTEGER NOT NULL DEFAULT 0")
        db.create(SCHEMA)

    @staticmethod
    def add_in(db: Tx, action: ExternalAction, now: float, seq: int = 0, held: bool = False) -> Cursor:
        """In the caller's transaction (its rowcount, where it is known: 0 when that incident already
        has an action of this kind)."""
        return db.execute(
            "INSERT INTO actions (incident_id, kind, status, payload, requested_at, seq) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (action.incident_id, action_kind(action), "HELD" if held else "PENDING", action_to_json(action), now, seq),
        )

    def add(self, action: ExternalAction, now: float, seq: int = 0) -> bool:
        """An action the controller asks for itself; False when that incident already has it."""
        with self._db.tx() as db:
            return self.add_in(db, action, now, seq).rowcount == 1

    def paged(self, incident_id: str) -> bool:
        """Whether the incident has a page (to send later words to its thread)."""
        return bool(self._db.read("SELECT 1 FROM actions WHERE incident_id = ? AND kind LIKE 'PAGE%'", (incident_id,)))

    def pages_since(self, prefix: str, since: float) -> list[tuple[str, float]]:
        """(incident, when asked) of the pages asked for since ``since`` whose incident ids begin
        with ``prefix`` (a job crash's: what the next controller must not page again)."""
        rows = self._db.read(
            "SELECT incident_id, requested_at FROM actions WHERE kind LIKE 'PAGE%' AND incident_id LIKE ? "
            "AND requested_at >= ?",
            (prefix.replace("%", "").replace("_", "") + "%", since),
        )
        return [(str(r[0]), float(r[1])) for r in rows]

    def pending(self) -> list[PendingAction]:
        return self._with_status("PENDING")

    def held(self) -> list[PendingAction]:
        return self._with_status("HELD")

    def _with_status(self, status: str) -> list[PendingAction]:
        rows = self._db.read(
            "SELECT incident_id, payload, attempts, seq FROM actions WHERE status = ? ORDER BY requested_at",
            (status,),
        )
        return [PendingAction(r[0], action_from_json(r[1]), r[2], r[3]) for r in rows]

    def set_status(self, keys: Sequence[tuple[str, str]], status: str, detail: str) -> None:
        with self._db.tx() as db:
            db.executemany(
                "UPDATE actions SET status = ?, detail = ? WHERE incident_id = ? AND kind = ?",
                [(status, detail, i, k) for i, k in keys],
            )

    def finish(
        self,
        incident_id: str,
        kind: str,
        status: str,
        detail: str,
        now: float,
        also: Callable[[Tx], None] | None = None,
    ) -> None:
        """Lazily durable (``group_commit``): lost with the machine, the action is PENDING and runs again.
        ``also`` writes what the outcome changed beside it, in the same transaction."""
        with self._db.tx(durable=False) as db:
            db.execute(
                "UPDATE actions SET status = ?, detail = ?, done_at = ?, attempts = attempts + 1 "
                "WHERE incident_id = ? AND kind = ?",
                (status, detail, now, incident_id, kind),
            )
            if also is not None:
                also(db)

    def count_attempt(self, incident_id: str, kind: str, detail: str) -> None:
        with self._db.tx() as db:
            db.execute(
                "UPDATE actions SET attempts = attempts + 1, detail = ? WHERE incident_id = ? AND kind = ?",
                (detail, incident_id, kind),
            )
