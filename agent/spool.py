"""The durable spool: every signal is numbered and written here before it is sent.

SQLite with ``synchronous=FULL``: once ``append`` returns, the signal survives an agent crash or a
power cut. The controller acknowledges by sequence number and acknowledged signals are deleted.
Sequence numbers never go back, even when the spool is empty; a new spool file gets a new
``spool_id`` so the controller can tell a reimaged node from a replay.

Collectors' cursors (the kernel log's last record, the GPU fault baseline, the storm folder's held
repeats) are written in the same transaction as the signals they produced, so a restarted agent
resumes exactly where the spool is: nothing it observed is lost, and nothing is reported twice.

The bound. Only signals *waiting to be sent* count toward ``max_signals``. A signal once handed to
the link (``take``) is never changed, merged or dropped again, on this stream or any later one: the
controller may hold it already (its ack lost with a broken stream), and a count merged into a copy
it holds would be acknowledged and deleted unseen. ``handed_upto`` marks them; it never goes back,
and a reopened spool starts it at its last signal (an earlier process may have sent any of them).
Past the bound, in this order, until the waiting signals are back under 90 % of it:

1. repeats are merged: the waiting signals of one GPU, kind and code become the oldest *waiting*
   one with their counts added up (nothing is lost; only the times between first and last are);
2. the oldest low-severity signals (throttling, counter growth) are dropped;
3. the oldest other faults are dropped, except those the default policy quarantines on
   (``Signal.must_keep``: XID 48, 79, a double-bit ECC error...), which are the root cause a flood
   of follow-up errors would otherwise bury;
4. only past ``4 × max_signals`` are must-keep faults dropped too, the newest first.

Every dropped observation is counted exactly (a merged signal counts as many as it stands for):
``dropped`` per kind in this process, ``dropped_total`` (every kind) and ``dropped_faults`` durably;
the agent reports ``dropped_faults`` in every heartbeat, and each drop is logged (at most every
``DROP_LOG_EVERY_S`` for one spool, with the totals since the last line).

Damage. A spool SQLite cannot read is moved aside (``<spool>.damaged-<time>``) and a new one started;
a spool that is empty where ``<spool>.id`` says another one was (truncated, deleted, its WAL lost) is
noticed too. Either way ``damage`` says what happened and how much may be lost, and the agent sends
it to the controller as a SPOOL_LOST signal, first thing.
"""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from protos.codec import signal_from_proto, signal_to_proto
from protos.vigil.v1 import common_pb2
from vigil_core.signals import LOW_SEVERITY_KINDS, STATE_KINDS, Signal

