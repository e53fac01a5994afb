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


class Watched(LocalActuator):
    """A local actuator whose labels a watch would keep: a refresh takes ``changes`` and never lists."""

    changes: tuple[dict[str, dict[str, str]], list[str]] | None = None
    listed = 0

    def label_changes(self) -> tuple[dict[str, dict[str, str]], list[str]] | None:
        changes, self.changes = self.changes, ({}, [])
        return changes

    def node_labels(self) -> dict[str, dict[str, str]]:
        self.listed += 1
        return super().node_labels()


def test_where_the_actuator_watches_the_labels_a_refresh_takes_only_what_changed(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = Store(tmp_path / "ctl.db")
        actuator = Watched(store.db, {"n1": {"vigil.dev/rack": "r1"}, "n2": {"vigil.dev/rack": "r1"}})
        e = node_route(store, Policy(), actuator, NullPager())
        await e.upkeep.refresh_labels()  # None: the whole, compared
        assert actuator.listed == 1 and set(e.upkeep.labels) == {"n1", "n2"}
        kept = e.upkeep.labels["n1"]
        actuator.changes = ({"n1": {"vigil.dev/rack": "r1"}, "n3": {"vigil.dev/rack": "r3"}}, ["n2"])
        await e.upkeep.refresh_labels()
        assert actuator.listed == 1  # no list, no pass over the fleet
        assert e.upkeep.labels == {"n1": {"vigil.dev/rack": "r1"}, "n3": {"vigil.dev/rack": "r3"}}
        assert e.upkeep.labels["n1"] is kept  # equal labels are not replaced
        await e.shutdown()

    asyncio.run(scenario())
