"""How an opened incident is logged (``controller.nodes.actions.apply``): a record-only one (hundreds a
second across a large fleet) at debug level, one that is acted on at info, both counted."""

from __future__ import annotations

import asyncio
from pathlib import Path

from structlog.testing import capture_logs

from controller.act.actuators import NullPager
from controller.act.local_actuator import LocalActuator
from controller.compose import node_route
from controller.store import Store
from controller.vocab.policy import Policy
from vigil_core.signals import GpuRef, Signal, SignalKind


def test_record_only_incidents_are_logged_at_debug_and_acted_ones_at_info(tmp_path: Path) -> None:
    async def scenario() -> list[dict[str, object]]:
        store = Store(tmp_path / "ctl.db")
        e = node_route(store, Policy(), LocalActuator(store.db), NullPager())
        e.engine.hello("n1", "s", 8)
        e.engine.hello("n2", "s", 8)
        with capture_logs() as logs:
            e.engine.receive("n1", [Signal("n1", SignalKind.XID, GpuRef(0, "GPU-0", "0000:18:00"), 63, seq=1)])
            e.engine.receive("n2", [Signal("n2", SignalKind.XID, GpuRef(0, "GPU-0", "0000:18:00"), 79, seq=1)])
            await e.wait_for_actions()
        counted = {
            s.labels["severity"]: s.value for s in e.metrics.incidents.collect()[0].samples if s.name.endswith("_total")
        }
        await e.shutdown()
        assert counted.get("record") == 1.0 and sum(counted.values()) == 2.0
        return [entry for entry in logs if entry["event"] == "incident_opened"]

    opened = asyncio.run(scenario())
    assert {(entry["node"], entry["log_level"]) for entry in opened} == {("n1", "debug"), ("n2", "info")}
