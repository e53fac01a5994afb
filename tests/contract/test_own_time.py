"""A server's bounds on an agent leave out the server's own lateness (``vigil_core.loop_lag``): a
relay or a controller whose event loop was held (its garbage collector, a starved CPU) past an
agent's ``first_message_s`` does not end the stream of an agent that said Hello as soon as it could,
nor does a controller held past the heartbeat timeout find its heartbeating agents silent. Real gRPC
on loopback; the server's loop is held by the test as a long collection holds it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest
from structlog.testing import capture_logs

from agent.spool import Spool
from controller.edge.limits import LimitsConfig
from controller.vocab.node_state import Health
from tests.contract.test_relay import (
    NODE,
    RawAgent,
    Relay,
    asked_for_hello_again,
    connected,
    link_for,
    sample,
    scrape,
)
from tests.helpers import free_port, start_controller, stop_controller, wait_until

BOUND_S = 1.0
HELD_S = 2.0  # the loop held twice the bound, as by a long garbage collection


async def hold_the_loop() -> None:
    """Let the server take the agent's call and start its bound, then hold the loop past the bound."""
    await asyncio.sleep(0.3)
    time.sleep(HELD_S)  # noqa: ASYNC251 (the point: nothing on this loop runs meanwhile)
    await asyncio.sleep(0.1)  # the agent (on this loop too) says Hello a moment after: what was due has run


def test_a_relay_held_past_an_agents_bound_still_takes_its_first_hello(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        async with Relay(controller.port, metrics_port=(metrics_port := free_port()), first_message_s=BOUND_S) as relay:
            agent = RawAgent(relay.port)  # its call open, its Hello not said yet
            await hold_the_loop()
            await agent.hello()  # at once, once the loop runs again: the agent was not late
            assert (await agent.read()).HasField("ack")
            await wait_until(lambda: connected(controller), what="the node's session through the relay")
            text = (await asyncio.to_thread(scrape, metrics_port, "/metrics"))[1]
            assert sample(text, 'vigil_relay_agents_refused_total{why="no_hello"}', absent=0) == 0
            assert sample(text, 'vigil_relay_event_loop_lag_seconds_bucket{le="1.0"}') < sample(
                text, "vigil_relay_event_loop_lag_seconds_count"
            )  # the hold was seen: a tick more than a second late
            await agent.close()
        await stop_controller(controller)

    asyncio.run(scenario())


def test_a_relay_held_past_an_agents_bound_still_takes_its_hello_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        port, metrics_port = controller.port, free_port()
        async with Relay(port, metrics_port=metrics_port, first_message_s=BOUND_S) as relay:
            agent = RawAgent(relay.port)
            controller = await asked_for_hello_again(agent, controller, tmp_path / "ctl.db")
            await hold_the_loop()  # the relay's loop held past the bound (its agent's too: it says Hello after)
            await agent.hello()
            assert (await agent.read()).HasField("ack")  # its second session, on the same call
            await wait_until(lambda: connected(controller), what="the node's second session")
            text = (await asyncio.to_thread(scrape, metrics_port, "/metrics"))[1]
            assert sample(text, 'vigil_relay_agents_refused_total{why="hello_again_late"}', absent=0) == 0
            await agent.close()
        await stop_controller(controller)

    asyncio.run(scenario())


def test_a_controller_held_past_an_agents_bound_still_takes_its_first_hello(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db", limits=LimitsConfig(first_message_s=BOUND_S))
        watching = asyncio.create_task(controller.nodes.lateness.watch())  # as Controller.run watches it
        agent = RawAgent(controller.port)
        await hold_the_loop()
        await agent.hello()
        assert (await agent.read()).HasField("ack")
        assert connected(controller, NODE)
        await agent.close()
        watching.cancel()
        await stop_controller(controller)

    asyncio.run(scenario())


def test_a_silent_agent_is_still_ended_once_its_bound_has_passed_on_the_servers_own_time(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db", limits=LimitsConfig(first_message_s=BOUND_S))
        watching = asyncio.create_task(controller.nodes.lateness.watch())
        agent = RawAgent(controller.port)
        await hold_the_loop()  # the hold is not the agent's: it has its whole bound after it, and no more
        held_until = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await agent.read()
        waited = time.monotonic() - held_until
        assert ended.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert "no Hello within 1 s" in (ended.value.details() or "")
        assert 0.4 < waited < 5, waited  # what was left of the bound after the hold: not at once, not never
        await agent.close()
        watching.cancel()
        await stop_controller(controller)

    asyncio.run(scenario())


def test_a_controller_held_past_the_heartbeat_timeout_does_not_find_its_agents_silent(tmp_path: Path) -> None:
    (policy := tmp_path / "policy.yaml").write_text(f"heartbeat_timeout_s: {BOUND_S}\n")

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db", policy=policy)
        stop = asyncio.Event()
        watching = [  # as Controller.run has them: its lateness, and its silence looked at every 0.1 s
            asyncio.create_task(controller.nodes.lateness.watch()),
            asyncio.create_task(controller.nodes.upkeep.watch(stop, every_s=0.1)),
        ]
        link = link_for(Spool(tmp_path / "spool.db"), controller.port)  # a heartbeat every 0.2 s
        running = asyncio.create_task(link.run(stop))
        await wait_until(lambda: connected(controller) and link.connected, what="the agent's session")
        with capture_logs() as logs:
            await asyncio.sleep(0.3)
            time.sleep(HELD_S)  # noqa: ASYNC251 (held twice the timeout: no heartbeat read meanwhile)
            await asyncio.sleep(1.0)  # the silence looked at again and again, the heartbeats read
        assert [e for e in logs if e["event"] == "node_unknown"] == []
        assert controller.nodes.fleet.entry(NODE).state.health is Health.HEALTHY
        stop.set()
        await running
        await asyncio.gather(*watching[1:])
        watching[0].cancel()
        await stop_controller(controller)

    asyncio.run(scenario())