log = structlog.get_logger(__name__)
FAULT_BOUND_FACTOR = 4
LOW_WATER = 0.9  # a bound enforced down to this fraction, so it is not enforced again at every append
DROP_LOG_EVERY_S = 10.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS signals (seq INTEGER PRIMARY KEY, payload BLOB NOT NULL);
"""
_COLUMNS = {  # added to a spool written by an older agent; its rows are treated as faults to keep
    "kind": "TEXT NOT NULL DEFAULT 'XID'",
    "fold_key": "TEXT NOT NULL DEFAULT ''",
    "keep": "INTEGER NOT NULL DEFAULT 1",
    "count": "INTEGER NOT NULL DEFAULT 1",
}
_LOW = ", ".join(f"'{k.value}'" for k in sorted(LOW_SEVERITY_KINDS))


@dataclass(frozen=True, slots=True)
class Stored:
    """A spooled signal as the spool keeps it: its number and its bytes (a ``vigil.v1.Signal``),
    which the link puts on the wire as they are."""

    seq: int
    payload: bytes

    def signal(self) -> Signal:
        return signal_from_proto(common_pb2.Signal.FromString(self.payload))


class SpoolError(Exception):
    """The spool cannot be used at all (its directory is not writable); the text names the path."""


_INSERT = "INSERT INTO signals (seq, payload, kind, fold_key, keep, count) VALUES (?, ?, ?, ?, ?, ?)"


def _row(s: Signal) -> tuple[int, bytes, str, str, int, int]:
    fold_key = "" if s.kind in STATE_KINDS else "|".join(map(str, s.fold_key))
    return (s.seq, signal_to_proto(s).SerializeToString(), s.kind.value, fold_key, int(s.must_keep), s.count)


class Spool:
    def __init__(self, path: Path, max_signals: int = 20_000, node: str = "") -> None:
        self.path = path
        self.max_signals = max_signals
        self.damage = ""  # what happened to the spool that was here before; "" when nothing
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpoolError(f"cannot create the spool's directory {path.parent}: {exc.strerror}") from None
        try:
            self._db = _open(path)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and "unable to open" in str(exc):
                raise SpoolError(f"cannot open the spool {path}: {exc}") from None
            self.damage = _move_aside(path, exc, time.time())
            self._db = _open(path)
        if node and (owner := _owner(self._db)) not in ("", node):
            # Another node's spool (a cloned disk, a renamed node): the controller would refuse every
            # signal in it as that node's, for good. Set aside, said, and a spool of this node's own.
            self._db.close()
            self.damage = _move_aside(
                path, SpoolError(f"it is node {owner!r}'s spool, this agent is {node!r}"), time.time()
            )
            self._db = _open(path)
        self.dropped: Counter[str] = Counter()  # kind -> observations dropped to keep the bound
        self.merged = 0  # signals merged into an earlier repeat (nothing lost)
        self._unlogged: Counter[str] = Counter()  # dropped since the last log line
        self._drop_logged_at = float("-inf")
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            created = self._db.execute(
                "INSERT OR IGNORE INTO meta VALUES ('spool_id', ?)", (uuid.uuid4().hex,)
            ).rowcount
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('next_seq', '1'), ('acked_seq', '0')")
            if node:
                self._db.execute("INSERT OR IGNORE INTO meta VALUES ('node', ?)", (node,))
        self.spool_id = self._meta("spool_id")
        # Whatever an earlier process numbered it may have sent: never changed again.
        self.handed_upto = self.last_seq
        self._check_identity(bool(created))

    def _check_identity(self, created: bool) -> None:
        """``<spool>.id`` names the spool that lives at this path; a new spool where it names another
        means that one was lost without SQLite noticing (truncated to zero, deleted, its WAL lost)."""
        marker = self.path.with_name(self.path.name + ".id")
        try:
            previous = marker.read_text().strip()
        except OSError:
            previous = ""
        if created and previous and previous != self.spool_id and not self.damage:
            self.damage = (
                f"spool {self.path} was empty or missing, but spool {previous} had been there (truncated, "
                "deleted, or its write-ahead log lost): an unknown number of unacknowledged signals are lost"
            )
        if previous != self.spool_id:
            tmp = marker.with_name(marker.name + ".tmp")
            tmp.write_text(self.spool_id + "\n")
            os.replace(tmp, marker)
        if self.damage:
            log.error("spool_damaged", path=str(self.path), damage=self.damage, spool_id=self.spool_id)

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
        """Fault observations dropped to keep the bound, ever (low severity apart): durable."""
        return self._counter("dropped_faults")

    @property
    def dropped_total(self) -> int:
        """Observations of every kind dropped to keep the bound, ever: durable."""
        return self._counter("dropped_total")

    def _counter(self, key: str) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return int(row[0]) if row else 0

    def cursor(self, name: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (f"cursor:{name}",)).fetchone()
        return str(row[0]) if row else None

    def append(
        self,
        signals: Sequence[Signal],
        cursors: Mapping[str, str] | None = None,
        lost: Mapping[str, int] | None = None,
    ) -> list[Signal]:
        """Number and store signals, and the cursors that produced them, in one transaction;
        returns the signals with their ``seq``. ``lost`` (kind -> observations) is what the caller
        had to drop before it could write here (the spool was failing): counted with the rest."""
        if not signals and not cursors and not lost:
            return []
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            if lost:
                self._count_dropped(Counter(lost))
            first = int(self._meta("next_seq"))
            numbered = [s.numbered(first + i) for i, s in enumerate(signals)]
            self._db.executemany(_INSERT, [_row(s) for s in numbered])
            self._db.execute("UPDATE meta SET value = ? WHERE key = 'next_seq'", (str(first + len(numbered)),))
            self._db.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)", [(f"cursor:{k}", v) for k, v in (cursors or {}).items()]
            )
            if numbered and self.waiting() > self.max_signals:
                self._enforce_bound()
        return numbered

    # The bound ------------------------------------------------------------------------------------

    def waiting(self) -> int:
        """Signals never handed to the link: what the bound applies to."""
        return int(self._db.execute("SELECT COUNT(*) FROM signals WHERE seq > ?", (self.handed_upto,)).fetchone()[0])

    def _enforce_bound(self) -> None:
        after = self.handed_upto
        target = int(self.max_signals * LOW_WATER)
        self._merge_repeats(after)
        excess = self.waiting() - target
        if excess > 0:
            self._drop(
                "SELECT seq, kind, count FROM signals WHERE seq > ? AND keep = 0 "
                f"ORDER BY kind NOT IN ({_LOW}), seq LIMIT ?",
                (after, excess),
            )
        excess = self.waiting() - FAULT_BOUND_FACTOR * self.max_signals
        if excess > 0:
            self._drop("SELECT seq, kind, count FROM signals WHERE seq > ? ORDER BY seq DESC LIMIT ?", (after, excess))

    def _merge_repeats(self, after: int) -> None:
        keys = [
            row[0]
            for row in self._db.execute(
                "SELECT fold_key FROM signals WHERE seq > ? AND fold_key != '' GROUP BY fold_key HAVING COUNT(*) > 1",
                (after,),
            )
        ]
        for key in keys:
            rows = self._db.execute(
                "SELECT seq, payload FROM signals WHERE seq > ? AND fold_key = ? ORDER BY seq", (after, key)
            ).fetchall()
            signals = [signal_from_proto(common_pb2.Signal.FromString(payload)) for _, payload in rows]
            total = sum(s.count for s in signals)
            first = min((s.first_observed_at or s.observed_at) for s in signals)
            head = signals[0]
            merged = replace(
                head,
                count=total,
                first_observed_at=first,
                observed_at=max(s.observed_at for s in signals),
                value=max(s.value for s in signals),
            )
            self._db.execute(
                "UPDATE signals SET payload = ?, count = ? WHERE seq = ?",
                (signal_to_proto(merged).SerializeToString(), total, head.seq),
            )
            self._db.executemany("DELETE FROM signals WHERE seq = ?", [(seq,) for seq, _ in rows[1:]])
            self.merged += len(rows) - 1

    def _drop(self, query: str, args: tuple[int, int]) -> None:
        """Delete the rows the query names, and count what they stood for."""
        rows = self._db.execute(query, args).fetchall()
        self._db.executemany("DELETE FROM signals WHERE seq = ?", [(seq,) for seq, _, _ in rows])
        self._count_dropped(_sum(rows))

    def _count_dropped(self, lost: Counter[str]) -> None:
        """Count observations dropped (durably, inside the caller's transaction) and say so."""
        lost = +lost
        if not lost:
            return
        faults = sum(n for kind, n in lost.items() if kind not in _LOW_KINDS)
        for key, n in (("dropped_total", sum(lost.values())), ("dropped_faults", faults)):
            if n:
                self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, str(self._counter(key) + n)))
        self.dropped.update(lost)
        self._unlogged.update(lost)
        now = time.monotonic()
        if now - self._drop_logged_at >= DROP_LOG_EVERY_S:
            self._drop_logged_at = now
            faults_since = sum(n for kind, n in self._unlogged.items() if kind not in _LOW_KINDS)
            say = log.error if faults_since else log.warning
            say(
                "spool_dropped",
                path=str(self.path),
                bound=self.max_signals,
                dropped_since_last_line=dict(self._unlogged),
                dropped_total=self._counter("dropped_total"),
                dropped_faults_total=self._counter("dropped_faults"),
            )
            self._unlogged.clear()

    # Delivery -------------------------------------------------------------------------------------

    def pending(self, after_seq: int, limit: int = 500) -> list[Signal]:
        """Read the signals after ``after_seq`` (for a look: nothing is marked)."""
        return [stored.signal() for stored in self._stored(after_seq, limit)]

    def take(self, after_seq: int, limit: int = 500) -> list[Stored]:
        """The signals after ``after_seq`` for the link to send, as stored (no decoding), marked handed
        before they are returned: from here on the bound never merges into them, merges them away or
        drops them."""
        batch = self._stored(after_seq, limit)
        if batch:
            self.handed_upto = max(self.handed_upto, batch[-1].seq)
        return batch

    def _stored(self, after_seq: int, limit: int) -> list[Stored]:
        rows = self._db.execute(
            "SELECT seq, payload FROM signals WHERE seq > ? ORDER BY seq LIMIT ?", (after_seq, limit)
        ).fetchall()
        return [Stored(int(seq), bytes(payload)) for seq, payload in rows]

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

    def renumber_after(self, seq: int) -> int:
        """The controller holds this spool's signals up to ``seq``, beyond what the spool numbered: the
        spool went back in time (its write-ahead log lost after a checkpoint). Its waiting signals
        would be taken for replays and ignored, so they are numbered again after ``seq``; returns
        how many. Whatever the lost part of the spool held is gone, and said so."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            rows = self._db.execute("SELECT seq, payload FROM signals ORDER BY seq").fetchall()
            self._db.execute("DELETE FROM signals")
            for i, (_, payload) in enumerate(rows):
                s = signal_from_proto(common_pb2.Signal.FromString(payload)).numbered(seq + 1 + i)
                self._db.execute(_INSERT, _row(s))
            self._db.execute("UPDATE meta SET value = ? WHERE key = 'next_seq'", (str(seq + 1 + len(rows)),))
            self._db.execute("UPDATE meta SET value = ? WHERE key = 'acked_seq'", (str(seq),))
        self.handed_upto = max(self.handed_upto, seq)  # none of the renumbered ones was handed yet
        log.error(
            "spool_went_back",
            path=str(self.path),
            controller_holds=seq,
            renumbered=len(rows),
            detail="the spool lost its latest transactions; signals recorded in them are lost",
        )
        return len(rows)

    def count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM signals").fetchone()[0])

    def urgent_waiting(self) -> int:
        """Signals not acknowledged yet that the bound keeps above all others (``Signal.must_keep``):
        what the agent's Hello says, so that a relay calls it before agents with none."""
        return int(self._db.execute("SELECT COUNT(*) FROM signals WHERE keep = 1").fetchone()[0])

    def close(self) -> None:
        self._db.close()


