"""Where agents' signals come in: the agent gateway (gRPC). Each agent holds one stream: its Hello,
then batches of signals, heartbeats and check results; the controller's acks and commands go back
on it. Batches go to the engine (``controller.nodes.engine``) a chunk at a time.

Bad input gets a gRPC status that names the problem (and a log line); it never takes the server
down.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import NoReturn
from urllib.parse import unquote

import grpc
import structlog

from controller.edge.authz import caller
from controller.edge.hello_pacing import HelloPacing
from controller.edge.limits import LimitsConfig
from controller.nodes.agent_outboxes import AgentOutboxes, Outbox
from controller.nodes.check_requests import CheckRequests
from controller.nodes.engine import Engine
from controller.nodes.fleet import Fleet
from controller.nodes.guards.rules import RateLimiter
from controller.store.health import is_database_error
from protos.codec import BadSignal, signal_from_proto
from protos.vigil.v1 import agent_pb2, agent_pb2_grpc
from vigil_core.names import is_address, is_node_name
from vigil_core.rank_progress import RankRecord
from vigil_core.rpc_errors import RETRY_AFTER_KEY
from vigil_core.signals import Signal

log = structlog.get_logger(__name__)


def peer_host(peer: str) -> str:
    """The host part of a gRPC peer ("ipv4:10.0.0.7:41234", "ipv6:[fd00::7]:41234"); "" for others."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return ""
    host = unquote(rest).rpartition(":")[0]
    return host.strip("[]")


MAX_GPUS = 1024
MAX_IDLE_HEARTBEAT_S = 600.0  # an agent quiet longer than this could be stuck for half an hour unseen
RECEIVE_CHUNK = 50  # signals decided and committed between two turns of the event loop


def hello_problem(hello: agent_pb2.Hello) -> str:
    """What is wrong with an agent's Hello; "" when nothing. Pure."""
    if not is_node_name(hello.node):
        return f"Hello.node {hello.node[:100]!r} is not a valid node name"
    if not 0 < len(hello.spool_id) <= 128:
        return "Hello.spool_id must be 1 to 128 characters"
    if len(hello.gpus) > MAX_GPUS:
        return f"Hello.gpus lists {len(hello.gpus)} GPUs, more than {MAX_GPUS}"
    if not is_address(hello.address):
        return "Hello.address is not a host name or an IP address"
    if len(hello.agent_version) > 64 or len(hello.gpu_backend) > 32:
        return "Hello.agent_version or gpu_backend is too long"
    if not 0 <= hello.idle_heartbeat_s <= MAX_IDLE_HEARTBEAT_S:  # NaN fails this too
        return f"Hello.idle_heartbeat_s must be from 0 to {MAX_IDLE_HEARTBEAT_S:g} s"
    return ""


def seq_problem(signals: list[Signal], last_seq: int, max_gap: int) -> str:
    """Why a batch's numbering cannot be taken; "" when it can. A spool numbers its signals one by
    one (a gap is what its bound dropped, far below ``max_gap``), so a number far past the last one
    received is a broken or hostile agent: taken, it would make every later signal look replayed.
    Before anything was received from the spool, any number is the spool's own. Pure."""
    top = max((s.seq for s in signals), default=0)
    if last_seq and top - last_seq > max_gap:
        return f"signal seq={top} is {top - last_seq} past this spool's last ({last_seq}); at most {max_gap}"
    return ""


