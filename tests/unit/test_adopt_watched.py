"""A new leader adopts from its actuator's node watch and serves at once, then reads the cluster
itself and adopts what the watch had not shown yet (``controller.nodes.adopt``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from controller.act.actuators import FoundQuarantine
from controller.act.local_actuator import LocalActuator
from controller.compose import node_route
from controller.store import Store
from controller.vocab.node_state import Health
from controller.vocab.policy import Policy
from tests.fakes.pagers import RecordingPager

SEEN = FoundQuarantine("gpu-01", "inc-01", "XID 79 on gpu-01 GPU 3", 100.0)
LATE = FoundQuarantine("gpu-02", "inc-02", "XID 79 on gpu-02 GPU 5", 150.0)  # the earlier leader's last


class WatchBehind(LocalActuator):
    """A watch that has listed the cluster but not yet shown the earlier leader's last quarantine."""

    def __init__(self, store: Store, listed: bool = True) -> None:
        super().__init__(store.db)
        self.listed = listed
        self.reads = 0  # reads of the cluster itself

    def adopt_watched(self) -> list[FoundQuarantine] | None:
        return [SEEN] if self.listed else None

    def adopt(self) -> list[FoundQuarantine]:
        self.reads += 1
        return [SEEN, LATE]


def test_the_cluster_read_after_the_watch_adopts_what_the_watch_had_not_shown(tmp_path: Path) -> None:
    async def scenario() -> None:
        store, pages = Store(tmp_path / "ctl.db"), RecordingPager()
        act = WatchBehind(store)
        route = node_route(store, Policy(), act, pages, clock=lambda: 200.0)
        adoption = await route.adopter().at_leadership()
        assert adoption.watched == {"gpu-01"} and act.reads == 0  # serving needs no read of the cluster
        assert route.fleet.nodes["gpu-01"].state.health is Health.QUARANTINED
        assert "gpu-02" not in route.fleet.nodes

        assert await route.adopter().check(adoption.watched) == 1
        await route.wait_for_actions()
        assert act.reads == 1
        assert route.fleet.nodes["gpu-02"].state.health is Health.QUARANTINED
        assert route.fleet.open_incident["gpu-02"] == "inc-02"
        assert sorted(p.node for p in pages.sent) == ["gpu-01", "gpu-02"]  # each paged once, none twice
        store.close()

    asyncio.run(scenario())


def test_a_watch_that_has_not_listed_is_passed_over_for_the_cluster(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = Store(tmp_path / "ctl.db")
        act = WatchBehind(store, listed=False)
        route = node_route(store, Policy(), act, RecordingPager(), clock=lambda: 200.0)
        adoption = await route.adopter().at_leadership()
        assert adoption.watched is None and adoption.new_here == 2 and act.reads == 1  # nothing left to check
        store.close()

    asyncio.run(scenario())
