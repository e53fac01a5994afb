"""Guardrails end to end in one process: the engine, the Kubernetes actuator against the loopback
API server, the Slack pager against the loopback Slack, and a mass failure."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.act.kube.actuator import KubeActuator
from controller.act.kube.client import api_client
from controller.act.pagers.slack import SlackPager
from controller.compose import NodeRoute, node_route
from controller.nodes.guards.rules import GuardrailConfig
from controller.store import Store
from controller.vocab.policy import Policy
from tests.fakes.kube_api import KubeApiServer
from tests.fakes.slack_api import CHANNEL, TOKEN, FakeSlack
from vigil_core.signals import GpuRef, Signal, SignalKind

NODES = [f"gpu-{i:02d}" for i in range(20)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[KubeApiServer, FakeSlack]]:
    with KubeApiServer() as kube, FakeSlack() as slack:
        for name in NODES:
            kube.add_node(name)
        yield kube, slack


def engine(kube: KubeApiServer, slack: FakeSlack, tmp_path: Path, **guard: object) -> NodeRoute:
    """The breaker alone: one fault on many nodes is not grouped as a shared cause here
    (tests/unit/test_shared_cause.py holds that)."""
    guard.setdefault("shared", {"enabled": False})
    store = Store(tmp_path / "ctl.db")
    return node_route(
        store,
        Policy(),
        KubeActuator(api_client(kube.kubeconfig(tmp_path / "kubeconfig"))),
        SlackPager(TOKEN, CHANNEL, store.records, base_url=slack.base_url),
        guardrails=GuardrailConfig(**guard),  # type: ignore[arg-type]
    )


def xid79(node: str, seq: int = 1) -> Signal:
    return Signal(
        node, SignalKind.XID, GpuRef(0, "GPU-x", "0000:3b:00.0"), code=79, message="fallen off the bus", seq=seq
    )


def cordoned(kube: KubeApiServer) -> list[str]:
    return sorted(n for n in NODES if kube.node(n)["spec"].get("unschedulable"))


def test_thirty_percent_failing_trips_the_breaker(cluster: tuple[KubeApiServer, FakeSlack], tmp_path: Path) -> None:
    kube, slack = cluster

    async def scenario() -> None:
        e = engine(kube, slack, tmp_path, breaker_max_nodes=3, breaker_max_fraction=1.0, breaker_page_delay_s=0.2)
        for name in NODES:
            e.engine.hello(name, f"spool-{name}", 8)
        failing = NODES[:6]  # 30 %
        for name in failing:
            e.engine.receive(name, [xid79(name)])
        await asyncio.sleep(0.5)  # the breaker's page waits 0.2 s to gather the burst
        await e.wait_for_actions()

        assert cordoned(kube) == failing[:3]  # the configured number, no more
        assert e.guard.automation.startswith("paused")
        top = slack.state.top_level()
        breaker_pages = [m for m in top if "circuit breaker" in m["text"]]
        assert len(breaker_pages) == 1
        assert all(name in breaker_pages[0]["text"] for name in failing[3:])  # it lists the rest
        assert len(top) == 4  # three node pages and the breaker's: no page per held node

        # Paused: a later fault elsewhere is held too.
        e.engine.receive(NODES[10], [xid79(NODES[10])])
        await e.wait_for_actions()
        assert cordoned(kube) == failing[:3]
        assert NODES[10] in e.guard.breaker.held

        # A person resumes and asks for the held quarantines to be carried out.
        applied, dropped, nodes = await e.by_hand.resume("sre", "checked: four bad GPUs", apply_held=True)
        await e.wait_for_actions()
        assert (applied, dropped) == (8, 0)  # a quarantine and a page for each of the 4 held nodes
        assert len(nodes) == 4 and NODES[10] in nodes  # the nodes, as status lists them (not the 8 actions)
        assert cordoned(kube) == sorted(failing + [NODES[10]])
        assert e.guard.automation == "active"
        e.store.close()

    asyncio.run(scenario())


def test_resume_without_applying_drops_the_held(cluster: tuple[KubeApiServer, FakeSlack], tmp_path: Path) -> None:
    kube, slack = cluster

    async def scenario() -> None:
        e = engine(kube, slack, tmp_path, breaker_max_nodes=1, breaker_max_fraction=1.0, breaker_page_delay_s=0.0)
        for name in NODES[:3]:
            e.engine.hello(name, f"spool-{name}", 8)
            e.engine.receive(name, [xid79(name)])
        await asyncio.sleep(0.1)
        await e.wait_for_actions()
        assert cordoned(kube) == NODES[:1]
        dropped = await e.by_hand.resume("sre", "a bad driver roll-out, not the nodes", apply_held=False)
        assert dropped == (0, 4, sorted(NODES[1:3]))
        await e.wait_for_actions()
        assert cordoned(kube) == NODES[:1]
        assert {a.status for i in e.store.incidents.list(node=NODES[1]) for a in i.actions} == {"SKIPPED"}
        e.store.close()

    asyncio.run(scenario())


def test_tripped_state_survives_a_restart(cluster: tuple[KubeApiServer, FakeSlack], tmp_path: Path) -> None:
    kube, slack = cluster

    async def scenario() -> None:
        e = engine(kube, slack, tmp_path, breaker_max_nodes=1, breaker_max_fraction=1.0, breaker_page_delay_s=0.0)
        for name in NODES[:2]:
            e.engine.hello(name, f"spool-{name}", 8)
            e.engine.receive(name, [xid79(name)])
        await asyncio.sleep(0.1)
        await e.wait_for_actions()
        e.store.close()
        again = engine(kube, slack, tmp_path, breaker_max_nodes=1, breaker_max_fraction=1.0)
        assert again.guard.automation.startswith("paused") and again.guard.breaker.held == (NODES[1],)
        again.store.close()

    asyncio.run(scenario())


def test_dry_run_changes_nothing_but_says_what_it_would_do(
    cluster: tuple[KubeApiServer, FakeSlack], tmp_path: Path
) -> None:
    kube, slack = cluster

    async def scenario() -> None:
        e = engine(kube, slack, tmp_path, dry_run=True)
        e.engine.hello(NODES[0], "s", 8)
        e.engine.receive(NODES[0], [xid79(NODES[0])])
        await e.wait_for_actions()
        assert cordoned(kube) == [] and kube.requests("PATCH") == []
        (message,) = slack.state.top_level()
        assert "DRY RUN: would quarantine" in str(message["blocks"])
        (incident,) = e.store.incidents.list(node=NODES[0])
        quarantine = next(a for a in incident.actions if a.kind == "QUARANTINE")
        assert quarantine.status == "DONE" and quarantine.detail.startswith("dry run")
        # Decided, not carried out: the node is still in service, SUSPECT (not UNHEALTHY for good) ...
        assert e.fleet.nodes[NODES[0]].state.health.value == "SUSPECT"
        # ... so a later, worse fault on another GPU is decided and paged again; a repeat folds.
        e.engine.receive(NODES[0], [xid79(NODES[0], seq=2)])
        e.engine.receive(
            NODES[0], [Signal(NODES[0], SignalKind.XID, GpuRef(3, "GPU-y", "0000:5d:00.0"), code=48, seq=3)]
        )
        await e.wait_for_actions()
        assert len(slack.state.top_level()) == 2 and cordoned(kube) == []
        assert e.fleet.nodes[NODES[0]].state.health.value == "SUSPECT"
        e.store.close()

    asyncio.run(scenario())
