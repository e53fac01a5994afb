"""The agent's link says its Hello unasked when a fault waits while its relay reaches the controller
again (``HelloAgain.takes_urgent_hello``), over real gRPC on loopback against a scripted relay: one
Hello for the wait, a HelloAgain that crossed it not answered with another, the fault sent after the
Ack on the same stream."""

from __future__ import annotations

import asyncio
import contextlib
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


class Scripted:
    """A relay's side by hand: what the agent said (heartbeats aside) and how many Hellos."""

    def __init__(self) -> None:
        self.messages: list[agent_pb2.AgentMessage] = []
        self.lost = asyncio.Event()
        self.streams = self.hellos = 0

    async def next_message(self, reading: AsyncIterator[bytes]) -> agent_pb2.AgentMessage:
        while True:
            message = agent_pb2.AgentMessage.FromString(await anext(reading))
            if not message.HasField("heartbeat"):
                self.messages.append(message)
                self.hellos += message.HasField("hello")
                return message

    async def acknowledge_signals(self, reading: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The session after its Ack: the signals replayed acknowledged, the rest read to the end."""
        batch = await self.next_message(reading)
        assert batch.HasField("signals")
        yield ack(batch.signals.signals[-1].seq)
        async for _ in reading:
            pass

    async def connect(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        raise NotImplementedError
        yield b""

    def handler(self) -> grpc.GenericRpcHandler:
        connect = grpc.stream_stream_rpc_method_handler(self.connect)
        return grpc.method_handlers_generic_handler("vigil.v1.AgentGateway", {"Connect": connect})


@contextlib.asynccontextmanager
async def linked(relay: Scripted, tmp_path: Path) -> AsyncIterator[tuple[ControllerLink, Spool]]:
    """The real agent's link to ``relay`` (served on loopback), running until the block ends."""
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
        yield link, spool
    finally:
        stop.set()
        await running
        await server.stop(None)


def fault(link: ControllerLink, spool: Spool) -> None:
    spool.append([Signal("n1", SignalKind.XID, GpuRef(0, "GPU-0"), 79, 0.0, "fallen off the bus", "test", 1.0)])
    link.notify()  # as the agent's collector does once a signal is spooled


class ScriptedRelay(Scripted):
    """A session, then the controller lost (``HelloAgain{wait, takes_urgent_hello}``); the Hello said
    unasked is answered by a ``HelloAgain{}`` sent as it came (the crossing), then the Ack; the fault
    replayed after it is acknowledged."""

    async def connect(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self.streams += 1
        reading = aiter(requests)
        assert (await self.next_message(reading)).HasField("hello")
        yield ack(0)
        yield again(wait=True, takes_urgent_hello=True)
        self.lost.set()
        hello = await self.next_message(reading)  # said unasked: the fault below
        assert hello.HasField("hello") and hello.hello.urgent_waiting == 1
        yield again()  # the relay asked for it as it came: not to be answered with another Hello
        yield ack(0)
        async for answer in self.acknowledge_signals(reading):
            yield answer


def test_a_fault_while_the_relay_reaches_the_controller_again_is_said_in_a_hello_unasked(tmp_path: Path) -> None:
    async def scenario() -> None:
        relay = ScriptedRelay()
        async with linked(relay, tmp_path) as (link, spool):
            await asyncio.wait_for(relay.lost.wait(), 10)
            await asyncio.sleep(1.0)  # twice its patience, told to wait: it says nothing
            assert [m.WhichOneof("body") for m in relay.messages] == ["hello"]
            fault(link, spool)
            await wait_until(lambda: spool.urgent_waiting() == 0, timeout=10, what="the fault acknowledged")
            assert [m.WhichOneof("body") for m in relay.messages] == ["hello", "hello", "signals"]
            assert (relay.streams, link.streams, link.connections, link.unanswered) == (1, 1, 2, 0)
            assert link.connected

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


class EarlyRelay(Scripted):
    """A session, then the controller lost, the relay taking any Hello (``HelloAgain.takes_hello``):
    the agent's calm Hello said at once, then, a fault come, its urgent Hello; the Ack only once the
    test says (``answer``), then the faults' signals acknowledged."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = asyncio.Event()

    async def connect(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self.streams += 1
        reading = aiter(requests)
        assert (await self.next_message(reading)).HasField("hello")
        yield ack(0)
        yield again(wait=True, takes_urgent_hello=True, takes_hello=True)
        self.lost.set()
        while not (message := await self.next_message(reading)).hello.urgent_waiting:
            assert message.HasField("hello")  # the calm one, said at once
        await self.answer.wait()
        yield ack(0)
        async for answer in self.acknowledge_signals(reading):
            yield answer


def test_told_the_relay_takes_any_hello_an_agent_says_it_at_once_and_again_once_when_a_fault_comes(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        relay = EarlyRelay()
        async with linked(relay, tmp_path) as (link, spool):
            await asyncio.wait_for(relay.lost.wait(), 10)
            await wait_until(lambda: relay.hellos == 2, what="its Hello said at once, no fault waiting")
            assert relay.messages[-1].hello.urgent_waiting == 0
            await asyncio.sleep(1.0)  # twice its patience: a Hello the relay keeps is not given up on
            fault(link, spool)
            await wait_until(lambda: relay.hellos == 3, what="said again, the fault in it")
            fault(link, spool)  # another: its Hello said faults already, so not again
            await asyncio.sleep(0.5)
            assert relay.hellos == 3 and link.streams == 1
            relay.answer.set()
            await wait_until(lambda: spool.urgent_waiting() == 0, timeout=10, what="both faults acknowledged")
            assert [m.WhichOneof("body") for m in relay.messages] == ["hello", "hello", "hello", "signals"]
            assert len(relay.messages[-1].signals.signals) == 2
            assert (link.streams, link.connections, link.unanswered) == (1, 2, 0)

    asyncio.run(scenario())