class AgentGateway(agent_pb2_grpc.AgentGatewayServicer):
    def __init__(
        self,
        engine: Engine,
        fleet: Fleet,
        checks: CheckRequests,
        outboxes: AgentOutboxes,
        limits: LimitsConfig | None = None,
    ) -> None:
        self._engine = engine  # an agent's session: hello, heartbeats, batches, going away
        self._fleet = fleet  # who is known already (limits.max_nodes), and each spool's last seq
        self._checks = checks  # the answers to the checks the controller asked for
        self._outboxes = outboxes  # the engine's too: what it sends a connected agent goes out here
        self._limits = limits or LimitsConfig()
        self._rate = RateLimiter(self._limits.agent_messages_per_s, self._limits.agent_burst)  # per node
        self._pacing = HelloPacing(self._limits.hellos_per_s, self._limits.hello_burst)  # the whole fleet's

    async def Connect(  # noqa: N802 (gRPC method name)
        self, request_iterator: AsyncIterator[agent_pb2.AgentMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[agent_pb2.ControllerMessage]:
        try:
            first = await asyncio.wait_for(anext(aiter(request_iterator), None), self._limits.first_message_s)
        except TimeoutError:
            why = f"no Hello within {self._limits.first_message_s:g} s of opening the stream"
            log.warning("call_refused", peer=context.peer(), why=why)
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, why)
        if first is None or not first.HasField("hello"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be Hello")
            return
        hello = first.hello
        node = hello.node
        if problem := hello_problem(hello):
            log.warning("bad_hello", peer=context.peer(), error=problem)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        who = caller()  # None in plaintext; under TLS, the node its certificate or its token names
        if who is not None and who.name != node:
            log.warning("call_refused", peer=context.peer(), why=f"{who} said Hello as {node}")
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{who} cannot report for {node}")
        fleet = self._fleet  # a name past the limit is refused before it takes a turn it cannot use
        if node not in fleet.nodes and len(fleet) >= self._limits.max_nodes:  # names are the caller's to make up
            why = f"{len(fleet)} nodes are known already (limits.max_nodes); {node!r} is not one of them"
            log.warning("call_refused", peer=context.peer(), why=why)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
        if (wait_s := self._pacing.ask(node, time.monotonic())) > 0:
            self._engine.metrics.hellos_paced.inc()
            why = f"{self._limits.hellos_per_s:g} agents/s are being admitted; {node}'s turn is in {wait_s:.1f} s"
            turn = ((RETRY_AFTER_KEY, str(int(wait_s * 1000))),)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why, trailing_metadata=turn)
        address = hello.address or peer_host(context.peer())
        outbox: Outbox | None = None
        try:
            acked = self._engine.hello(node, hello.spool_id, len(hello.gpus), address, hello.idle_heartbeat_s)
            await self._engine.durable()
            # Open now, whatever ended meanwhile: an older stream of this node's that closed while this
            # Hello was written counted the node as gone.
            outbox = self._outboxes.open(node)
            self._engine.connected(node)
        except Exception as exc:
            await self._cannot_record(exc, context)
        finally:
            # Not answered (the database failed, or the call was cancelled while the Hello was written:
            # the agent died or gave up on it), and no other stream of the node's is open: the node is
            # not connected, else a dead node would stay HEALTHY for three of its idle heartbeats.
            if outbox is None and not self._outboxes.is_open(node):
                self._engine.disconnected(node)
        log.info("agent_connected", node=node, peer=context.peer(), acked_seq=acked, gpus=len(hello.gpus))
        yield agent_pb2.ControllerMessage(ack=agent_pb2.Ack(acked_seq=acked))
        reader = asyncio.create_task(self._read(node, request_iterator, outbox, context))
        reader.add_done_callback(lambda _: outbox.put_nowait(None))  # the stream's end, after what came before
        try:
            while (message := await outbox.get()) is not None:
                yield message
            while not outbox.empty():  # what was queued as the stream ended (an ack) still goes
                if (late := outbox.get_nowait()) is not None:
                    yield late
            reader.result()  # re-raise an abort
        finally:
            reader.cancel()
            if self._outboxes.close(node, outbox):
                self._engine.disconnected(node)
            log.info("agent_disconnected", node=node)

    async def _read(
        self,
        node: str,
        requests: AsyncIterator[agent_pb2.AgentMessage],
        outbox: Outbox,
        context: grpc.aio.ServicerContext,
    ) -> None:
        async for msg in requests:
            if not self._rate.allow(node, time.monotonic()):  # the spool keeps what was not acknowledged
                why = f"{node} sends more than {self._limits.agent_messages_per_s:g} messages/s"
                log.warning("agent_rate_limited", node=node, why=why)
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
            body = msg.WhichOneof("body")
            if body == "heartbeat":
                beat = msg.heartbeat
                unparsed = list(beat.unparsed_lines)
                ranks = [RankRecord(r.job_id, r.rank, node, r.step, r.phase, r.at) for r in beat.ranks]
                self._engine.heartbeat(
                    node, beat.dropped_faults, beat.spooled, list(beat.jobs), unparsed, beat.unparsed_total, ranks
                )
            elif body == "signals":
                try:
                    signals = [signal_from_proto(s) for s in msg.signals.signals]
                except BadSignal as exc:
                    log.warning("bad_signal", node=node, error=str(exc))
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                if problem := seq_problem(signals, self._fleet.entry(node).last_seq, self._limits.max_seq_gap):
                    log.warning("bad_signal", node=node, error=problem)
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
                foreign = [s.node for s in signals if s.node != node]
                if foreign:
                    await context.abort(
                        grpc.StatusCode.PERMISSION_DENIED, f"agent for {node!r} sent a signal for {foreign[0]!r}"
                    )
                try:
                    acked = await self._receive(node, signals)
                    await self._engine.durable()  # the agent drops what is acknowledged: on disk first
                except Exception as exc:
                    await self._cannot_record(exc, context)
                outbox.put_nowait(agent_pb2.ControllerMessage(ack=agent_pb2.Ack(acked_seq=acked)))
            elif body == "check_result":
                self._checks.answered(node, msg.check_result)
            else:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unexpected message {body!r} after Hello")

    @staticmethod
    async def _cannot_record(exc: Exception, context: grpc.aio.ServicerContext) -> NoReturn:
        """The database failed (said aloud by the store's health): the agent is told UNAVAILABLE and
        keeps the batch in its spool, to send again. Anything else is a bug, raised as it is."""
        if not is_database_error(exc):
            raise exc
        await context.abort(
            grpc.StatusCode.UNAVAILABLE, f"the controller cannot record now ({exc!r:.200}): keep the signals, retry"
        )
        raise AssertionError("abort returned")  # grpc's abort always raises

    async def _receive(self, node: str, signals: list[Signal]) -> int:
        """Decide a batch in chunks, letting the event loop run between them: one node's flood never
        holds up another node's fault (or an operator's ``vigil status``) for a whole batch."""
        acked = 0
        for start in range(0, max(len(signals), 1), RECEIVE_CHUNK):
            if start:
                await asyncio.sleep(0)
            acked = self._engine.receive(node, signals[start : start + RECEIVE_CHUNK])
        return acked
