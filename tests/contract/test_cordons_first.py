"""A quarantine's cordon comes before any quarantine's record (the node's condition and Event): in a
burst every node is cordoned first, through the real action runner and the Kubernetes client against
the API server double; a lone quarantine's record is not put off; a record an interrupted attempt
left unwritten is written by the next attempt."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.act.actuators import NullPager, Unfinished
from controller.act.kube.actuator import KubeActuator
from controller.act.kube.client import RETRY, api_client
from controller.act.kube.plans import CONDITION_TYPE
from controller.compose import node_route
from controller.nodes.actions.urgent import UrgentLane
from controller.nodes.guards.rules import GuardrailConfig
from controller.nodes.guards.shared import SharedCauseConfig
from controller.store import Store
from controller.vocab.actions import Quarantine
from controller.vocab.policy import Policy
from tests.fakes.kube_api import KubeApiServer, Logged
from vigil_core.signals import GpuRef, Signal, SignalKind

OPEN = GuardrailConfig(breaker_max_nodes=1000, breaker_max_fraction=1.0, shared=SharedCauseConfig(enabled=False))


@pytest.fixture
def kube() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        yield server


def actuator(kube: KubeApiServer, tmp_path: Path) -> KubeActuator:
    return KubeActuator(api_client(kube.kubeconfig(tmp_path / "kubeconfig"), retry=RETRY.new(total=1)))


def is_cordon(r: Logged) -> bool:
    return r.method == "PATCH" and r.path.count("/") == 4 and bool((r.body or {}).get("spec", {}).get("unschedulable"))


def is_record(r: Logged) -> bool:
    return (r.method == "PATCH" and r.path.endswith("/status")) or (r.method == "POST" and r.path.endswith("/events"))


def quarantine_all(kube: KubeApiServer, tmp_path: Path, names: list[str], lane: UrgentLane | None = None) -> Store:
    async def scenario() -> Store:
        store = Store(tmp_path / "ctl.db")
        route = node_route(store, Policy(), actuator(kube, tmp_path), NullPager(), guardrails=OPEN)
        if lane is not None:
            route.runner.urgent = lane
        for name in names:
            route.engine.hello(name, f"spool-{name}", 8)
        for name in names:
            route.engine.receive(name, [Signal(name, SignalKind.XID, GpuRef(0), 79, seq=1)])
        await asyncio.wait_for(route.engine.wait_for_actions(), 30)
        await route.engine.shutdown()
        return store

    return asyncio.run(scenario())


def test_a_burst_cordons_every_node_before_writing_any_record(kube: KubeApiServer, tmp_path: Path) -> None:
    names = [f"gpu-{i}" for i in range(30)]
    kube.add_nodes(names)
    store = quarantine_all(kube, tmp_path, names)
    log = kube.requests()
    cordons = [i for i, r in enumerate(log) if is_cordon(r)]
    records = [i for i, r in enumerate(log) if is_record(r)]
    assert len(cordons) == 30 and len(records) == 60  # a status PATCH and an Event each
    assert max(cordons) < min(records)
    for name in names:  # and every record was written in the end, the action done
        conditions = kube.node(name)["status"].get("conditions") or []
        assert [c["status"] for c in conditions if c["type"] == CONDITION_TYPE] == ["True"]
    rows = store.db.read("SELECT status, COUNT(*) FROM actions WHERE kind = 'QUARANTINE' GROUP BY status")
    assert [tuple(r) for r in rows] == [("DONE", 30)]
    store.close()


def test_a_lone_quarantine_writes_its_record_at_once(kube: KubeApiServer, tmp_path: Path) -> None:
    kube.add_nodes(["gpu-1"])
    # Records waiting for a quiet minute would time the scenario out (30 s): a lone one does not wait.
    store = quarantine_all(kube, tmp_path, ["gpu-1"], UrgentLane(quiet_s=60, longest_s=60))
    assert [is_cordon(r) or is_record(r) for r in kube.requests("PATCH") + kube.requests("POST")] == [True] * 3
    assert [tuple(r) for r in store.db.read("SELECT status FROM actions WHERE kind = 'QUARANTINE'")] == [("DONE",)]
    store.close()


def test_a_record_an_interrupted_attempt_left_unwritten_is_written_by_the_next(
    kube: KubeApiServer, tmp_path: Path
) -> None:
    kube.add_nodes(["gpu-1"])
    action = Quarantine("inc-1", "gpu-1", "XID 79", "reboot the node", 1.0)
    first = actuator(kube, tmp_path).quarantine_urgent_first(action)
    assert isinstance(first, Unfinished)  # the controller stops here: cordoned, no record
    assert kube.node("gpu-1")["spec"]["unschedulable"] is True
    assert not [r for r in kube.requests() if is_record(r)]
    detail = actuator(kube, tmp_path).quarantine(action)  # the next controller carries the action out again
    assert detail == "already tainted and cordoned; condition and Event ensured"
    assert len([r for r in kube.requests() if is_cordon(r)]) == 1
    assert len([r for r in kube.requests() if is_record(r)]) == 2
