"""A Hello's patience counts once the server has taken the call (``vigil_core.call_taken``), over
real gRPC on loopback: the controller says so before it reads a Hello, a relay once it holds one, and the agent's
link given a server slow to take its call waits for its turn instead of giving up on its Hello."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from agent.link import ControllerLink
from agent.spool import Spool
from controller.relay import server as relay_server
from protos.vigil.v1 import agent_pb2
from tests.contract.test_relay import RawAgent, Relay, answer_ok, run
from tests.contract.test_relay_hello_room import ROOM_OF_ONE, SilentController, metric, told_nothing
from tests.contract.test_urgent_hello import ack
from tests.helpers import free_port, wait_until
from vigil_core.call_taken import say_taken

PATIENCE_S = 0.5  # the link's first wait for an answer to its Hello
TAKES_S = 4 * PATIENCE_S  # how long the slow server takes to take a call


class SlowToTake(grpc.aio.ServerInterceptor):
    """Holds every call ``TAKES_S`` before its handler runs: a server whose turns go to the calls
    queued before (what a loaded server's one-at-a-time intake looks like from the agent)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        await asyncio.sleep(TAKES_S)
        return await continuation(handler_call_details)


class Gateway:
    """As a Vigil server: the call said taken, then the Hello answered at once."""

    def __init__(self) -> None:
        self.streams = 0

    async def connect(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self.streams += 1
        await say_taken(context)
        reading = aiter(requests)
        assert agent_pb2.AgentMessage.FromString(await anext(reading)).HasField("hello")
        yield ack(0)
        async for _ in reading:
            pass

    def handler(self) -> grpc.GenericRpcHandler:
        connect = grpc.stream_stream_rpc_method_handler(self.connect)
        return grpc.method_handlers_generic_handler("vigil.v1.AgentGateway", {"Connect": connect})


def test_a_hello_waits_for_a_slow_server_to_take_its_call_without_giving_up(tmp_path: Path) -> None:
    async def scenario() -> None:
        gateway = Gateway()
        server = grpc.aio.server(interceptors=(SlowToTake(),))
        server.add_generic_rpc_handlers((gateway.handler(),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        spool, stop = Spool(tmp_path / "spool.db"), asyncio.Event()
        link = ControllerLink(
            f"127.0.0.1:{port}", spool, lambda: agent_pb2.Hello(node="n1", spool_id=spool.spool_id),
            answer_ok, heartbeat_s=0.2, hello_patience_first_s=PATIENCE_S,
        )  # fmt: skip
        running = asyncio.create_task(link.run(stop))
        try:
            await wait_until(lambda: link.connected, timeout=20, what="the link taken and acknowledged")
            # One stream, its Hello never given up on, though the call waited four patiences to be taken.
            assert (link.streams, link.connections, link.unanswered, gateway.streams) == (1, 1, 0, 1)
        finally:
            stop.set()
            await running
            await server.stop(None)

    asyncio.run(scenario())


async def taken_before_any_hello(port: int) -> bool:
    """Whether the server at ``port`` says it took a call that has said nothing yet (the call still
    open: not the metadata of its refusal for want of a Hello)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream("/vigil.v1.AgentGateway/Connect")()
        await asyncio.wait_for(call.initial_metadata(), 20)
        still_open = not call.done()
        call.cancel()
        return still_open


def test_the_controller_says_a_call_is_taken_before_it_reads_its_hello(tmp_path: Path) -> None:
    async def test(controller: object, _: Path) -> None:
        assert await taken_before_any_hello(controller.port)  # type: ignore[attr-defined]

    run(test, tmp_path)


def test_a_relay_tells_an_agent_that_waits_for_a_kept_hello_nothing_until_its_answer(tmp_path: Path) -> None:
    """An agent that waits for a Hello the relay keeps is told nothing, not even that its call is
    taken, until its Hello's answer, whether the Hello goes on at once or waits for room (its patience
    not running: the batch a word costs each end is spared to most of a fleet connecting at once);
    one that says Hello again when called is told to wait, its call said taken with that word; one
    whose Hello goes on at once is said taken (``test_a_call_that_ends_while_the_relay_says_it_taken``)."""

    async def scenario() -> None:
        silent = SilentController()
        await silent.server.start()
        metrics_port = free_port()
        try:
            async with Relay(silent.port, metrics_port=metrics_port, **ROOM_OF_ONE) as relay:
                passed_on, queued, asked_later = RawAgent(relay.port), RawAgent(relay.port), RawAgent(relay.port)
                await passed_on.hello("node-a", waits=True)
                await wait_until(lambda: metric(metrics_port, "vigil_relay_hellos_waiting") == 1, what="node-a on")
                on_at_once = await told_nothing(passed_on)
                await queued.hello("node-b", waits=True)
                await wait_until(lambda: metric(metrics_port, "vigil_relay_hellos_queued") == 1, what="node-b queued")
                kept = await told_nothing(queued)
                await asked_later.hello("node-c")  # says its Hello again when called: told to wait now
                await asyncio.wait_for(asked_later.call.initial_metadata(), 20)
                told = await asked_later.read()
                assert told.hello_again.wait and not told.hello_again.kept
                await passed_on.close()  # node-a gives up: node-b's kept Hello goes on, still told nothing
                await wait_until(lambda: metric(metrics_port, "vigil_relay_hellos_queued") == 1, what="node-b on")
                assert metric(metrics_port, "vigil_relay_hellos_waiting") == 1
                await asyncio.sleep(0.5)
                assert not kept.done()
                on_at_once.cancel()
                for agent in (queued, asked_later):
                    await agent.close()
        finally:
            await silent.server.stop(0)

    asyncio.run(scenario())


def test_a_relay_says_a_call_taken_at_once_to_an_agent_whose_hello_says_faults_wait(tmp_path: Path) -> None:
    """Its patience runs from the Hello gone on, where one with no fault waiting is told nothing."""

    async def scenario() -> None:
        silent = SilentController()
        await silent.server.start()
        try:
            async with Relay(silent.port) as relay:
                urgent, calm = RawAgent(relay.port), RawAgent(relay.port)
                await calm.hello("node-a", waits=True)
                await urgent.hello("node-b", waits=True, urgent=1)
                await asyncio.wait_for(urgent.call.initial_metadata(), 20)  # no answer will come: taken
                (await told_nothing(calm)).cancel()
                for agent in (urgent, calm):
                    await agent.close()
        finally:
            await silent.server.stop(0)

    asyncio.run(scenario())


def test_a_call_that_ends_while_the_relay_says_it_taken_leaves_no_place_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's call ends while the relay says it taken (its Hello passed on already): the room's
    place and the session at the controller go with it, as for a call that ends at any other point."""
    said: list[bool] = []

    async def ended_meanwhile(context: grpc.aio.ServicerContext) -> None:
        said.append(True)
        if len(said) == 1:
            raise asyncio.CancelledError  # the call cancelled under the handler
        await say_taken(context)

    monkeypatch.setattr(relay_server, "say_taken", ended_meanwhile)

    async def scenario() -> None:
        silent = SilentController()
        await silent.server.start()
        metrics_port = free_port()
        try:
            async with Relay(silent.port, metrics_port=metrics_port, **ROOM_OF_ONE) as relay:
                gone, next_one = RawAgent(relay.port), RawAgent(relay.port)
                await gone.hello("node-a")  # an agent that does not wait for a kept Hello: said taken
                await wait_until(lambda: said == [True], what="node-a's Hello passed on")
                await wait_until(lambda: metric(metrics_port, "vigil_relay_hellos_waiting") == 0, what="freed")
                await next_one.hello("node-b")  # the room of one is free: passed on, not queued
                await asyncio.wait_for(next_one.call.initial_metadata(), 20)
                assert metric(metrics_port, "vigil_relay_hellos_waiting") == 1
                assert metric(metrics_port, "vigil_relay_hellos_queued") == 0
                for agent in (gone, next_one):
                    await agent.close()
        finally:
            await silent.server.stop(0)

    asyncio.run(scenario())
