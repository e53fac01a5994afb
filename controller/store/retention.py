"""Retention: the database does not grow forever.

What is finished and older than the retention period goes: incidents no longer open (resolved or
only recorded) with their signals and their settled actions; signals of no open incident; check
results, sweeps and operators' requests. An open incident, its signals and any action not settled
(PENDING, HELD) stay whatever their age. A node's quarantine history (for repeat offenders) lives
in its state and is bounded there. Each pass deletes at most ``limit`` incidents and ``limit`` rows
of signals, so a pass over a large backlog never holds the event loop for long (check results,
sweeps and operators' requests are few: each pass takes all that are due).
"""

from __future__ import annotations

from controller.store.database import Database

SETTLED = ("DONE", "SKIPPED", "FAILED")


def prune(db: Database, before: float, limit: int = 5000) -> dict[str, int]:
    """Delete what finished before ``before``; returns how many rows of each kind went."""
    gone: dict[str, int] = {}
    with db.tx() as c:
        ids = [
            str(r[0])
            for r in c.execute(
                "SELECT id FROM incidents WHERE status != 'OPEN' AND last_at < ? LIMIT ?", (before, limit)
            ).fetchall()
        ]
        if ids:
            among = f"incident_id IN ({', '.join('?' * len(ids))})"
            settled = f"status IN ({', '.join('?' * len(SETTLED))})"
            gone["actions"] = c.execute(f"DELETE FROM actions WHERE {settled} AND {among}", (*SETTLED, *ids)).rowcount
            gone["signals"] = c.execute(f"DELETE FROM signals WHERE {among}", ids).rowcount
            gone["incidents"] = c.execute(
                f"DELETE FROM incidents WHERE id IN ({', '.join('?' * len(ids))})", ids
            ).rowcount
        gone["signals"] = (
            gone.get("signals", 0)
            + c.execute(
                "DELETE FROM signals WHERE (node, spool_id, seq) IN (SELECT s.node, s.spool_id, s.seq FROM signals s "
                "LEFT JOIN incidents i ON i.id = s.incident_id WHERE s.received_at < ? "
                "AND (i.id IS NULL OR i.status != 'OPEN') LIMIT ?)",
                (before, limit),
            ).rowcount
        )
        for table, column in (("check_results", "finished_at"), ("sweeps", "finished_at"), ("operator_actions", "at")):
            gone[table] = c.execute(f"DELETE FROM {table} WHERE {column} < ?", (before,)).rowcount
    return {k: v for k, v in gone.items() if v}
