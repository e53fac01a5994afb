"""A relay carries the agents whose Hello says faults wait on a stream of its own to the controller
(``controller.relay.uplink``), over real gRPC on loopback: against a controller that stops reading
the relay's stream at the fleet's first Hello, as one far behind does, a fault's Hello is still
read and answered."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from protos.vigil.v1 import agent_pb2, relay_pb2
from tests.contract.test_relay import RawAgent, Relay
from tests.contract.test_relay_hello_room import SilentController


class StuckController(SilentController):
    """Answers a relay's Hellos that say faults wait; stops reading a relay stream at its first
    other Hello (what it sent before that still read)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.stuck = asyncio.Event()

    async def relay(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self.calls += 1
        answers: asyncio.Queue[relay_pb2.RelayDown] = asyncio.Queue()

        async def read() -> None:
            async for raw in requests:
                for item in relay_pb2.RelayUp.FromString(raw).items:
                    if not item.message:
                        continue
                    hello = agent_pb2.AgentMessage.FromString(item.message).hello
                    if hello.urgent_waiting <= 0:
                        self.stuck.set()
                        await asyncio.Event().wait()  # never reads this stream again
                    ack = agent_pb2.ControllerMessage(ack=agent_pb2.Ack(acked_seq=0)).SerializeToString()
                    answers.put_nowait(relay_pb2.RelayDown(items=[relay_pb2.DownItem(stream=item.stream, message=ack)]))

        reader = asyncio.create_task(read())
        try:
            while True:
                yield (await answers.get()).SerializeToString()
        finally:
            reader.cancel()


def test_a_fault_s_hello_is_answered_while_the_fleet_s_stream_to_the_controller_is_not_read() -> None:
    async def scenario() -> None:
        controller = StuckController()
        await controller.server.start()
        try:
            async with Relay(controller.port) as relay:
                calm = [RawAgent(relay.port) for _ in range(3)]
                for i, agent in enumerate(calm):
                    await agent.hello(f"node-{i}", waits=True)
                await asyncio.wait_for(controller.stuck.wait(), 10)  # the fleet's stream is read no more
                urgent = RawAgent(relay.port)
                await urgent.hello("node-x", waits=True, urgent=1)
                assert (await urgent.read()).HasField("ack")  # it came on the urgent stream
                assert controller.calls == 2
                for agent in (*calm, urgent):
                    await agent.close()
        finally:
            await controller.server.stop(0)

    asyncio.run(scenario())
