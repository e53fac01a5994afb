"""A relay passes on only as many Hellos as the controller answers in ``hello_wait_s``, queues the
other agents and calls each as a place comes free (``controller.relay.turns``), over real gRPC on
loopback: against a controller that answers nothing (to see the room and the queue), and a real one
(every agent in, once, and again after a restart)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from agent.spool import Spool
from tests.contract.test_relay import RawAgent, Relay, connected, link_for, sample, scrape
from tests.helpers import free_port, start_controller, stop_controller, wait_until

ROOM_OF_ONE = {"hello_wait_s": 0.001, "hello_min_waiting": 1}  # one Hello waiting for the controller at a time


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


def test_hellos_past_the_room_are_queued_and_each_called_as_a_place_comes_free(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = SilentController()
        await controller.server.start()
        metrics_port = free_port()
        async with Relay(controller.port, metrics_port=metrics_port, **ROOM_OF_ONE) as relay:
            first, second, third = RawAgent(relay.port), RawAgent(relay.port), RawAgent(relay.port)
            await first.hello("node-a")
            await wait_until(lambda: metric(metrics_port, "vigil_relay_hellos_waiting") == 1, what="node-a passed on")
            for agent, node in ((second, "node-b"), (third, "node-c")):
                await agent.hello(node)
                told = await agent.read()  # the relay's own answer: no room at the controller yet, wait
                assert told.HasField("hello_again") and told.hello_again.wait
            assert metric(metrics_port, "vigil_relay_hellos_queued") == 2
            assert metric(metrics_port, 'vigil_relay_hello_again_total{why="queued"}') == 2
            await first.close()  # node-a gives up: its Hello will not be answered, its place is free
            called = await second.read()  # the first queued is called
            assert called.HasField("hello_again") and not called.hello_again.wait and called.hello_again.after_ms == 0
            assert metric(metrics_port, "vigil_relay_hellos_queued") == 1
            await third.hello("node-c")  # not called: its Hello goes nowhere, and it stays queued
            await second.hello("node-b")
            await wait_until(lambda: metric(metrics_port, "vigil_relay_hellos_waiting") == 1, what="node-b passed on")
            assert metric(metrics_port, "vigil_relay_hellos_queued") == 1
            assert metric(metrics_port, "vigil_relay_dropped_between_sessions_total") == 1
            await second.close()
            called = await third.read()
            assert called.HasField("hello_again") and not called.hello_again.wait
            # No Hello was answered by the controller.
            assert metric(metrics_port, "vigil_relay_hello_answer_seconds_count") == 0
            await third.close()
        await controller.server.stop(0)

    asyncio.run(scenario())


def test_agents_queued_all_come_in_once_on_their_first_streams_and_again_after_a_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        port, metrics_port, stop = controller.port, free_port(), asyncio.Event()
        nodes = [f"node-{i}" for i in range(6)]
        async with Relay(port, metrics_port=metrics_port, **ROOM_OF_ONE) as relay:
            links = [link_for(Spool(tmp_path / f"{n}.db"), relay.port, n) for n in nodes]
            running = [asyncio.create_task(link.run(stop)) for link in links]
            await wait_until(lambda: all(connected(controller, n) for n in nodes), timeout=30, what="all six in")
            assert metric(metrics_port, 'vigil_relay_hello_again_total{why="queued"}') >= 1  # the room was one
            assert metric(metrics_port, "vigil_relay_hello_answer_seconds_count") == 6  # each Hello passed on once
            await stop_controller(controller)
            await wait_until(lambda: not any(link.connected for link in links), what="their sessions ended")
            controller = await start_controller(tmp_path / "ctl.db", port)
            await wait_until(lambda: all(link.connected for link in links), timeout=30, what="all six back")
            assert all(connected(controller, n) for n in nodes)
            assert [(link.streams, link.connections, link.resumed) for link in links] == [(1, 2, 1)] * 6
            assert metric(metrics_port, "vigil_relay_hello_answer_seconds_count") == 12
            assert metric(metrics_port, "vigil_relay_hellos_waiting") == 0
            stop.set()
            await asyncio.gather(*running)
        await stop_controller(controller)

    asyncio.run(scenario())
