"""The guardrails' state (the breaker's window, a suspect domain, an open fleet incident) is in the
store together with the decision that changed it. A controller killed right after a decision (in
the same event-loop turn, before any flush) leaves the store as the decision left it: a new leader
or a restart reads the held quarantine and the tripped breaker, not a held action beside an active
breaker (seen: a SIGKILLed leader whose successor said "active" with node-d's quarantine held).

The "kill" is a second connection reading the database file right after the call returns, with
no await in between (the store's writer thread given the moment it takes to write, no flush): what
it reads is what a process started after a SIGKILL there would read."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from controller.act.local_actuator import LocalActuator
from controller.compose import NodeRoute, node_route
from controller.nodes.found import Found, Source
from controller.nodes.guards.rules import GuardrailConfig
from controller.nodes.guards.shared import SharedCauseConfig
from controller.store import Store
from controller.vocab.actions import Page
from controller.vocab.policy import Policy
from tests.fakes.pagers import RecordingPager
from vigil_core.signals import GpuRef, Signal, SignalKind

NODES = [f"n{i}" for i in range(6)]


def route(path: Path, guard: GuardrailConfig, pages: list[Page] | None = None) -> NodeRoute:
    store = Store(path)
    return node_route(store, Policy(), LocalActuator(store.db), RecordingPager(pages), guardrails=guard)


def xid79(node: str) -> Signal:
    return Signal(node, SignalKind.XID, GpuRef(0), 79, seq=1)


DELAY = 0.3  # the guard gathers a burst this long before its one page
BREAKER = GuardrailConfig(
    breaker_max_nodes=1, breaker_max_fraction=1.0, breaker_page_delay_s=DELAY, shared=SharedCauseConfig(enabled=False)
)
SHARED = GuardrailConfig(
    breaker_max_nodes=50, breaker_max_fraction=1.0, breaker_page_delay_s=DELAY, shared=SharedCauseConfig(min_nodes=3)
)


def receive_each(r: NodeRoute) -> list[str]:
    """One XID 79 per node, one decision at a time; after each, what was decided."""
    seen = []
    for node in NODES[:4]:
        r.engine.receive(node, [xid79(node)])
        seen.append(node)
    return seen


def component(r: NodeRoute) -> list[str]:
    """A sweep blames a leaf switch: its nodes are held in its domain (no batch of an agent's)."""
    r.engine.found(Found("leaf-0", "sweep-1", "slow across leaf-0", Source.SWEEP, behind=(NODES[0], NODES[1])))
    return [NODES[0], NODES[1]]


@pytest.mark.parametrize(
    ("guard", "decide", "holding"),
    [(BREAKER, receive_each, "paused"), (SHARED, receive_each, "holding xid-79"), (BREAKER, component, "suspect")],
    ids=["breaker-trips", "fleet-incident-opens", "component-held-in-its-domain"],
)
def test_a_decision_and_the_guard_state_it_changed_are_stored_together(
    tmp_path: Path, guard: GuardrailConfig, decide: Callable[[NodeRoute], list[str]], holding: str
) -> None:
    path = tmp_path / "ctl.db"

    async def scenario() -> None:
        r = route(path, guard)
        for node in NODES:
            r.engine.hello(node, f"spool-{node}", 8)
        decide(r)
        assert holding in r.guard.automation
        # No await since the decisions: no flush has run, no page has gone. A process started now reads
        # what the store's writer thread has written, which it does a moment later: let it.
        r.store.writer.catch_up()
        pages: list[Page] = []
        after_a_kill = route(path, guard, pages)
        r.guard.cancel()  # the killed one sends nothing more
        assert after_a_kill.guard.state == r.guard.state
        assert holding in after_a_kill.guard.automation
        # The one page about what is held (the breaker, the fleet incident, the domain) is not lost
        # with the process that was gathering the burst for it.
        after_a_kill.engine.resume_pending()
        await asyncio.sleep(DELAY + 0.2)
        await after_a_kill.engine.wait_for_actions()
        assert len([p for p in pages if p.node == ""]) == 1, [p.summary for p in pages]
        restarted = route(path, guard, pages)  # once sent, never again
        restarted.engine.resume_pending()
        await asyncio.sleep(DELAY + 0.2)
        await restarted.engine.wait_for_actions()
        assert len([p for p in pages if p.node == ""]) == 1, [p.summary for p in pages]
        for each in (r, after_a_kill, restarted):
            await each.store.group.durable()
            await each.engine.shutdown()
            each.store.close()

    asyncio.run(scenario())


def test_a_bursts_actions_still_settling_at_a_kill_are_held_by_its_fleet_incident_after_it(tmp_path: Path) -> None:
    """n0 and n1 were decided and were settling when n2 made the three one fleet incident; the
    controller is killed before their settling ends. The next one resumes their actions PENDING, and
    holds them as the fleet incident's, as the killed one would have: no cordon, no page of their own."""
    path = tmp_path / "ctl.db"
    guard = SHARED.model_copy(update={"shared": SharedCauseConfig(min_nodes=3, settle_s=5.0)})

    async def scenario() -> None:
        r = route(path, guard)
        for node in NODES:
            r.engine.hello(node, f"spool-{node}", 8)
        for node in NODES[:3]:
            r.engine.receive(node, [xid79(node)])
        assert "holding xid-79 on 3 node(s)" in r.guard.automation
        r.store.writer.catch_up()  # written, as a moment later; not flushed
        pages: list[Page] = []
        after_a_kill = route(path, guard, pages)
        r.guard.cancel()
        await r.runner.shutdown()
        after_a_kill.engine.resume_pending()
        await asyncio.sleep(DELAY + 0.2)
        await after_a_kill.engine.wait_for_actions()
        statuses = {
            (n, a.kind): a.status
            for n in NODES[:3]
            for i in after_a_kill.store.incidents.list(node=n)
            for a in i.actions
        }
        assert set(statuses.values()) == {"HELD"}, statuses
        assert [p.node for p in pages] == [""]  # the fleet incident's one page
        for each in (r, after_a_kill):
            await each.store.group.durable()
            await each.engine.shutdown()
            each.store.close()

    asyncio.run(scenario())


def test_a_page_task_that_dies_is_said_and_counted(tmp_path: Path) -> None:
    """The store fails as the breaker's page, sent, is marked paid: the task's death is logged and
    counted (vigil_controller_task_failures_total), not lost in asyncio; the page went all the same."""
    path = tmp_path / "ctl.db"

    async def scenario() -> None:
        pages: list[Page] = []
        r = route(path, BREAKER, pages)
        for node in NODES:
            r.engine.hello(node, f"spool-{node}", 8)
        receive_each(r)
        assert [o.kind for o in r.guard.owed] == ["breaker"]

        def failing(values: dict[str, str], durable: bool = True) -> None:
            raise OSError("disk full")

        r.store.records.set_metas = failing  # type: ignore[method-assign]
        await asyncio.sleep(DELAY + 0.2)
        await r.engine.wait_for_actions()
        assert r.runner.tasks.states["guard-page"].total == 1
        assert [p.summary[:24] for p in pages if p.node == ""] == ["circuit breaker tripped:"]
        await r.store.group.durable()
        await r.engine.shutdown()
        r.store.close()

    asyncio.run(scenario())
