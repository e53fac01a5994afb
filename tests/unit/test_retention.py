"""Retention: finished history older than the retention period is deleted; what is open stays."""

from __future__ import annotations

import asyncio
from pathlib import Path

from controller.act.actuators import NullPager
from controller.act.local_actuator import LocalActuator
from controller.compose import node_route
from controller.store import Store
from controller.vocab.policy import Policy
from vigil_core.signals import GpuRef, Signal, SignalKind

DAY = 86400.0


def xid(node: str, code: int, at: float, seq: int) -> Signal:
    return Signal(node, SignalKind.XID, GpuRef(0, "GPU-0", "0000:18:00"), code, observed_at=at, seq=seq)


def test_finished_incidents_and_their_signals_go_after_the_retention_open_ones_stay(tmp_path: Path) -> None:
    async def scenario() -> None:
        now = [1_000_000.0]
        store = Store(tmp_path / "ctl.db")
        route = node_route(
            store, Policy(), LocalActuator(store.db), NullPager(), clock=lambda: now[0], retention_s=28 * DAY
        )
        for node in ("n1", "n2", "n3"):
            route.engine.hello(node, f"spool-{node}", 8)
        route.engine.receive("n1", [xid("n1", 79, now[0], 1)])  # quarantined: its incident stays open
        route.engine.receive("n2", [xid("n2", 13, now[0], 1)])  # recorded only
        route.engine.receive("n3", [xid("n3", 999, now[0], 1)])  # SUSPECT, then resolved by a person
        await route.wait_for_actions()
        (suspect,) = store.incidents.list(open_only=True, node="n3")
        route.by_hand.resolve_incident(suspect.id, "sre@example.com", "known noisy ECC")
        await route.wait_for_actions()
        assert len(store.incidents.list()) == 3

        now[0] += 27 * DAY
        assert route.upkeep.apply_retention() == {}  # not old enough yet
        now[0] += 2 * DAY
        gone = route.upkeep.apply_retention()
        assert gone["incidents"] == 2 and gone["signals"] == 2
        (left,) = store.incidents.list()
        assert left.node == "n1" and left.status == "OPEN" and left.actions  # with its actions
        assert store.read("SELECT count(*) FROM signals")[0][0] == 1
        route.engine.receive("n2", [xid("n2", 13, now[0], 1)])  # the spool's old seq: still a replay, not new
        assert store.read("SELECT count(*) FROM signals")[0][0] == 1
        store.close()

    asyncio.run(scenario())
