"""The durable spool: every signal is numbered and written here before it is sent.

SQLite with ``synchronous=FULL``: once ``append`` returns, the signal survives an agent crash or a
power cut. The controller acknowledges by sequence number and acknowledged signals are deleted.
Sequence numbers never go back, even when the spool is empty; a new spool file gets a new
``spool_id`` so the controller can tell a reimaged node from a replay.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Sequence
from pathlib import Path

from protos.codec import signal_from_proto, signal_to_proto
from protos.vigil.v1 import common_pb2
from vigil.signals import Signal

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS signals (seq INTEGER PRIMARY KEY, payload BLOB NOT NULL);
"""


class Spool:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "INSERT OR IGNORE INTO meta VALUES ('spool_id', ?), ('next_seq', '1'), ('acked_seq', '0')",
                (uuid.uuid4().hex,),
            )
        self.spool_id = self._meta("spool_id")

    def _meta(self, key: str) -> str:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return str(row[0])

    @property
    def acked_seq(self) -> int:
        return int(self._meta("acked_seq"))

    @property
    def last_seq(self) -> int:
        return int(self._meta("next_seq")) - 1

    def append(self, signals: Sequence[Signal]) -> list[Signal]:
        """Number and store signals in one transaction; returns them with their ``seq``."""
        if not signals:
            return []
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            first = int(self._meta("next_seq"))
            numbered = [s.numbered(first + i) for i, s in enumerate(signals)]
            self._db.executemany(
                "INSERT INTO signals (seq, payload) VALUES (?, ?)",
                [(s.seq, signal_to_proto(s).SerializeToString()) for s in numbered],
            )
            self._db.execute("UPDATE meta SET value = ? WHERE key = 'next_seq'", (str(first + len(numbered)),))
        return numbered

    def pending(self, after_seq: int, limit: int = 500) -> list[Signal]:
        rows = self._db.execute(
            "SELECT payload FROM signals WHERE seq > ? ORDER BY seq LIMIT ?", (after_seq, limit)
        ).fetchall()
        return [signal_from_proto(common_pb2.Signal.FromString(row[0])) for row in rows]

    def ack(self, seq: int) -> int:
        """Drop everything up to ``seq``; returns how many signals were dropped."""
        seq = min(seq, self.last_seq)  # an ack beyond what we numbered is not ours to believe
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            if seq <= int(self._meta("acked_seq")):
                return 0
            dropped = self._db.execute("DELETE FROM signals WHERE seq <= ?", (seq,)).rowcount
            self._db.execute("UPDATE meta SET value = ? WHERE key = 'acked_seq'", (str(seq),))
        return int(dropped)

    def count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM signals").fetchone()[0])

    def close(self) -> None:
        self._db.close()
