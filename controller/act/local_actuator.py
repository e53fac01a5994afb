"""The local actuator: the demo's cluster has no Kubernetes, so a quarantine is a row in the
controller's database (its own table, beside the incident store's), and releasing it deletes it."""

from __future__ import annotations

import time

from controller.act.actuators import FoundQuarantine, Release, SelectionError
from controller.store import Database
from controller.vocab.actions import Drain, Quarantine

SCHEMA = """
CREATE TABLE IF NOT EXISTS quarantines (
  node TEXT PRIMARY KEY, incident_id TEXT NOT NULL, reason TEXT, at REAL NOT NULL);
"""

_NEED_KUBE = "needs the kubernetes actuator (this controller runs the local one: no labels, no pods)"


class LocalQuarantines:
    """What the local actuator took out of service: node -> the incident that did."""

    def __init__(self, db: Database) -> None:
        self._db = db
        db.create(SCHEMA)

    def add(self, node: str, incident_id: str, reason: str, now: float) -> bool:
        """True when this call quarantined the node; False when it already was (idempotent)."""
        with self._db.tx() as db:
            inserted = db.execute(
                "INSERT INTO quarantines VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING", (node, incident_id, reason, now)
            ).rowcount
        return inserted == 1

    def remove(self, node: str) -> str | None:
        """Release the node; returns the incident that had quarantined it, None if none had."""
        with self._db.tx() as db:
            row = db.execute("SELECT incident_id FROM quarantines WHERE node = ?", (node,)).fetchone()
            db.execute("DELETE FROM quarantines WHERE node = ?", (node,))
        return str(row[0]) if row else None

    def nodes(self) -> dict[str, str]:
        return {
            str(node): str(incident) for node, incident in self._db.read("SELECT node, incident_id FROM quarantines")
        }


class LocalActuator:
    quarantine_means = "a quarantine in the controller's own table"

    def __init__(self, db: Database, labels: dict[str, dict[str, str]] | None = None) -> None:
        self.quarantines = LocalQuarantines(db)
        self._labels = labels or {}  # no Node objects here: the configuration's node_labels

    def quarantine(self, action: Quarantine) -> str:
        done = self.quarantines.add(action.node, action.incident_id, action.reason, time.time())
        return "quarantined (local)" if done else "already quarantined (local)"

    def release(self, node: str, reason: str) -> Release:
        owner = self.quarantines.remove(node)
        if owner is None:
            return Release(False, "not quarantined by Vigil: left as it is")
        return Release(True, f"released (local; was incident {owner})")

    def adopt(self) -> list[FoundQuarantine]:
        return []

    def node_labels(self) -> dict[str, dict[str, str]]:
        return {node: dict(labels) for node, labels in self._labels.items()}

    def close(self) -> None:
        pass  # holds nothing besides the store's table

    def drain(self, action: Drain) -> str:
        return "nothing to drain (local actuator: no pods)"

    def nodes_matching(self, selector: str) -> list[str]:
        raise SelectionError(f"label selectors {_NEED_KUBE}")

    def job_nodes(self, namespace: str, job: str) -> list[str]:
        raise SelectionError(f"choosing a Job's nodes {_NEED_KUBE}")

    # What a repair asks (controller.repairs) --------------------------------------------------

    def held_by_others(self, node: str) -> str:
        return ""  # no Node objects here: nobody else can cordon one

    def set_labels(self, node: str, labels: dict[str, str | None]) -> dict[str, str | None]:
        current = self._labels.setdefault(node, {})
        before = {key: current.get(key) for key in labels}
        for key, value in labels.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value
        return before

    def operand_pods(self, node: str) -> list[str]:
        return []  # no pods here
