"""Retention: the database does not grow forever.

What is finished and older than the retention period goes: incidents no longer open (resolved or
only recorded) with their signals and their settled actions; signals of no open incident; check
results, sweeps and operators' requests. An open incident, its signals and any action not settled
(PENDING, HELD) stay whatever their age. A node's quarantine history (for repeat offenders) lives
in its state and is bounded there. Each pass deletes at most ``limit`` incidents and ``limit`` rows
of each other kind, so a pass over a large backlog never holds the event loop for long.
"""

from __future__ import annotations

from controller.store.database import Database

SETTLED = ("DONE", "SKIPPED", "FAILED")


def prune(db: Database, before: float, limit: int = 5000) -> dict[str, int]:
    """Delete what finished before ``before``; returns how many rows of each kind went."""
    gone: dict[str, int] = {}
    with db.tx() as c:
        c.execute("DROP TABLE IF EXISTS temp.pruned")
        c.execute(
            "CREATE TEMP TABLE pruned AS SELECT id FROM incidents WHERE status != 'OPEN' AND last_at < ? LIMIT ?",
            (before, limit),
        )
        settled = ", ".join(f"'{s}'" for s in SETTLED)
        gone["actions"] = c.execute(
            f"DELETE FROM actions WHERE status IN ({settled}) AND incident_id IN (SELECT id FROM temp.pruned)"
        ).rowcount
        gone["signals"] = c.execute("DELETE FROM signals WHERE incident_id IN (SELECT id FROM temp.pruned)").rowcount
        gone["incidents"] = c.execute("DELETE FROM incidents WHERE id IN (SELECT id FROM temp.pruned)").rowcount
        gone["signals"] += c.execute(
            "DELETE FROM signals WHERE rowid IN (SELECT s.rowid FROM signals s LEFT JOIN incidents i "
            "ON i.id = s.incident_id WHERE s.received_at < ? AND (i.id IS NULL OR i.status != 'OPEN') LIMIT ?)",
            (before, limit),
        ).rowcount
        for table, column in (("check_results", "finished_at"), ("sweeps", "finished_at"), ("operator_actions", "at")):
            gone[table] = c.execute(
                f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE {column} < ? LIMIT ?)",
                (before, limit),
            ).rowcount
        c.execute("DROP TABLE temp.pruned")
    return {k: v for k, v in gone.items() if v}
