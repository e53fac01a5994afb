"""A relay passes on only as many Hellos as the controller answers in ``hello_wait_s``, queues the
other agents and calls each as a place comes free (``controller.relay.hello_room``), over real gRPC on
loopback: against a controller that answers nothing (to see the room and the queue), and a real one
(every agent in, once, and again after a restart); agents with faults waiting called first."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from agent.link import ControllerLink
from agent.spool import Spool
from protos.vigil.v1 import agent_pb2
from tests.contract.test_group_commit import hold_flushes
from tests.contract.test_relay import RawAgent, Relay, answer_ok, connected, link_for, sample, scrape
from tests.fakes.fleet import Fleet
from tests.helpers import free_port, start_controller, stop_controller, wait_until
from vigil_core.signals import GpuRef, Signal, SignalKind

# One Hello at the controller at a time (answers waiting past 60 s would shrink it, and it grows only
# while agents wait less than that: in a few seconds, by a quarter of one, which rounds down).
ROOM_OF_ONE = {"hello_wait_s": 60.0, "hello_min_waiting": 1, "hello_first_room": 1}


class SilentController:
    """Takes a relay's stream and reads it, answering nothing: every Hello passed on waits."""

    def __init__(self) -> None:
        self.port = free_port()
        self.server = grpc.aio.server()
        relay = grpc.stream_stream_rpc_method_handler(self.relay)
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("vigil.v1.AgentRelay", {"Relay": relay}),)
        )
        self.server.add_insecure_port(f"127.0.0.1:{self.port}")

    async def relay(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for _ in requests:
            pass
        return
        yield b""  # an async generator: a stream that says nothing


def metric(port: int, name: str, absent: float | None = None) -> float:
    return sample(scrape(port, "/metrics")[1], name, absent)


async def told_nothing(agent: RawAgent, for_s: float = 0.5) -> asyncio.Future[Any]:
    """Nothing said on ``agent``'s call for ``for_s``, not even that it is taken (its initial
    metadata), as for a Hello the relay keeps for room; the wait for that metadata, still running."""
    said: asyncio.Future[Any] = asyncio.ensure_future(agent.call.initial_metadata())
    done, _ = await asyncio.wait({said}, timeout=for_s)
    assert not done, "the relay said something to an agent whose first Hello it keeps"
    return said


async def queued(metrics_port: int, count: int) -> None:
    await wait_until(lambda: metric(metrics_port, "vigil_relay_hellos_queued") == count, what=f"{count} queued")


@dataclass
class Held:
    """A relay with room for one Hello, in front of a controller that answers nothing, node-a's Hello
    in that room."""

    silent: SilentController
    relay: Relay
    metrics_port: int
    first: RawAgent


@contextlib.asynccontextmanager
async def room_held(waits: bool = False) -> AsyncIterator[Held]:
    silent = SilentController()
    await silent.server.start()
    metrics_port = free_port()
    try:
        async with Relay(silent.port, metrics_port=metrics_port, **ROOM_OF_ONE) as relay:
            first = RawAgent(relay.port)
            await first.hello("node-a", waits=waits)
            await wait_until(lambda: metric(metrics_port, "vigil_relay_hellos_waiting") == 1, what="node-a passed on")
            yield Held(silent, relay, metrics_port, first)
    finally:
        await silent.server.stop(0)


def test_hellos_past_the_room_are_queued_and_each_called_as_a_place_comes_free(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with room_held() as held:
            metrics_port, first = held.metrics_port, held.first
            second, third = RawAgent(held.relay.port), RawAgent(held.relay.port)
            for agent, node in ((second, "node-b"), (third, "node-c")):
                await agent.hello(node)
                told = await agent.read()  # the relay's own answer: no room at the controller yet, wait
                assert told.HasField("hello_again") and told.hello_again.wait
            assert metric(metrics_port, "vigil_relay_hellos_queued") == 2
            assert metric(metrics_port, 'vigil_relay_hello_again_total{why="queued"}') == 2
            gone = RawAgent(held.relay.port)  # queued, then gone before it is called: counted, not lost
            await gone.hello("node-d")
            assert (await gone.read()).hello_again.wait
            await gone.close()
            left = "vigil_relay_hellos_left_queued_total"
            await wait_until(lambda: metric(metrics_port, left) == 1, what="node-d counted as gone while queued")
            assert metric(metrics_port, "vigil_relay_hellos_queued") == 2
            await first.close()  # node-a gives up: its Hello will not be answered, its place is free
            called = await second.read()  # the first queued is called
            assert called.HasField("hello_again") and not called.hello_again.wait and called.hello_again.after_ms == 0
            assert metric(metrics_port, "vigil_relay_hellos_queued") == 1
            assert metric(metrics_port, "vigil_relay_hello_queued_seconds_count") == 1  # its wait for room said
            await third.hello("node-c")  # not called: its Hello goes nowhere, and it stays queued
            await second.hello("node-b")
            await wait_until(lambda: metric(metrics_port, "vigil_relay_hellos_waiting") == 1, what="node-b passed on")
            assert metric(metrics_port, "vigil_relay_hellos_queued") == 1
            assert metric(metrics_port, "vigil_relay_dropped_between_sessions_total") == 1
            await second.close()
            called = await third.read()
            assert called.HasField("hello_again") and not called.hello_again.wait
            assert metric(metrics_port, "vigil_relay_hello_queued_seconds_count") == 2
            # No Hello was answered by the controller.
            assert metric(metrics_port, "vigil_relay_hello_answer_seconds_count") == 0
            await third.close()

    asyncio.run(scenario())


def test_an_agent_that_waits_for_its_kept_hello_is_told_nothing_and_its_hello_goes_on_when_a_place_comes_free(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with room_held(waits=True) as held:
            metrics_port, first, second = held.metrics_port, held.first, RawAgent(held.relay.port)
            await second.hello("node-b", waits=True)
            await queued(metrics_port, 1)
            assert metric(metrics_port, 'vigil_relay_hello_again_total{why="queued"}') == 1
            said = await told_nothing(second)  # its Hello kept here: not even its call said taken
            await first.close()
            # Its place came free: the Hello it said goes on, with no word to the agent.
            await queued(metrics_port, 0)
            assert metric(metrics_port, "vigil_relay_hellos_waiting") == 1
            assert metric(metrics_port, "vigil_relay_hello_queued_seconds_count") == 1
            assert metric(metrics_port, "vigil_relay_dropped_between_sessions_total", absent=0) == 0
            assert not said.done()  # passed on to a controller that answers nothing: still nothing said
            await second.close()

    asyncio.run(scenario())


def test_a_kept_hello_outlives_a_controller_that_never_answered_and_is_acknowledged_by_the_next(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with room_held(waits=True) as held:  # node-a's Hello passed on, never answered
            silent, first, second = held.silent, held.first, RawAgent(held.relay.port)
            await second.hello("node-b", waits=True)
            await queued(held.metrics_port, 1)
            said = await told_nothing(second)  # queued, its Hello kept
            await silent.server.stop(0)  # the relay loses it: node-a's session ends, node-b's Hello waits on
            assert (await first.read()).hello_again.wait
            controller = await start_controller(tmp_path / "ctl.db", silent.port)
            ack = await second.read()  # its kept Hello went to the new controller first: answered here
            assert ack.HasField("ack") and said.done()  # its call said taken with its answer
            asked = await first.read()  # then node-a, queued after it, asked for its Hello again
            assert asked.HasField("hello_again") and not asked.hello_again.wait
            await first.hello("node-a", waits=True)
            assert (await first.read()).HasField("ack")
            assert connected(controller, "node-a") and connected(controller, "node-b")
            for agent in (first, second):
                await agent.close()
        await stop_controller(controller)

    asyncio.run(scenario())


def test_the_agent_waits_for_its_kept_hello_past_its_patience_and_is_taken_when_a_place_comes_free(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with room_held(waits=True) as held:
            spool, stop = Spool(tmp_path / "spool.db"), asyncio.Event()
            link = ControllerLink(
                f"127.0.0.1:{held.relay.port}", spool, lambda: agent_pb2.Hello(node="node-b", spool_id="s"),
                answer_ok, heartbeat_s=0.2, hello_patience_first_s=0.3,
            )  # fmt: skip
            running = asyncio.create_task(link.run(stop))
            await wait_until(lambda: metric(held.metrics_port, "vigil_relay_hellos_queued") == 1, what="node-b queued")
            await asyncio.sleep(1.5)  # five times its patience: its call not said taken, it does not give up
            assert (link.streams, link.unanswered) == (1, 0)
            await held.first.close()  # a place comes free: node-b's kept Hello goes on, with no word from it
            await wait_until(lambda: metric(held.metrics_port, "vigil_relay_hellos_queued") == 0, what="node-b on")
            assert metric(held.metrics_port, "vigil_relay_hellos_waiting") == 1 and link.streams == 1
            stop.set()
            await running

    asyncio.run(scenario())


def test_agents_queued_all_come_in_once_on_their_first_streams_and_again_after_a_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        port, metrics_port, stop = controller.port, free_port(), asyncio.Event()
        nodes = [f"node-{i}" for i in range(6)]
        async with Relay(port, metrics_port=metrics_port, **ROOM_OF_ONE) as relay:
            links = [link_for(Spool(tmp_path / f"{n}.db"), relay.port, n) for n in nodes]
            running = [asyncio.create_task(link.run(stop)) for link in links]
            # The agents' side: the relay counts a Hello's answer as it takes it, before it passes it on; the
            # controller counts an agent in before its answer reaches the relay.
            await wait_until(lambda: all(link.connected for link in links), timeout=30, what="all six in")
            assert all(connected(controller, n) for n in nodes)
            assert metric(metrics_port, 'vigil_relay_hello_again_total{why="queued"}') >= 1  # the room was one
            assert metric(metrics_port, "vigil_relay_hello_answer_seconds_count") == 6  # each Hello passed on once
            await stop_controller(controller)
            await wait_until(lambda: not any(link.connected for link in links), what="their sessions ended")
            controller = await start_controller(tmp_path / "ctl.db", port)
            await wait_until(lambda: all(link.connected for link in links), timeout=30, what="all six back")
            assert all(connected(controller, n) for n in nodes)
            assert [(link.streams, link.connections, link.resumed) for link in links] == [(1, 2, 1)] * 6
            assert metric(metrics_port, "vigil_relay_hello_answer_seconds_count") == 12
            # each said its Hello while the relay reached the controller again, none asked for it after
            assert metric(metrics_port, 'vigil_relay_hellos_kept_unasked_total{said="calm"}') == 6
            assert metric(metrics_port, "vigil_relay_hellos_waiting") == 0
            stop.set()
            await asyncio.gather(*running)
        await stop_controller(controller)

    asyncio.run(scenario())


def test_a_fault_s_hello_goes_on_past_a_full_room_in_the_urgent_lane(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with room_held(waits=True) as held:  # node-a's Hello passed on, never answered: the room full
            calm, urgent = RawAgent(held.relay.port), RawAgent(held.relay.port)
            await calm.hello("node-b", waits=True)
            await queued(held.metrics_port, 1)
            await urgent.hello("node-x", waits=True, urgent=1)  # a fault waits: the urgent lane's place
            await wait_until(lambda: metric(held.metrics_port, "vigil_relay_hellos_waiting") == 2, what="node-x on")
            assert metric(held.metrics_port, "vigil_relay_hellos_queued") == 1  # node-b still queued
            for agent in (held.first, calm, urgent):
                await agent.close()

    asyncio.run(scenario())


def test_kept_hellos_that_say_faults_wait_go_on_before_those_queued_earlier(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with room_held(waits=True) as held:  # node-a's Hello passed on, never answered
            silent, first = held.silent, held.first
            held_urgent = RawAgent(held.relay.port)
            await held_urgent.hello("node-x", waits=True, urgent=1)  # the urgent lane's place, never answered
            await wait_until(lambda: metric(held.metrics_port, "vigil_relay_hellos_waiting") == 2, what="node-x on")
            second, third, fourth = RawAgent(held.relay.port), RawAgent(held.relay.port), RawAgent(held.relay.port)
            await second.hello("node-b", waits=True)
            await queued(held.metrics_port, 1)
            await third.hello("node-c", waits=True, urgent=2)  # both lanes full: queued after node-b
            await fourth.hello("node-d", waits=True, urgent=1)
            await queued(held.metrics_port, 3)
            assert metric(held.metrics_port, "vigil_relay_urgent_hellos_total") == 3
            await silent.server.stop(0)  # the two sessions end; the next controller takes one Hello a lane
            for agent in (first, held_urgent):
                assert (await agent.read()).hello_again.wait
            # The places freed go to node-c and node-d while the relay has no controller: they keep them
            # through the relay's tries that fail (a try that failed once ended their Hellos' streams).
            tries = "vigil_relay_uplink_tries_failed_total"
            await wait_until(lambda: metric(held.metrics_port, tries) >= 2, what="two tries failed")
            controller = await start_controller(tmp_path / "ctl.db", silent.port)
            for agent in (second, third, fourth):
                assert (await agent.read()).HasField("ack")
            for agent, node in ((first, "node-a"), (held_urgent, "node-x")):
                asked = await agent.read()
                assert asked.HasField("hello_again") and not asked.hello_again.wait
                await agent.hello(node, waits=True)
                assert (await agent.read()).HasField("ack")
            came = {n: controller.nodes.fleet.entry(f"node-{n}").connected_at for n in "abcdx"}
            # node-c and node-d first, in both lanes' places: their faults wait behind nobody queued
            assert max(came["c"], came["d"]) < came["b"] < min(came["a"], came["x"])
            for agent in (first, second, third, fourth, held_urgent):
                await agent.close()
        await stop_controller(controller)

    asyncio.run(scenario())


def test_an_agent_that_comes_to_have_a_fault_while_the_relay_reaches_the_controller_again_is_called_first(
    tmp_path: Path,
) -> None:
    """The real agent's link: told to wait while its relay reaches the controller again, it gets a fault,
    says its Hello again on the same stream (its first, said at once, said none), and the relay calls it
    first, in the urgent lane's place."""

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        port, metrics_port, stop = controller.port, free_port(), asyncio.Event()
        nodes = [f"node-{i}" for i in range(6)]
        async with Relay(port, metrics_port=metrics_port, **ROOM_OF_ONE) as relay:
            spools = {n: Spool(tmp_path / f"{n}.db") for n in nodes}
            links = {n: link_for(spools[n], relay.port, n) for n in nodes}
            running = [asyncio.create_task(link.run(stop)) for link in links.values()]
            await wait_until(lambda: all(link.connected for link in links.values()), timeout=30, what="all six in")
            await stop_controller(controller)
            await wait_until(lambda: not any(link.connected for link in links.values()), what="their sessions ended")
            late = nodes[-1]
            fault = Signal(late, SignalKind.XID, GpuRef(0, f"GPU-{late}"), 79, 0.0, "fallen off the bus", "test", 1.0)
            spools[late].append([fault])
            links[late].notify()  # as the agent's collector does once a signal is spooled
            await wait_until(
                lambda: metric(metrics_port, "vigil_relay_urgent_hellos_total", absent=0) == 1, what="its Hello kept"
            )
            controller = await start_controller(tmp_path / "ctl.db", port)
            await wait_until(lambda: all(link.connected for link in links.values()), timeout=30, what="all six back")
            came = sorted(nodes, key=lambda n: controller.nodes.fleet.entry(n).connected_at)
            # Called first, in the urgent lane's place; beside it one calm agent in the other lane's
            # (its Hello kept too, both go at once, on the relay's two streams): never behind the rest.
            assert late in came[:2], came
            assert [(link.streams, link.resumed) for link in links.values()] == [(1, 1)] * 6  # no stream opened
            await wait_until(lambda: spools[late].urgent_waiting() == 0, what="its fault acknowledged")
            assert any(i.code == 79 for i in controller.store.incidents.list(node=late))
            stop.set()
            await asyncio.gather(*running)
        await stop_controller(controller)

    asyncio.run(scenario())


def test_an_agent_queued_for_room_that_comes_to_have_a_fault_is_taken_on_the_relay_s_urgent_port(
    tmp_path: Path,
) -> None:
    """The real agent's link, queued at its relay behind a full room (the controller's flush held,
    so the calm Hello in the room waits), comes to have a fault: it gives its queued call up, dials
    the relay's urgent port and is answered while the room is still full."""

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        gate = hold_flushes(controller.store)
        metrics_port, urgent_port, stop = free_port(), free_port(), asyncio.Event()
        urgent_listen = f"127.0.0.1:{urgent_port}"
        try:
            async with Relay(
                controller.port, metrics_port=metrics_port, urgent_listen=urgent_listen, **ROOM_OF_ONE
            ) as relay:
                spools = {n: Spool(tmp_path / f"{n}.db") for n in ("node-a", "node-b")}

                def link(node: str) -> ControllerLink:
                    spool = spools[node]

                    def hello() -> agent_pb2.Hello:
                        return agent_pb2.Hello(node=node, spool_id=spool.spool_id, last_acked_seq=spool.acked_seq)

                    target = f"127.0.0.1:{relay.port}"
                    return ControllerLink(target, spool, hello, answer_ok, heartbeat_s=0.2, urgent_target=urgent_listen)

                calm, late = link("node-a"), link("node-b")
                running = [asyncio.create_task(calm.run(stop))]
                await wait_until(
                    lambda: metric(metrics_port, "vigil_relay_hellos_waiting") == 1, what="node-a passed on"
                )
                running.append(asyncio.create_task(late.run(stop)))
                await queued(metrics_port, 1)
                fault = Signal("node-b", SignalKind.XID, GpuRef(0, "GPU-b"), 79, 0.0, "fallen off the bus", "test", 1.0)
                spools["node-b"].append([fault])
                late.notify()  # as the agent's collector does once a signal is spooled
                await wait_until(lambda: late.connected, timeout=5, what="node-b answered on the urgent port")
                assert not calm.connected  # the room is still full: its Hello waits for the flush
                assert (late.left_for_urgent, late.urgent_sessions) == (1, 1)
                await wait_until(
                    lambda: metric(metrics_port, "vigil_relay_hellos_left_queued_total") == 1, what="counted"
                )
                gate.set()
                await wait_until(lambda: calm.connected, what="node-a answered once the flush is through")
                await wait_until(lambda: spools["node-b"].urgent_waiting() == 0, what="node-b's fault acknowledged")
                stop.set()
                await asyncio.gather(*running)
        finally:
            gate.set()
            await stop_controller(controller)

    asyncio.run(scenario())


def test_a_hello_said_while_the_relay_reaches_the_controller_again_is_kept_and_answered_without_an_ask(
    tmp_path: Path,
) -> None:
    """Told the relay takes its Hello (``HelloAgain.takes_hello``), an agent says it at once; the relay
    keeps the last said (a fault's, said after a calm one), passes it on once the controller is back
    and the agent's next word is its answer, not a word to say Hello. A Hello said again after the one
    before went on is passed over, and the session goes on."""

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        port, metrics_port = controller.port, free_port()
        async with Relay(port, metrics_port=metrics_port) as relay:
            agent = RawAgent(relay.port)
            await agent.hello("node-a", waits=True)
            assert (await agent.read()).HasField("ack")
            await stop_controller(controller)
            told = (await agent.read()).hello_again
            assert told.wait and told.takes_hello and told.takes_urgent_hello and not told.kept
            await agent.hello("node-a", waits=True)  # at once, no fault
            calm, urgent = (f'vigil_relay_hellos_kept_unasked_total{{said="{s}"}}' for s in ("calm", "urgent"))
            await wait_until(lambda: metric(metrics_port, calm, absent=0) == 1, what="its calm Hello kept")
            await agent.hello("node-a", waits=True, urgent=1)  # a fault came: kept instead
            await wait_until(lambda: metric(metrics_port, urgent, absent=0) == 1, what="its fault's Hello kept")
            controller = await start_controller(tmp_path / "ctl.db", port)
            assert (await agent.read()).HasField("ack")  # no HelloAgain asking for what it said already
            fleet = controller.nodes.fleet
            assert fleet.entry("node-a").connected
            assert controller.engine.metrics.hellos_urgent._value.get() == 1  # the fault's Hello went on
            await agent.hello("node-a", waits=True, urgent=1)  # crossed the one that went on: passed over
            before = fleet.entry("node-a").last_heartbeat
            await asyncio.sleep(0.01)
            await agent.call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))
            await wait_until(lambda: fleet.entry("node-a").last_heartbeat > before, what="the session goes on")
            assert metric(metrics_port, "vigil_relay_hellos_crossed_total") == 1
            assert fleet.entry("node-a").connected
            await agent.close()
        await stop_controller(controller)

    asyncio.run(scenario())


def test_the_simulated_fleet_says_its_hello_while_the_relay_waits_as_the_agent_does(tmp_path: Path) -> None:
    """The scale benchmark's fleet (``tests.fakes.fleet``) against a real relay and controller, as the
    agent's link: each node says its Hello at once while the relay reaches the controller again, one
    that gets a fault says it again, once, and all come back on their streams, the fault's Hello
    passed on and its signals acknowledged."""

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        port, metrics_port = controller.port, free_port()
        names = [f"node-{i}" for i in range(4)]
        calm, urgent = (f'vigil_relay_hellos_kept_unasked_total{{said="{s}"}}' for s in ("calm", "urgent"))
        async with Relay(port, metrics_port=metrics_port) as relay:
            fleet = Fleet(f"127.0.0.1:{relay.port}", names, heartbeat_s=0.5)
            await fleet.start(timeout_s=30)
            await stop_controller(controller)
            await wait_until(lambda: metric(metrics_port, calm, absent=0) == 4, what="each node's Hello kept")
            late = fleet.nodes[names[-1]]
            late.fault()
            late.fault()  # its Hello says a fault waits already: not said again
            await wait_until(lambda: metric(metrics_port, urgent, absent=0) == 1, what="the fault's Hello kept")
            await asyncio.sleep(0.3)
            assert metric(metrics_port, urgent) == 1
            assert [fleet.nodes[n].unasked for n in names] == [1, 1, 1, 2]
            controller = await start_controller(tmp_path / "ctl.db", port)
            await wait_until(
                lambda: late.acked == 2 and all(connected(controller, n) for n in names), timeout=30, what="all back"
            )
            assert controller.engine.metrics.hellos_urgent._value.get() == 1
            assert all(node.reconnects == 0 for node in fleet.nodes.values())  # each on its stream
            await fleet.close()
        await stop_controller(controller)

    asyncio.run(scenario())
