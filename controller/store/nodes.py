"""The nodes the controller knows: each one's state, its agent's spool and the last seq received."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from controller.store.database import Database, Tx
from controller.vocab.node_state import NodeState, state_from_json, state_to_json

SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
  node TEXT PRIMARY KEY, health TEXT NOT NULL, state TEXT NOT NULL, spool_id TEXT NOT NULL DEFAULT '',
  last_seq INTEGER NOT NULL DEFAULT 0, last_heartbeat REAL NOT NULL DEFAULT 0, gpus INTEGER NOT NULL DEFAULT 0,
  expected_gpus INTEGER NOT NULL DEFAULT 0);
"""


@dataclass(frozen=True, slots=True)
class NodeRow:
    state: NodeState
    spool_id: str
    last_seq: int
    gpus: int
    expected_gpus: int = 0  # the most GPUs the node has ever reported: fewer is a fault


class NodeTable:
    def __init__(self, db: Database) -> None:
        self._db = db
        db.add_column("nodes", "expected_gpus", "INTEGER NOT NULL DEFAULT 0")
        db.create(SCHEMA)

    def load(self) -> dict[str, NodeRow]:
        rows = self._db.read("SELECT node, state, spool_id, last_seq, gpus, expected_gpus FROM nodes")
        return {r[0]: NodeRow(state_from_json(r[1], r[0]), r[2], r[3], r[4], r[5]) for r in rows}

    def register(
        self, state: NodeState, spool_id: str, last_seq: int, gpus: int, now: float, expected_gpus: int = 0
    ) -> None:
        """An agent's Hello, lazily durable: its ack awaits the group commit."""
        with self._db.tx(durable=False) as db:
            db.execute(
                "INSERT INTO nodes (node, health, state, spool_id, last_seq, last_heartbeat, gpus, expected_gpus) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (node) DO UPDATE SET health = excluded.health, "
                "state = excluded.state, spool_id = excluded.spool_id, last_seq = excluded.last_seq, "
                "last_heartbeat = excluded.last_heartbeat, gpus = excluded.gpus, "
                "expected_gpus = excluded.expected_gpus",
                (state.node, state.health.value, state_to_json(state), spool_id, last_seq, now, gpus, expected_gpus),
            )

    def save(self, states: Sequence[NodeState], durable: bool = True) -> None:
        with self._db.tx(durable) as db:
            NodeTable.put_states(db, states)

    @staticmethod
    def put_states(db: Tx, states: Sequence[NodeState]) -> None:
        """Within a transaction of the caller's (an action's outcome, so the two are stored together)."""
        db.executemany(
            "UPDATE nodes SET health = ?, state = ? WHERE node = ?",
            [(s.health.value, state_to_json(s), s.node) for s in states],
        )

    @staticmethod
    def received(db: Tx, state: NodeState, last_seq: int, now: float) -> None:
        """In a batch's transaction: the node's new state and the last seq received from its agent."""
        db.execute(
            "UPDATE nodes SET health = ?, state = ?, last_seq = ?, last_heartbeat = ? WHERE node = ?",
            (state.health.value, state_to_json(state), last_seq, now, state.node),
        )
