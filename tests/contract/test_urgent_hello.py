"""The agent's link says its Hello unasked when a fault waits while its relay reaches the controller
again (``HelloAgain.takes_urgent_hello``), over real gRPC on loopback against a scripted relay: one
Hello for the wait, a HelloAgain that crossed it not answered with another, the fault sent after the
Ack on the same stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from agent.link import ControllerLink, crossed
from agent.spool import Spool
from protos.vigil.v1 import agent_pb2
from tests.contract.test_relay import answer_ok
from tests.helpers import wait_until
from vigil_core.signals import GpuRef, Signal, SignalKind


def said(message: agent_pb2.ControllerMessage) -> bytes:
    return message.SerializeToString()


def ack(seq: int) -> bytes:
    return said(agent_pb2.ControllerMessage(ack=agent_pb2.Ack(acked_seq=seq)))


def again(**fields: bool) -> bytes:
    return said(agent_pb2.ControllerMessage(hello_again=agent_pb2.HelloAgain(**fields)))


class ScriptedRelay:
    """A session, then the controller lost (``HelloAgain{wait, takes_urgent_hello}``); the Hello said
    unasked is answered by a ``HelloAgain{}`` sent as it came (the crossing), then the Ack; the fault
    replayed after it is acknowledged."""

    def __init__(self) -> None:
        self.messages: list[agent_pb2.AgentMessage] = []
        self.lost = asyncio.Event()
        self.streams = 0

    async def connect(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self.streams += 1
        reading = aiter(requests)

        async def next_message() -> agent_pb2.AgentMessage:
            while True:
                message = agent_pb2.AgentMessage.FromString(await anext(reading))
                if not message.HasField("heartbeat"):
                    self.messages.append(message)
                    return message

        assert (await next_message()).HasField("hello")
        yield ack(0)
        yield again(wait=True, takes_urgent_hello=True)
        self.lost.set()
        hello = await next_message()  # said unasked: the fault below
        assert hello.HasField("hello") and hello.hello.urgent_waiting == 1
        yield again()  # the relay asked for it as it came: not to be answered with another Hello
        yield ack(0)
        batch = await next_message()
        assert batch.HasField("signals")
        yield ack(batch.signals.signals[-1].seq)
        async for _ in requests:
            pass

    def handler(self) -> grpc.GenericRpcHandler:
        connect = grpc.stream_stream_rpc_method_handler(self.connect)
        return grpc.method_handlers_generic_handler("vigil.v1.AgentGateway", {"Connect": connect})


def test_a_fault_while_the_relay_reaches_the_controller_again_is_said_in_a_hello_unasked(tmp_path: Path) -> None:
    async def scenario() -> None:
        relay = ScriptedRelay()
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((relay.handler(),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        spool, stop = Spool(tmp_path / "spool.db"), asyncio.Event()
        link = ControllerLink(
            f"127.0.0.1:{port}", spool, lambda: agent_pb2.Hello(node="n1", spool_id=spool.spool_id),
            answer_ok, heartbeat_s=0.2, hello_patience_first_s=0.5,
        )  # fmt: skip
        running = asyncio.create_task(link.run(stop))
        try:
            await asyncio.wait_for(relay.lost.wait(), 10)
            await asyncio.sleep(1.0)  # twice its patience, told to wait: it says nothing
            assert [m.WhichOneof("body") for m in relay.messages] == ["hello"]
            fault = Signal("n1", SignalKind.XID, GpuRef(0, "GPU-0"), 79, 0.0, "fallen off the bus", "test", 1.0)
            spool.append([fault])
            link.notify()
            await wait_until(lambda: spool.urgent_waiting() == 0, timeout=10, what="the fault acknowledged")
            assert [m.WhichOneof("body") for m in relay.messages] == ["hello", "hello", "signals"]
            assert (relay.streams, link.streams, link.connections, link.unanswered) == (1, 1, 2, 0)
            assert link.connected
        finally:
            stop.set()
            await running
            await server.stop(None)

    asyncio.run(scenario())


def test_only_a_hello_again_that_asks_now_is_read_as_one_that_crossed_a_hello_said_unasked() -> None:
    def message(**fields: object) -> agent_pb2.ControllerMessage:
        return agent_pb2.ControllerMessage(hello_again=agent_pb2.HelloAgain(**fields))  # type: ignore[arg-type]

    assert crossed(message())
    assert not crossed(message(wait=True))  # the controller lost again
    assert not crossed(message(wait=True, kept=True))
    assert not crossed(message(after_ms=500))  # a turn given: a Hello is due then
    assert not crossed(agent_pb2.ControllerMessage(ack=agent_pb2.Ack(acked_seq=3)))
    assert not crossed(grpc.aio.EOF)
