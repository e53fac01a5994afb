"""What follows an action carried out (``controller.nodes.actions.after``): the node's state and the
actions asked for next are committed with the action's outcome, and asked for once; and the
quarantine's thread note is sent without a read of the store on the event loop."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from controller.act.local_actuator import LocalActuator
from controller.compose import node_route
from controller.nodes.guards.rules import GuardrailConfig
from controller.nodes.guards.shared import SharedCauseConfig
from controller.store import Store
from controller.vocab.actions import PageUpdate
from controller.vocab.node_state import Health
from controller.vocab.policy import Policy
from tests.fakes.pagers import RecordingPager
from tests.helpers import wait_until
from vigil_core.signals import GpuRef, Signal, SignalKind

OPEN = GuardrailConfig(breaker_max_nodes=50, breaker_max_fraction=1.0, shared=SharedCauseConfig(enabled=False))


class NotingPager(RecordingPager):
    def __init__(self) -> None:
        super().__init__()
        self.notes: list[PageUpdate] = []

    def update(self, action: PageUpdate) -> str:
        self.notes.append(action)
        return "noted"


def test_a_quarantines_outcome_and_the_node_state_it_confirms_are_committed_together(tmp_path: Path) -> None:
    """After every transaction the database commits, a quarantine DONE comes with its node QUARANTINED
    and its thread note asked for: a controller stopped between two commits never leaves one without
    the others (each was written in a transaction of its own after the outcome's)."""
    seen: list[tuple[str | None, str | None, int]] = []

    async def scenario() -> None:
        store = Store(tmp_path / "ctl.db")
        watched = store.writer.inner
        committed = watched.tx

        @contextmanager
        def tx_then_look(durable: bool = True) -> Iterator[Any]:
            with committed(durable) as tx:
                yield tx
            with sqlite3.connect(tmp_path / "ctl.db") as look:  # what a next controller would read now
                status = look.execute("SELECT status FROM actions WHERE kind = 'QUARANTINE'").fetchone()
                health = look.execute("SELECT health FROM nodes WHERE node = 'node-a'").fetchone()
                notes = look.execute("SELECT COUNT(*) FROM actions WHERE kind = 'NOTE:QUARANTINED'").fetchone()[0]
            seen.append((status and status[0], health and health[0], notes))

        watched.tx = tx_then_look  # type: ignore[method-assign]
        route = node_route(store, Policy(), LocalActuator(store.db), RecordingPager(), guardrails=OPEN)
        route.engine.hello("node-a", "spool-a", 8)
        route.engine.receive("node-a", [Signal("node-a", SignalKind.XID, GpuRef(0), 79, seq=1)])
        await wait_until(
            lambda: route.fleet.nodes["node-a"].state.health is Health.QUARANTINED, timeout=15, what="quarantined"
        )
        await route.engine.wait_for_actions()
        store.db.sync()
        await route.engine.shutdown()

    asyncio.run(scenario())
    assert ("DONE", Health.QUARANTINED.value, 1) in seen
    assert [s for s in seen if s[0] == "DONE" and s[1:] != (Health.QUARANTINED.value, 1)] == []


def test_a_quarantines_thread_note_is_sent_once_and_its_page_known_without_a_read(tmp_path: Path) -> None:
    async def scenario() -> tuple[NotingPager, list[str], list[tuple[Any, ...]]]:
        store = Store(tmp_path / "ctl.db")
        reads: list[str] = []
        read_paged = store.actions.paged

        def counted(incident_id: str) -> bool:
            reads.append(incident_id)
            return read_paged(incident_id)

        store.actions.paged = counted  # type: ignore[method-assign]
        pager = NotingPager()
        route = node_route(store, Policy(), LocalActuator(store.db), pager, guardrails=OPEN)
        route.engine.hello("node-a", "spool-a", 8)
        route.engine.receive("node-a", [Signal("node-a", SignalKind.XID, GpuRef(0), 79, seq=1)])
        await wait_until(lambda: pager.notes, timeout=15, what="the quarantine's thread note")
        await route.engine.wait_for_actions()
        rows = store.db.read("SELECT kind, status FROM actions ORDER BY kind")
        await route.engine.shutdown()
        return pager, reads, [tuple(r) for r in rows]

    pager, reads, rows = asyncio.run(scenario())
    assert [n.tag for n in pager.notes] == ["QUARANTINED"] and len(pager.sent) == 1
    assert rows == [("NOTE:QUARANTINED", "DONE"), ("PAGE:quarantine", "DONE"), ("QUARANTINE", "DONE")]
    assert reads == []  # the page was this controller's own: no read of the store to know it
