"""An action whose bookkeeping meets a store that takes no writes (a PostgreSQL server restarting, a
full disk) is carried out and recorded once the store is back, not dropped until the next controller
(seen in CI: a quarantine failed, counting its attempt failed too, and its task ended for good)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controller.act.local_actuator import LocalActuator
from controller.compose import node_route
from controller.nodes.guards.rules import GuardrailConfig
from controller.nodes.guards.shared import SharedCauseConfig
from controller.store import Store
from controller.store.write_behind import StoreUnavailable
from controller.vocab.actions import Quarantine
from controller.vocab.node_state import Health
from controller.vocab.policy import Policy
from tests.fakes.pagers import RecordingPager
from tests.helpers import wait_until
from vigil_core.signals import GpuRef, Signal, SignalKind

OPEN = GuardrailConfig(breaker_max_nodes=50, breaker_max_fraction=1.0, shared=SharedCauseConfig(enabled=False))


class FlakyActuator(LocalActuator):
    """The local actuator, whose first quarantine fails the way an API server's 500 does."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.failures = 1

    def quarantine(self, action: Quarantine) -> str:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("the API server answered 500")
        return super().quarantine(action)


def away_for(times: int, write: Callable[..., Any]) -> Callable[..., Any]:
    """``write``, failing as a store that takes no writes the first ``times`` calls."""
    left = [times]

    def maybe(*args: Any) -> Any:
        if left[0]:
            left[0] -= 1
            raise StoreUnavailable("the database does not take writes now")
        return write(*args)

    return maybe


def test_a_quarantine_whose_attempt_and_outcome_cannot_be_written_is_done_and_recorded(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = Store(tmp_path / "ctl.db")
        route = node_route(store, Policy(), FlakyActuator(store.db), RecordingPager(), guardrails=OPEN)
        store.actions.count_attempt = away_for(1, store.actions.count_attempt)  # type: ignore[method-assign]
        store.actions.finish = away_for(2, store.actions.finish)  # type: ignore[method-assign]
        route.engine.hello("node-a", "spool-a", 8)
        route.engine.receive("node-a", [Signal("node-a", SignalKind.XID, GpuRef(0), 79, seq=1)])
        await wait_until(
            lambda: route.fleet.nodes["node-a"].state.health is Health.QUARANTINED,
            timeout=15,
            what="node-a quarantined once the store took writes again",
        )
        await route.engine.wait_for_actions()
        rows = store.db.read("SELECT kind, status FROM actions WHERE kind = 'QUARANTINE'")
        assert [tuple(r) for r in rows] == [("QUARANTINE", "DONE")]
        assert not route.runner.tasks.states.get("action") or route.runner.tasks.states["action"].total == 0
        await route.engine.shutdown()

    asyncio.run(scenario())
