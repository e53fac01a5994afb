"""The simulated fleet's agents give up on an unanswered Hello as the agent does, when asked
(``tests.fakes.fleet.Fleet(hello_patience_first_s=...)``): the scale benchmark's reconnection
figures count what real agents would do, over real gRPC on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from protos.vigil.v1 import agent_pb2
from tests.contract.test_call_taken import SlowToTake
from tests.fakes.fleet import Fleet
from tests.helpers import free_port
from vigil_core.call_taken import say_taken

ACK = agent_pb2.ControllerMessage(ack=agent_pb2.Ack(acked_seq=0)).SerializeToString()


class SlowGateway:
    """Answers no Hello on the first ``silent`` streams, then answers each with an Ack."""

    def __init__(self, silent: int) -> None:
        self.silent = silent
        self.streams = 0
        self.waited: list[float] = []  # each unanswered Hello: how long until its agent cancelled it

    async def connect(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self.streams += 1
        await say_taken(context)  # as Vigil's servers: the Hello's patience counts from here
        await anext(aiter(requests))  # the Hello
        if self.streams <= self.silent:
            said = asyncio.get_running_loop().time()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:  # the agent gave up: its call cancelled
                self.waited.append(asyncio.get_running_loop().time() - said)
                raise
        yield ACK
        async for _ in requests:
            pass

    def handler(self) -> grpc.GenericRpcHandler:
        connect = grpc.stream_stream_rpc_method_handler(self.connect)
        return grpc.method_handlers_generic_handler("vigil.v1.AgentGateway", {"Connect": connect})


async def served(
    gateway: SlowGateway, interceptors: tuple[grpc.aio.ServerInterceptor, ...] = ()
) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(interceptors=interceptors)
    server.add_generic_rpc_handlers((gateway.handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def test_a_simulated_agent_gives_up_on_an_unanswered_hello_and_waits_twice_as_long_the_next_time() -> None:
    async def scenario() -> None:
        gateway = SlowGateway(silent=2)
        server, port = await served(gateway)
        fleet = Fleet(f"127.0.0.1:{port}", ["n1"], heartbeat_s=60, hello_patience_first_s=0.3)
        started = asyncio.get_running_loop().time()
        await fleet.start(timeout_s=20)
        took = asyncio.get_running_loop().time() - started
        node = fleet.nodes["n1"]
        # Given up after 0.3 s, then after 0.6 s (twice as long), answered on the third stream.
        assert (gateway.streams, node.gave_up, fleet.gave_up, node.unanswered) == (3, 2, 2, 0)
        assert took >= 0.9
        assert "gave up on its Hello" in node.last_error
        await fleet.close()
        await server.stop(None)
        first, second = gateway.waited
        assert first >= 0.3 and second >= 0.6  # the patience doubled (wall time here: no upper bound)

    asyncio.run(scenario())


def test_without_a_patience_a_simulated_agent_waits_on() -> None:
    async def scenario() -> None:
        gateway = SlowGateway(silent=1)
        server, port = await served(gateway)
        fleet = Fleet(f"127.0.0.1:{port}", ["n1"], heartbeat_s=60)
        starting = asyncio.create_task(fleet.start(timeout_s=20))
        await asyncio.sleep(1.0)
        assert not starting.done() and gateway.streams == 1 and fleet.gave_up == 0
        starting.cancel()
        await fleet.close()
        await server.stop(None)

    asyncio.run(scenario())


def test_a_simulated_agent_counts_its_patience_once_the_server_has_taken_its_call() -> None:
    async def scenario() -> None:
        gateway = SlowGateway(silent=0)
        server, port = await served(gateway, (SlowToTake(),))  # each call taken 2 s late
        fleet = Fleet(f"127.0.0.1:{port}", ["n1"], heartbeat_s=60, hello_patience_first_s=0.3)
        await fleet.start(timeout_s=20)
        node = fleet.nodes["n1"]
        assert (gateway.streams, node.gave_up, node.reconnects) == (1, 0, 0)  # as the agent: no Hello given up
        await fleet.close()
        await server.stop(None)

    asyncio.run(scenario())


def test_a_simulated_agent_with_a_fault_waiting_opens_its_stream_on_the_urgent_port_and_falls_back_when_closed() -> (
    None
):
    """As the agent (``vigil_core.urgent_port``): the scale benchmark's faults while a fleet connects
    go by the urgent port, and one not reached sends its agent to the main port."""

    async def scenario() -> None:
        main, urgent = SlowGateway(silent=0), SlowGateway(silent=0)
        (main_server, main_port), (urgent_server, urgent_port) = await served(main), await served(urgent)
        closed = free_port()
        fleet = Fleet(f"127.0.0.1:{main_port}", ["n1", "n2"], heartbeat_s=60, urgent_target=f"127.0.0.1:{urgent_port}")
        fleet.nodes["n1"].fault()
        elsewhere = Fleet(f"127.0.0.1:{main_port}", ["n3"], heartbeat_s=60, urgent_target=f"127.0.0.1:{closed}")
        elsewhere.nodes["n3"].fault()
        try:
            await fleet.start(timeout_s=20)
            await elsewhere.start(timeout_s=20)
            # n1 on the urgent port; n2 (nothing waiting) and n3 (its urgent port closed) on the main one.
            assert [fleet.nodes[n].urgent_streams for n in ("n1", "n2")] == [1, 0]
            assert (urgent.streams, main.streams) == (1, 2)
            assert elsewhere.nodes["n3"].urgent_streams == 1 and elsewhere.nodes["n3"].reconnects == 1
        finally:
            await fleet.close()
            await elsewhere.close()
            await main_server.stop(None)
            await urgent_server.stop(None)

    asyncio.run(scenario())


def test_a_simulated_agent_whose_fault_comes_while_its_hello_waits_leaves_for_the_urgent_port() -> None:
    """As the agent (``agent.link.FaultCame``): the scale benchmark's ``--faults-come-s`` faults end
    a Hello's wait on the main port (here, a server that never answers it) for the urgent port; with
    ``leave_for_urgent`` off (``--agents-wait-their-turn``) the fault waits with its Hello."""

    async def scenario() -> None:
        main, urgent = SlowGateway(silent=10), SlowGateway(silent=0)
        (main_server, main_port), (urgent_server, urgent_port) = await served(main), await served(urgent)
        fleet = Fleet(f"127.0.0.1:{main_port}", ["n1", "n2"], heartbeat_s=60, urgent_target=f"127.0.0.1:{urgent_port}")
        fleet.nodes["n2"].leave_for_urgent = False
        starting = asyncio.ensure_future(fleet.start(timeout_s=20))
        try:
            while main.streams < 2:  # both Hellos said on the main port, neither answered
                await asyncio.sleep(0.02)
            for node in fleet.nodes.values():
                node.fault()
            await asyncio.wait_for(fleet.nodes["n1"].ready.wait(), 5)
            assert (fleet.nodes["n1"].left_for_urgent, fleet.nodes["n1"].urgent_streams, urgent.streams) == (1, 1, 1)
            await asyncio.sleep(0.3)
            assert not fleet.nodes["n2"].ready.is_set() and fleet.nodes["n2"].left_for_urgent == 0
        finally:
            starting.cancel()
            await fleet.close()
            await main_server.stop(None)
            await urgent_server.stop(None)

    asyncio.run(scenario())
