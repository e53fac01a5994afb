"""A new leader's page for a quarantine it adopted says what a quarantine is on this cluster (the
actuator's words), not the Kubernetes ones on every cluster (a Slurm cluster's on-call read "taint,
cordon, condition" about a drain before)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from controller.act.actuators import FoundQuarantine
from controller.act.local_actuator import LocalActuator
from controller.act.slurm.actuator import SlurmActuator
from controller.compose import node_route
from controller.store import Store
from controller.vocab.node_state import Health
from controller.vocab.policy import Policy
from tests.fakes.pagers import RecordingPager


class SlurmsWords(LocalActuator):
    """The Slurm actuator's words and one drain an earlier leader made; no slurmctld needed here."""

    quarantine_means = SlurmActuator.quarantine_means

    def adopt(self) -> list[FoundQuarantine]:
        return [FoundQuarantine("gpu-01", "inc-gpu-01", "XID 79 on gpu-01 GPU 3", 100.0)]


def test_an_adopted_quarantine_is_paged_in_its_clusters_words(tmp_path: Path) -> None:
    async def scenario() -> None:
        store, pages = Store(tmp_path / "ctl.db"), RecordingPager()
        route = node_route(store, Policy(), SlurmsWords(store.db), pages, clock=lambda: 200.0)
        assert (await route.adopter().at_leadership()).new_here == 1
        await route.wait_for_actions()
        assert route.fleet.nodes["gpu-01"].state.health is Health.QUARANTINED
        (page,) = pages.sent
        assert page.node == "gpu-01" and "a drain in Slurm, with Vigil's reason" in page.did
        assert "taint" not in page.did and "previous leader" in page.did
        store.close()

    asyncio.run(scenario())
