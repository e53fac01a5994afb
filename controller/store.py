"""The incident store (SQLite): node states, signals seen, incidents and the actions taken.

One transaction per received batch holds the signals (deduplicated by ``(node, spool_id, seq)``),
the nodes' new states, new or folded incidents and the actions still to carry out. Only after it
commits does the controller acknowledge, so a controller killed at any point neither forgets an
incident nor loses a signal; actions left PENDING are resumed on start.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from controller.actions import (
    Action,
    EscalateIncident,
    ExternalAction,
    FoldIntoIncident,
    OpenIncident,
    action_from_json,
    action_kind,
    action_to_json,
)
from controller.node_state import NodeState, state_from_json, state_to_json
from controller.policy import Severity
from vigil_core.signals import GpuRef, Signal

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
  node TEXT PRIMARY KEY, health TEXT NOT NULL, state TEXT NOT NULL, spool_id TEXT NOT NULL DEFAULT '',
  last_seq INTEGER NOT NULL DEFAULT 0, last_heartbeat REAL NOT NULL DEFAULT 0, gpus INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS signals (
  node TEXT NOT NULL, spool_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, code INTEGER,
  gpu_index INTEGER, gpu_uuid TEXT, pci_bus_id TEXT, value REAL, message TEXT, source TEXT,
  observed_at REAL, received_at REAL, incident_id TEXT, count INTEGER NOT NULL DEFAULT 1,
  PRIMARY KEY (node, spool_id, seq));
CREATE TABLE IF NOT EXISTS incidents (
  id TEXT PRIMARY KEY, node TEXT NOT NULL, gpu_index INTEGER, gpu_uuid TEXT, pci_bus_id TEXT,
  kind TEXT NOT NULL, code INTEGER, severity TEXT NOT NULL, meaning TEXT, remedy TEXT,
  status TEXT NOT NULL, signal_count INTEGER NOT NULL, first_message TEXT, first_seq INTEGER,
  first_observed_at REAL, received_at REAL, opened_at REAL, last_at REAL);
CREATE INDEX IF NOT EXISTS incidents_node ON incidents (node, status);
CREATE TABLE IF NOT EXISTS actions (
  incident_id TEXT NOT NULL, kind TEXT NOT NULL, status TEXT NOT NULL, payload TEXT NOT NULL,
  requested_at REAL NOT NULL, done_at REAL, attempts INTEGER NOT NULL DEFAULT 0, detail TEXT DEFAULT '',
  seq INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (incident_id, kind));
CREATE INDEX IF NOT EXISTS actions_status ON actions (status);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS operator_actions (
  at REAL NOT NULL, what TEXT NOT NULL, node TEXT, requested_by TEXT, reason TEXT, detail TEXT);
CREATE TABLE IF NOT EXISTS quarantines (
  node TEXT PRIMARY KEY, incident_id TEXT NOT NULL, reason TEXT, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS sweeps (
  id TEXT PRIMARY KEY, requested_by TEXT, started_at REAL NOT NULL, finished_at REAL NOT NULL,
  summary TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS check_results (
  request_id TEXT, node TEXT, check_name TEXT, verdict TEXT, reason TEXT, figures TEXT,
  started_at REAL, finished_at REAL);
"""


@dataclass(frozen=True, slots=True)
class NodeRow:
    state: NodeState
    spool_id: str
    last_seq: int
    gpus: int


@dataclass(frozen=True, slots=True)
class PendingAction:
    incident_id: str
    action: ExternalAction
    attempts: int
    seq: int = 0  # the signal that asked for it: the agent's ack waits until the action is done


@dataclass(frozen=True, slots=True)
class Received:
    """One new signal and what was decided about it, ready to be committed."""

    signal: Signal
    incident_id: str
    actions: tuple[Action, ...]
    held: frozenset[str] = frozenset()  # kinds of its actions that the guardrails hold back


@dataclass(frozen=True, slots=True)
class ActionView:
    kind: str
    status: str
    requested_at: float
    done_at: float | None
    detail: str


