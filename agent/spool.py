"""The durable spool: every signal is numbered and written here before it is sent.

SQLite with ``synchronous=FULL``: once ``append`` returns, the signal survives an agent crash or a
power cut. The controller acknowledges by sequence number and acknowledged signals are deleted.
Sequence numbers never go back, even when the spool is empty; a new spool file gets a new
``spool_id`` so the controller can tell a reimaged node from a replay.

Collectors' cursors (the kernel log's last record, the GPU fault baseline) are written in the
same transaction as the signals they produced, so a restarted agent resumes exactly where the
spool is: nothing it observed is lost, and nothing is reported twice.

The spool is bounded. Past ``max_signals`` unacknowledged signals (a long controller outage, an
XID flood) the oldest low-severity signals (throttling, counter growth) are dropped first and
counted. Fault signals are kept past that bound; only at ``4 × max_signals`` are the oldest
faults dropped too, and that is counted apart, logged as an error and sent to the controller in
every heartbeat: never silent.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

from protos.codec import signal_from_proto, signal_to_proto
from protos.vigil.v1 import common_pb2
from vigil.signals import LOW_SEVERITY_KINDS, Signal

log = structlog.get_logger(__name__)
FAULT_BOUND_FACTOR = 4

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS signals (seq INTEGER PRIMARY KEY, payload BLOB NOT NULL);
"""
_LOW = ", ".join(f"'{k.value}'" for k in sorted(LOW_SEVERITY_KINDS))


class Spool:
    def __init__(self, path: Path, max_signals: int = 20_000) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.max_signals = max_signals
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(signals)")}
        if "kind" not in columns:  # a spool written before the bound existed: keep it, treat as faults
            self._db.execute("ALTER TABLE signals ADD COLUMN kind TEXT NOT NULL DEFAULT 'XID'")
        self.dropped: Counter[str] = Counter()  # kind -> signals dropped to keep the bound
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

    @property
    def dropped_faults(self) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'dropped_faults'").fetchone()
        return int(row[0]) if row else 0

    def cursor(self, name: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (f"cursor:{name}",)).fetchone()
        return str(row[0]) if row else None

    def append(self, signals: Sequence[Signal], cursors: Mapping[str, str] | None = None) -> list[Signal]:
        """Number and store signals, and the cursors that produced them, in one transaction;
        returns the signals with their ``seq``."""
        if not signals and not cursors:
            return []
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            first = int(self._meta("next_seq"))
            numbered = [s.numbered(first + i) for i, s in enumerate(signals)]
            self._db.executemany(
                "INSERT INTO signals (seq, payload, kind) VALUES (?, ?, ?)",
                [(s.seq, signal_to_proto(s).SerializeToString(), s.kind.value) for s in numbered],
            )
            self._db.execute("UPDATE meta SET value = ? WHERE key = 'next_seq'", (str(first + len(numbered)),))
            self._db.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)", [(f"cursor:{k}", v) for k, v in (cursors or {}).items()]
            )
            if numbered:
                self._enforce_bound()
        return numbered

    def _enforce_bound(self) -> None:
        excess = self.count() - self.max_signals
        if excess <= 0:
            return
        low = self._db.execute(
            f"SELECT seq, kind FROM signals WHERE kind IN ({_LOW}) ORDER BY seq LIMIT ?", (excess,)
        ).fetchall()
        self._drop(low)
        excess = self.count() - FAULT_BOUND_FACTOR * self.max_signals
        if excess > 0:
            faults = self._db.execute("SELECT seq, kind FROM signals ORDER BY seq LIMIT ?", (excess,)).fetchall()
            self._drop(faults)
            total = self.dropped_faults + len(faults)
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('dropped_faults', ?)", (str(total),))
            log.error("spool_dropped_faults", dropped=len(faults), dropped_total=total, bound=self.max_signals)

    def _drop(self, rows: list[tuple[int, str]]) -> None:
        self._db.executemany("DELETE FROM signals WHERE seq = ?", [(seq,) for seq, _ in rows])
        self.dropped.update(kind for _, kind in rows)

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
