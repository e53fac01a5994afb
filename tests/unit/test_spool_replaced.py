"""An agent back with another spool while its old one held unsent signals: said aloud, counted."""

from __future__ import annotations

import asyncio
from pathlib import Path

from controller.act.actuators import NullPager
from controller.act.local_actuator import LocalActuator
from controller.compose import node_route
from controller.store import Store
from controller.vocab.node_state import Health
from controller.vocab.policy import Policy


def test_a_replaced_spool_that_held_signals_opens_an_incident_with_their_count(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = Store(tmp_path / "ctl.db")
        engine = node_route(store, Policy(), LocalActuator(store.db), NullPager()).engine
        engine.hello("n1", "spool-old", 8)
        engine.heartbeat("n1", spooled=5)  # five signals not yet acknowledged
        engine.hello("n2", "spool-n2", 8)
        engine.heartbeat("n2", spooled=0)
        engine.hello("n1", "spool-new", 8)  # the old spool is gone (damaged, or the disk replaced)
        engine.hello("n2", "spool-n2-new", 8)  # a reimaged node whose spool held nothing: no alarm
        await engine.wait_for_actions()
        (incident,) = store.incidents.list(open_only=True)
        assert incident.node == "n1" and incident.kind == "SPOOL_LOST"
        assert "5 signal(s) waiting in the old one" in incident.first_message
        assert engine.fleet.nodes["n1"].state.health is Health.SUSPECT  # the default policy for SPOOL_LOST
        lost = engine.metrics.registry.get_sample_value(
            "vigil_controller_agent_spool_signals_maybe_lost_total", {"node": "n1"}
        )
        assert lost == 5
        assert engine.fleet.nodes["n1"].spool_id == "spool-new" and engine.fleet.nodes["n1"].last_seq == 0
        store.close()

    asyncio.run(scenario())