@dataclass
class IncidentView:
    id: str
    node: str
    gpu: GpuRef
    kind: str
    code: int
    severity: str
    meaning: str
    remedy: str
    status: str
    signal_count: int
    first_message: str
    first_observed_at: float
    received_at: float
    opened_at: float
    actions: list[ActionView] = field(default_factory=list)


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._lock = threading.RLock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._migrate()
        self._db.executescript(_SCHEMA)

    def _migrate(self) -> None:
        """Bring a database written by an older controller up to this schema."""
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(actions)")}
        if columns and "seq" not in columns:
            self._db.execute("ALTER TABLE actions ADD COLUMN seq INTEGER NOT NULL DEFAULT 0")
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(signals)")}
        if columns and "count" not in columns:  # a storm folded at the agent: one row, many observations
            self._db.execute("ALTER TABLE signals ADD COLUMN count INTEGER NOT NULL DEFAULT 1")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            yield self._db

    # Nodes ---------------------------------------------------------------------------------

    def load_nodes(self) -> dict[str, NodeRow]:
        with self._lock:
            rows = self._db.execute("SELECT node, state, spool_id, last_seq, gpus FROM nodes").fetchall()
        return {r[0]: NodeRow(state_from_json(r[1], r[0]), r[2], r[3], r[4]) for r in rows}

    def register_node(self, state: NodeState, spool_id: str, last_seq: int, gpus: int, now: float) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO nodes (node, health, state, spool_id, last_seq, last_heartbeat, gpus) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (node) DO UPDATE SET health = excluded.health, "
                "state = excluded.state, spool_id = excluded.spool_id, last_seq = excluded.last_seq, "
                "last_heartbeat = excluded.last_heartbeat, gpus = excluded.gpus",
                (state.node, state.health.value, state_to_json(state), spool_id, last_seq, now, gpus),
            )

    def save_states(self, states: Sequence[NodeState]) -> None:
        with self._tx() as db:
            db.executemany(
                "UPDATE nodes SET health = ?, state = ? WHERE node = ?",
                [(s.health.value, state_to_json(s), s.node) for s in states],
            )

    # Signals, incidents, actions -------------------------------------------------------------

    def commit_batch(
        self, node: str, spool_id: str, received: Sequence[Received], state: NodeState, last_seq: int, now: float
    ) -> None:
        with self._tx() as db:
            for item in received:
                s = item.signal
                db.execute(
                    "INSERT OR IGNORE INTO signals VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        node,
                        spool_id,
                        s.seq,
                        s.kind.value,
                        s.code,
                        s.gpu.index,
                        s.gpu.uuid,
                        s.gpu.pci_bus_id,
                        s.value,
                        s.message,
                        s.source,
                        s.observed_at,
                        now,
                        item.incident_id,
                        s.count,
                    ),
                )
                for action in item.actions:
                    self._apply(db, action, now, s.seq, item.held)
            db.execute(
                "UPDATE nodes SET health = ?, state = ?, last_seq = ?, last_heartbeat = ? WHERE node = ?",
                (state.health.value, state_to_json(state), last_seq, now, node),
            )

    def _apply(
        self, db: sqlite3.Connection, action: Action, now: float, seq: int = 0, held: frozenset[str] = frozenset()
    ) -> None:
        if isinstance(action, OpenIncident):
            i = action.incident
            db.execute(
                "INSERT INTO incidents VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                # An incident adopted from a node's annotations (first_seq 0) learns its facts from the
                # replayed signal; its severity and status stay those of the quarantine.
                "ON CONFLICT (id) DO UPDATE SET gpu_index = excluded.gpu_index, gpu_uuid = excluded.gpu_uuid, "
                "pci_bus_id = excluded.pci_bus_id, kind = excluded.kind, code = excluded.code, "
                "first_message = excluded.first_message, first_seq = excluded.first_seq, "
                "remedy = excluded.remedy WHERE incidents.first_seq = 0",
                (
                    i.id,
                    i.node,
                    i.gpu.index,
                    i.gpu.uuid,
                    i.gpu.pci_bus_id,
                    i.kind.value,
                    i.code,
                    i.severity.value,
                    i.meaning,
                    i.remedy,
                    _status_for(i.severity),
                    action.count,
                    i.first_message,
                    i.first_seq,
                    i.first_observed_at,
                    now,
                    i.opened_at,
                    i.first_observed_at,
                ),
            )
        elif isinstance(action, FoldIntoIncident):
            db.execute(
                "UPDATE incidents SET signal_count = signal_count + ?, last_at = ? WHERE id = ?",
                (action.count, action.at, action.incident_id),
            )
        elif isinstance(action, EscalateIncident):
            db.execute(
                "UPDATE incidents SET signal_count = signal_count + ?, last_at = ?, severity = ?, status = ? "
                "WHERE id = ?",
                (action.count, action.at, action.severity.value, _status_for(action.severity), action.incident_id),
            )
        else:
            kind = action_kind(action)
            db.execute(
                "INSERT OR IGNORE INTO actions (incident_id, kind, status, payload, requested_at, seq) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (action.incident_id, kind, "HELD" if kind in held else "PENDING", action_to_json(action), now, seq),
            )

    def add_action(self, action: ExternalAction, now: float, seq: int = 0) -> bool:
        """Record an action the engine itself asks for; False when that incident already has it."""
        with self._tx() as db:
            before = db.total_changes
            self._apply(db, action, now, seq)
            return db.total_changes > before

    def pending_actions(self) -> list[PendingAction]:
        return self._actions_with_status("PENDING")

    def held_actions(self) -> list[PendingAction]:
        return self._actions_with_status("HELD")

    def _actions_with_status(self, status: str) -> list[PendingAction]:
        with self._lock:
            rows = self._db.execute(
                "SELECT incident_id, payload, attempts, seq FROM actions WHERE status = ? ORDER BY requested_at",
                (status,),
            ).fetchall()
        return [PendingAction(r[0], action_from_json(r[1]), r[2], r[3]) for r in rows]

    def set_status(self, keys: Sequence[tuple[str, str]], status: str, detail: str) -> None:
        with self._tx() as db:
            db.executemany(
                "UPDATE actions SET status = ?, detail = ? WHERE incident_id = ? AND kind = ?",
                [(status, detail, i, k) for i, k in keys],
            )

    # Small durable facts: the breaker's state, the pager's thread ids --------------------------

    def get_meta(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return str(row[0]) if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, value)
            )

    def record_operator_action(
        self, what: str, node: str, requested_by: str, reason: str, detail: str, now: float
    ) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO operator_actions VALUES (?, ?, ?, ?, ?, ?)",
                (now, what, node, requested_by, reason, detail),
            )

    def operator_actions(self) -> list[tuple[float, str, str, str, str, str]]:
        with self._lock:
            return list(self._db.execute("SELECT * FROM operator_actions ORDER BY at").fetchall())

    def adopt_quarantine(self, node: str, incident_id: str, reason: str, at: float, now: float) -> bool:
        """Record a quarantine found on the cluster (made by an earlier leader); True if it was new here.

        Its actions are not recorded here: the engine asks for them again (idempotently), which also
        finishes a quarantine that the earlier leader left half-written."""
        with self._tx() as db:
            new = db.execute(
                "INSERT OR IGNORE INTO incidents (id, node, gpu_index, gpu_uuid, pci_bus_id, kind, code, severity, "
                "meaning, remedy, status, signal_count, first_message, first_seq, first_observed_at, received_at, "
                "opened_at, last_at) "
                "VALUES (?, ?, -1, '', '', 'XID', 0, 'QUARANTINE', ?, '', 'OPEN', 1, ?, 0, ?, ?, ?, ?)",
                (incident_id, node, reason, "adopted from the node's Vigil annotations", at, now, at, at),
            ).rowcount
        return new == 1

    def finish_action(self, incident_id: str, kind: str, status: str, detail: str, now: float) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE actions SET status = ?, detail = ?, done_at = ?, attempts = attempts + 1 "
                "WHERE incident_id = ? AND kind = ?",
                (status, detail, now, incident_id, kind),
            )

    def count_attempt(self, incident_id: str, kind: str, detail: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE actions SET attempts = attempts + 1, detail = ? WHERE incident_id = ? AND kind = ?",
                (detail, incident_id, kind),
            )

    def resolve_incidents(self, node: str, now: float) -> int:
        with self._tx() as db:
            return db.execute(
                "UPDATE incidents SET status = 'RESOLVED', last_at = ? WHERE node = ? AND status = 'OPEN'", (now, node)
            ).rowcount

    # The local actuator's record of what it took out of service ------------------------------

    def record_quarantine(self, node: str, incident_id: str, reason: str, now: float) -> bool:
        """True when this call quarantined the node; False when it already was (idempotent)."""
        with self._tx() as db:
            return (
                db.execute(
                    "INSERT OR IGNORE INTO quarantines VALUES (?, ?, ?, ?)", (node, incident_id, reason, now)
                ).rowcount
                == 1
            )

    def release_quarantine(self, node: str) -> str | None:
        with self._tx() as db:
            row = db.execute("SELECT incident_id FROM quarantines WHERE node = ?", (node,)).fetchone()
            db.execute("DELETE FROM quarantines WHERE node = ?", (node,))
        return str(row[0]) if row else None

    def quarantined_nodes(self) -> dict[str, str]:
        with self._lock:
            return dict(self._db.execute("SELECT node, incident_id FROM quarantines").fetchall())

    def record_check_result(
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
        with self._tx() as db:
            db.execute(
                "INSERT INTO check_results VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (request_id, node, check, verdict, reason, json.dumps(figures), started_at, finished_at),
            )

    def record_sweep(self, sweep_id: str, requested_by: str, started: float, finished: float, summary: str) -> None:
        """A finished sweep: its summary (JSON), next to its checks' results in check_results."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO sweeps VALUES (?, ?, ?, ?, ?)",
                (sweep_id, requested_by, started, finished, summary),
            )

    def sweep_summary(self, sweep_id: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT summary FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
        return str(row[0]) if row else None

    # Reading --------------------------------------------------------------------------------

    def incidents(self, open_only: bool = False, node: str = "", limit: int = 100) -> list[IncidentView]:
        where, args = ["1 = 1"], []
        if open_only:
            where.append("status = 'OPEN'")
        if node:
            where.append("node = ?")
            args.append(node)
        with self._lock:
            rows = self._db.execute(
                "SELECT id, node, gpu_index, gpu_uuid, pci_bus_id, kind, code, severity, meaning, remedy, "
                "status, signal_count, first_message, first_observed_at, received_at, opened_at "
                f"FROM incidents WHERE {' AND '.join(where)} ORDER BY opened_at DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
            views = [IncidentView(r[0], r[1], GpuRef(r[2], r[3], r[4]), *r[5:]) for r in rows]
            for view in views:
                for a in self._db.execute(
                    "SELECT kind, status, requested_at, done_at, detail FROM actions WHERE incident_id = ? "
                    "ORDER BY requested_at, kind",
                    (view.id,),
                ):
                    view.actions.append(ActionView(a[0], a[1], a[2], a[3], a[4] or ""))
        return views

    def latest_open_incidents(self) -> dict[str, str]:
        """node -> the id of its most recently opened OPEN incident."""
        with self._lock:
            rows = self._db.execute(
                "SELECT node, id FROM incidents WHERE status = 'OPEN' ORDER BY opened_at"
            ).fetchall()
        return {node: incident for node, incident in rows}  # later rows win

    def signal_counts(self, incident_ids: Sequence[str]) -> dict[str, int]:
        """How many signals each of these incidents has folded in (the first one included)."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT id, signal_count FROM incidents WHERE id IN ({', '.join('?' * len(incident_ids))})",
                tuple(incident_ids),
            ).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def signal_count(self, node: str) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM signals WHERE node = ?", (node,)).fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _status_for(severity: Severity) -> str:
    return "RECORDED" if severity is Severity.RECORD else "OPEN"
