"""The nodes' labels the upkeep keeps for the guard (``controller.nodes.upkeep.Upkeep.refresh_labels``):
what changed is applied, what did not is left as it was, a node gone is forgotten, and the last
ones are kept while the cluster cannot give them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from controller.act.actuators import NullPager
from controller.act.local_actuator import LocalActuator
from controller.compose import node_route
from controller.store import Store
from controller.vocab.policy import Policy


def test_a_refresh_applies_only_what_changed(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = Store(tmp_path / "ctl.db")
        configured = {n: {"vigil.dev/rack": "r1"} for n in ("n1", "n2", "n3")}
        actuator = LocalActuator(store.db, configured)
        e = node_route(store, Policy(), actuator, NullPager())
        await e.upkeep.refresh_labels()
        assert e.upkeep.labels == configured
        kept = e.upkeep.labels["n1"]

        actuator.set_labels("n2", {"vigil.dev/rack": "r2", "vigil.dev/leaf-switch": "leaf-b"})
        actuator.set_labels("n4", {"vigil.dev/rack": "r4"})  # a node that joined
        del configured["n3"]  # a node that left (the configuration is the local actuator's cluster)
        await e.upkeep.refresh_labels()
        assert e.upkeep.labels == {
            "n1": {"vigil.dev/rack": "r1"},
            "n2": {"vigil.dev/rack": "r2", "vigil.dev/leaf-switch": "leaf-b"},
            "n4": {"vigil.dev/rack": "r4"},
        }
        assert e.upkeep.labels["n1"] is kept  # equal labels are not replaced (nothing new for the collector)
        await e.shutdown()

    asyncio.run(scenario())


class Flaky(LocalActuator):
    away = False

    def node_labels(self) -> dict[str, dict[str, str]]:
        if self.away:
            raise ConnectionError("the API server is away")
        return super().node_labels()


def test_labels_the_cluster_cannot_give_are_kept_as_they_were(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = Store(tmp_path / "ctl.db")
        actuator = Flaky(store.db, {"n1": {"vigil.dev/rack": "r1"}})
        e = node_route(store, Policy(), actuator, NullPager())
        await e.upkeep.refresh_labels()
        actuator.away = True
        await e.upkeep.refresh_labels()
        assert e.upkeep.labels == {"n1": {"vigil.dev/rack": "r1"}}
        actuator.away = False
        actuator.set_labels("n1", {"vigil.dev/rack": "r9"})
        await e.upkeep.refresh_labels()
        assert e.upkeep.labels == {"n1": {"vigil.dev/rack": "r9"}}
        await e.shutdown()

    asyncio.run(scenario())
