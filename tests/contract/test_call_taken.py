"""A Hello's patience counts once the server has taken the call (``vigil_core.call_taken``), over
real gRPC on loopback: the controller and a relay say so before they read a Hello, and the agent's
link given a server slow to take its call waits for its turn instead of giving up on its Hello."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc

from agent.link import ControllerLink
from agent.spool import Spool
from protos.vigil.v1 import agent_pb2
from tests.contract.test_relay import Relay, answer_ok, run
from tests.contract.test_urgent_hello import ack
from tests.helpers import wait_until
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


def test_the_controller_and_a_relay_say_a_call_is_taken_before_they_read_its_hello(tmp_path: Path) -> None:
    async def test(controller: object, _: Path) -> None:
        port = controller.port  # type: ignore[attr-defined]
        assert await taken_before_any_hello(port)
        async with Relay(port, first_message_s=30.0) as relay:
            assert await taken_before_any_hello(relay.port)

    run(test, tmp_path)