_LOW_KINDS = frozenset(k.value for k in LOW_SEVERITY_KINDS)


def _sum(rows: list[tuple[int, str, int]]) -> Counter[str]:
    total: Counter[str] = Counter()
    for _, kind, count in rows:
        total[kind] += count
    return total


def _open(path: Path) -> sqlite3.Connection:
    """Open and check the spool; raises sqlite3.DatabaseError when SQLite cannot trust the file."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        problems = [row[0] for row in db.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise sqlite3.DatabaseError("; ".join(problems[:3]))
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(_SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(signals)")}
        for name, spec in _COLUMNS.items():
            if name not in columns:
                db.execute(f"ALTER TABLE signals ADD COLUMN {name} {spec}")
    except sqlite3.DatabaseError:
        db.close()
        raise
    return db


def _owner(db: sqlite3.Connection) -> str:
    """The node a spool was written by ('' for a new spool, or one from before this was recorded)."""
    row = db.execute("SELECT value FROM meta WHERE key = 'node'").fetchone()
    return str(row[0]) if row else ""


def _move_aside(path: Path, error: Exception, now: float) -> str:
    """Move a damaged spool (and its WAL and shared-memory files) aside; says what may be lost."""
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as old:
            waiting = f"{int(old.execute('SELECT COUNT(*) FROM signals').fetchone()[0])}"
    except sqlite3.Error:
        waiting = "an unknown number of"
    aside = path.with_name(f"{path.name}.damaged-{int(now)}")
    for suffix in ("", "-wal", "-shm"):
        source = path.with_name(path.name + suffix)
        if source.exists():
            os.replace(source, aside.with_name(aside.name + suffix))
    return (
        f"spool {path} could not be used ({error}); moved aside to {aside} and a new spool started: "
        f"{waiting} unacknowledged signal(s) it held may be lost"
    )
