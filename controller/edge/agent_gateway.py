"""Where agents' signals come in: the agent gateway (gRPC). Each agent holds one stream: its Hello,
then batches of signals, heartbeats and check results; the controller's acks and commands go back
on it. What each message does is the agent's session's (``controller.edge.agent_sessions``), the
same for an agent that comes through a relay (``controller.edge.relay_gateway``).

Bad input gets a gRPC status that names the problem (and a log line); it never takes the server
down. The controller's urgent port (``vigil_core.urgent_port``) serves a gateway of its own over
the same sessions, which takes only agents whose Hello says faults wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import NoReturn

import grpc
import structlog

from controller.edge.agent_sessions import AgentSessions, Refused, first_hello
from controller.edge.authz import caller
from controller.nodes.agent_outboxes import Message, Outbox
from protos.vigil.v1 import agent_pb2, agent_pb2_grpc
from vigil_core.call_taken import say_taken
from vigil_core.loop_lag import loop_time, within
from vigil_core.rpc_errors import RETRY_AFTER_KEY

log = structlog.get_logger(__name__)


class AgentGateway(agent_pb2_grpc.AgentGatewayServicer):
    def __init__(
        self, sessions: AgentSessions, own_time: Callable[[], float] = loop_time, urgent_only: bool = False
    ) -> None:
        self._sessions = sessions
        self._own_time = own_time  # an agent's Hello is awaited on the loop's own time (vigil_core.loop_lag)
        self.urgent_only = urgent_only  # the urgent port's: agents with faults waiting only

    async def Connect(  # noqa: N802 (gRPC method name)
        self, request_iterator: AsyncIterator[agent_pb2.AgentMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[agent_pb2.ControllerMessage]:
        sessions, peer = self._sessions, context.peer()
        await say_taken(context)  # the agent's Hello patience counts from here (vigil_core.call_taken)
        try:
            first = await within(anext(aiter(request_iterator), None), sessions.limits.first_message_s, self._own_time)
        except TimeoutError:
            why = f"no Hello within {sessions.limits.first_message_s:g} s of opening the stream"
            log.warning("call_refused", peer=peer, why=why)
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, why)
        outbox = Outbox[Message]()
        try:
            hello = first_hello(first)
            # caller: None in plaintext; under TLS, whom it proved to be
            sessions.admit(hello, caller(), peer, urgent_port=self.urgent_only)
            acked = await sessions.start(hello, peer, outbox)
        except Refused as refused:
            await _abort(context, refused)
        node = hello.node
        yield agent_pb2.ControllerMessage(ack=agent_pb2.Ack(acked_seq=acked))
        reader = asyncio.create_task(self._read(node, request_iterator, outbox))
        reader.add_done_callback(lambda _: outbox.put_nowait(None))  # the stream's end, after what came before
        try:
            while (message := await outbox.get()) is not None:
                yield message
            while not outbox.empty():  # what was queued as the stream ended (an ack) still goes
                if (late := outbox.get_nowait()) is not None:
                    yield late
            try:
                reader.result()
            except Refused as refused:
                await _abort(context, refused)
        finally:
            reader.cancel()
            sessions.end(node, outbox)

    async def _read(self, node: str, requests: AsyncIterator[agent_pb2.AgentMessage], outbox: Outbox[Message]) -> None:
        async for msg in requests:
            await self._sessions.handle(node, msg, outbox)


async def _abort(context: grpc.aio.ServicerContext, refused: Refused) -> NoReturn:
    turn = ((RETRY_AFTER_KEY, str(refused.retry_after_ms)),) if refused.retry_after_ms else None
    await context.abort(refused.code, refused.why, trailing_metadata=turn or ())
    raise AssertionError("abort returned")  # grpc's abort always raises
