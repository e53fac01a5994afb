"""Signals received and the incidents they opened or folded into.

Signals are deduplicated by ``(node, spool_id, seq)``: a batch the agent replays after a lost
acknowledgement adds nothing. The writes take the caller's transaction (a received batch commits
its signals with its incidents, its actions and the node's state); the reads are for status views.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from controller.store.database import Database, Tx
from controller.vocab.actions import EscalateIncident, FoldIntoIncident, OpenIncident, ResolveIncident
from controller.vocab.held import Held
from controller.vocab.policy import Severity
from vigil_core.signals import GpuRef, Signal, SignalKind

SCHEMA = """
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
CREATE TABLE IF NOT EXISTS held_signals (
  node TEXT NOT NULL, spool_id TEXT NOT NULL, seq INTEGER NOT NULL, decide_at REAL NOT NULL,
  PRIMARY KEY (node, spool_id, seq));
"""


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


def status_for(severity: Severity) -> str:
    return "RECORDED" if severity is Severity.RECORD else "OPEN"


class IncidentLog:
    def __init__(self, db: Database) -> None:
        self._db = db
        db.add_column("signals", "count", "INTEGER NOT NULL DEFAULT 1")  # a storm folded at the agent
        db.create(SCHEMA)

    # Writes, in the caller's transaction ------------------------------------------------------

    @staticmethod
    def held(db: Tx, held: Sequence[Held], gone: Sequence[Held]) -> None:
        """Application XIDs held for their job's other nodes (``controller.nodes.app_faults``), and
        those no longer held (decided, or claimed by the job's crash)."""
        for h in held:
            db.execute(
                "INSERT INTO held_signals VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (h.signal.node, h.spool_id, h.signal.seq, h.decide_at),
            )
        for h in gone:
            db.execute(
                "DELETE FROM held_signals WHERE node = ? AND spool_id = ? AND seq = ?",
                (h.signal.node, h.spool_id, h.signal.seq),
            )

    @staticmethod
    def signal(db: Tx, node: str, spool_id: str, s: Signal, incident_id: str, now: float) -> None:
        db.execute(
            "INSERT INTO signals VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
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
                incident_id,
                s.count,
            ),
        )

    @staticmethod
    def open(db: Tx, action: OpenIncident, now: float) -> None:
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
                status_for(i.severity),
                action.count,
                i.first_message,
                i.first_seq,
                i.first_observed_at,
                now,
                i.opened_at,
                i.first_observed_at,
            ),
        )

    @staticmethod
    def fold(db: Tx, action: FoldIntoIncident) -> None:
        db.execute(
            "UPDATE incidents SET signal_count = signal_count + ?, last_at = ? WHERE id = ?",
            (action.count, action.at, action.incident_id),
        )

    @staticmethod
    def escalate(db: Tx, action: EscalateIncident) -> None:
        db.execute(
            "UPDATE incidents SET signal_count = signal_count + ?, last_at = ?, severity = ?, status = ? WHERE id = ?",
            (action.count, action.at, action.severity.value, status_for(action.severity), action.incident_id),
        )

    @staticmethod
    def resolved(db: Tx, action: ResolveIncident) -> None:
        db.execute(
            "UPDATE incidents SET status = 'RESOLVED', last_at = ? WHERE id = ? AND status = 'OPEN'",
            (action.at, action.incident_id),
        )

    # Writes, each its own transaction ---------------------------------------------------------

    def adopt(self, node: str, incident_id: str, reason: str, at: float, now: float) -> bool:
        """Record a quarantine found on the cluster (made by an earlier leader); True if it was new here.

        Its actions are not recorded here: the engine asks for them again (idempotently), which also
        finishes a quarantine that the earlier leader left half-written."""
        with self._db.tx() as db:
            new = db.execute(
                "INSERT INTO incidents (id, node, gpu_index, gpu_uuid, pci_bus_id, kind, code, severity, "
                "meaning, remedy, status, signal_count, first_message, first_seq, first_observed_at, received_at, "
                "opened_at, last_at) "
                "VALUES (?, ?, -1, '', '', 'XID', 0, 'QUARANTINE', ?, '', 'OPEN', 1, ?, 0, ?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                (incident_id, node, reason, "adopted from the node's Vigil annotations", at, now, at, at),
            ).rowcount
        return new == 1

    def resolve_one(self, incident_id: str, now: float) -> bool:
        """One OPEN incident resolved; False when there is no open incident of that id."""
        with self._db.tx() as db:
            return (
                db.execute(
                    "UPDATE incidents SET status = 'RESOLVED', last_at = ? WHERE id = ? AND status = 'OPEN'",
                    (now, incident_id),
                ).rowcount
                == 1
            )

    def resolve(self, node: str, now: float) -> int:
        with self._db.tx() as db:
            return db.execute(
                "UPDATE incidents SET status = 'RESOLVED', last_at = ? WHERE node = ? AND status = 'OPEN'", (now, node)
            ).rowcount

    # Reads ------------------------------------------------------------------------------------

    def list(self, open_only: bool = False, node: str = "", limit: int = 100) -> list[IncidentView]:
        """The latest incidents, newest first, each with the actions taken for it."""
        where, args = ["1 = 1"], []
        if open_only:
            where.append("status = 'OPEN'")
        if node:
            where.append("node = ?")
            args.append(node)
        rows = self._db.read(
            "SELECT id, node, gpu_index, gpu_uuid, pci_bus_id, kind, code, severity, meaning, remedy, "
            "status, signal_count, first_message, first_observed_at, received_at, opened_at "
            f"FROM incidents WHERE {' AND '.join(where)} ORDER BY opened_at DESC LIMIT ?",
            (*args, limit),
        )
        views = [IncidentView(r[0], r[1], GpuRef(r[2], r[3], r[4]), *r[5:]) for r in rows]
        for view in views:
            for a in self._db.read(
                "SELECT kind, status, requested_at, done_at, detail FROM actions WHERE incident_id = ? "
                "ORDER BY requested_at, kind",
                (view.id,),
            ):
                view.actions.append(ActionView(a[0], a[1], a[2], a[3], a[4] or ""))
        return views

    def get(self, incident_id: str) -> tuple[str, str] | None:
        """(node, status) of an incident; None when there is none of that id."""
        rows = self._db.read("SELECT node, status FROM incidents WHERE id = ?", (incident_id,))
        return (str(rows[0][0]), str(rows[0][1])) if rows else None

    def faults_of(self, incident_ids: Sequence[str]) -> dict[str, tuple[str, int]]:
        """Incident id -> the (kind, code) of the fault that opened it."""
        if not incident_ids:
            return {}
        marks = ", ".join("?" * len(incident_ids))
        rows = self._db.read(f"SELECT id, kind, code FROM incidents WHERE id IN ({marks})", tuple(incident_ids))
        return {str(i): (str(kind), int(code or 0)) for i, kind, code in rows}

    def decisions(self) -> tuple[tuple[str, str, str, int, str, float], ...]:
        """(incident, node, kind, code, action kind, done at) of every quarantine (not a dry run) and
        page carried out for a node's incident."""
        rows = self._db.read(
            "SELECT i.id, i.node, i.kind, i.code, a.kind, a.done_at FROM incidents i JOIN actions a "
            "ON a.incident_id = i.id WHERE a.status = 'DONE' AND (a.kind = 'QUARANTINE' OR a.kind LIKE 'PAGE%') "
            "AND a.detail NOT LIKE 'dry run%' ORDER BY a.done_at"
        )
        return tuple((str(r[0]), str(r[1]), str(r[2]), int(r[3] or 0), str(r[4]), float(r[5] or 0.0)) for r in rows)

    def still_held(self) -> Sequence[Held]:
        """The application XIDs an earlier controller held and did not decide, oldest first."""
        rows = self._db.read(
            "SELECT h.decide_at, s.spool_id, s.node, s.kind, s.code, s.gpu_index, s.gpu_uuid, s.pci_bus_id, "
            "s.value, s.message, s.source, s.observed_at, s.seq, s.count FROM held_signals h JOIN signals s "
            "ON s.node = h.node AND s.spool_id = h.spool_id AND s.seq = h.seq ORDER BY h.decide_at"
        )
        return [
            Held(at, spool, Signal(node, SignalKind(kind), GpuRef(i, uuid, bus), code, value, msg, src, obs, seq, n))
            for at, spool, node, kind, code, i, uuid, bus, value, msg, src, obs, seq, n in rows
        ]

    def latest_open(self) -> dict[str, str]:
        """node -> the id of its most recently opened OPEN incident."""
        rows = self._db.read("SELECT node, id FROM incidents WHERE status = 'OPEN' ORDER BY opened_at")
        return {node: incident for node, incident in rows}  # later rows win

    def signal_counts(self, incident_ids: Sequence[str]) -> dict[str, int]:
        """How many signals each of these incidents has folded in (the first one included)."""
        rows = self._db.read(
            f"SELECT id, signal_count FROM incidents WHERE id IN ({', '.join('?' * len(incident_ids))})",
            tuple(incident_ids),
        )
        return {r[0]: int(r[1]) for r in rows}

    def signals_from(self, node: str) -> int:
        """How many signal rows the node has (a storm folded at its agent is one row)."""
        return int(self._db.read("SELECT COUNT(*) FROM signals WHERE node = ?", (node,))[0][0])
