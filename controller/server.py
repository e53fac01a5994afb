"""The controller's gRPC services: the agent gateway and the admin service (the trainer gateway
is in ``controller.trainer_gateway``).

Bad input gets a gRPC status that names the problem (and a log line); it never takes the server
down.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from urllib.parse import unquote

import grpc
import structlog

from controller.actuators import SelectionError
from controller.agent_outboxes import AgentOutboxes
from controller.authz import caller
from controller.config import LimitsConfig
from controller.engine import Engine, UnknownNode
from controller.guard_rules import RateLimiter
from controller.jobs import JobMonitor
from controller.sweep import SweepBusy, Sweeper
from controller.sweep_spec import SweepError, sweep_spec
from protos.codec import BadSignal, gpu_to_proto, signal_from_proto
from protos.vigil.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, agent_pb2_grpc
from vigil_core.names import is_address, is_node_name
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
    return ""


class AgentGateway(agent_pb2_grpc.AgentGatewayServicer):
    def __init__(self, engine: Engine, outboxes: AgentOutboxes, limits: LimitsConfig | None = None) -> None:
        self._engine = engine
        self._outboxes = outboxes  # the engine's too: what it sends a connected agent goes out here
        self._limits = limits or LimitsConfig()
        self._rate = RateLimiter(self._limits.agent_messages_per_s, self._limits.agent_burst)  # per node

    async def Connect(  # noqa: N802 (gRPC method name)
        self, request_iterator: AsyncIterator[agent_pb2.AgentMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[agent_pb2.ControllerMessage]:
        first = await anext(aiter(request_iterator), None)
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
        address = hello.address or peer_host(context.peer())
        acked = self._engine.hello(node, hello.spool_id, len(hello.gpus), address)
        log.info("agent_connected", node=node, peer=context.peer(), acked_seq=acked, gpus=len(hello.gpus))
        outbox = self._outboxes.open(node)
        yield agent_pb2.ControllerMessage(ack=agent_pb2.Ack(acked_seq=acked))
        reader = asyncio.create_task(self._read(node, request_iterator, outbox, context))
        try:
            while True:
                getter = asyncio.create_task(outbox.get())
                done, _ = await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    yield getter.result()
                    continue
                getter.cancel()
                while not outbox.empty():
                    yield outbox.get_nowait()
                reader.result()  # re-raise an abort
                return
        finally:
            reader.cancel()
            if self._outboxes.close(node, outbox):
                self._engine.disconnected(node)
            log.info("agent_disconnected", node=node)

    async def _read(
        self,
        node: str,
        requests: AsyncIterator[agent_pb2.AgentMessage],
        outbox: asyncio.Queue[agent_pb2.ControllerMessage],
        context: grpc.aio.ServicerContext,
    ) -> None:
        async for msg in requests:
            if not self._rate.allow(node, time.monotonic()):  # the spool keeps what was not acknowledged
                why = f"{node} sends more than {self._limits.agent_messages_per_s:g} messages/s"
                log.warning("agent_rate_limited", node=node, why=why)
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
            body = msg.WhichOneof("body")
            if body == "heartbeat":
                self._engine.heartbeat(node, msg.heartbeat.dropped_faults)
            elif body == "signals":
                try:
                    signals = [signal_from_proto(s) for s in msg.signals.signals]
                except BadSignal as exc:
                    log.warning("bad_signal", node=node, error=str(exc))
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                foreign = [s.node for s in signals if s.node != node]
                if foreign:
                    await context.abort(
                        grpc.StatusCode.PERMISSION_DENIED, f"agent for {node!r} sent a signal for {foreign[0]!r}"
                    )
                acked = await self._receive(node, signals)
                outbox.put_nowait(agent_pb2.ControllerMessage(ack=agent_pb2.Ack(acked_seq=acked)))
            elif body == "check_result":
                self._engine.checks.answered(node, msg.check_result)
            else:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unexpected message {body!r} after Hello")

    async def _receive(self, node: str, signals: list[Signal]) -> int:
        """Decide a batch in chunks, letting the event loop run between them: one node's flood never
        holds up another node's fault (or an operator's ``vigil status``) for a whole batch."""
        acked = 0
        for start in range(0, max(len(signals), 1), RECEIVE_CHUNK):
            if start:
                await asyncio.sleep(0)
            acked = self._engine.receive(node, signals[start : start + RECEIVE_CHUNK])
        return acked


class Admin(admin_pb2_grpc.AdminServicer):
    def __init__(self, engine: Engine, sweeper: Sweeper, jobs: JobMonitor, replica: str = "") -> None:
        self._engine = engine
        self._sweeper = sweeper
        self._jobs = jobs
        self._replica = replica

    async def ListJobs(  # noqa: N802
        self, request: admin_pb2.JobsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.JobsReply:
        return admin_pb2.JobsReply(jobs=self._jobs.statuses())

    async def GetStatus(  # noqa: N802
        self, request: admin_pb2.StatusRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.StatusReply:
        nodes = [
            admin_pb2.NodeStatus(
                node=name,
                health=e.state.health.value,
                last_heartbeat=e.last_heartbeat,
                last_seq=e.last_seq,
                gpus=e.gpus,
                open_incident=self._engine.open_incident.get(name, ""),
            )
            for name, e in sorted(self._engine.nodes.items())
        ]
        return admin_pb2.StatusReply(
            nodes=nodes,
            now=self._engine.clock(),
            automation=self._engine.automation,
            held_nodes=list(self._engine.breaker.held),
            replica=self._replica,
            leader=True,  # only the leader serves: a standby replica has not opened its port
        )

    async def ListIncidents(  # noqa: N802
        self, request: admin_pb2.IncidentsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.IncidentsReply:
        views = self._engine.store.incidents(request.open_only, request.node, request.limit or 100)
        return admin_pb2.IncidentsReply(
            incidents=[
                admin_pb2.Incident(
                    id=v.id,
                    node=v.node,
                    gpu=gpu_to_proto(v.gpu),
                    kind=v.kind,
                    code=v.code,
                    reason=v.meaning,
                    remedy=v.remedy,
                    status=v.status,
                    signal_count=v.signal_count,
                    first_observed_at=v.first_observed_at,
                    received_at=v.received_at,
                    opened_at=v.opened_at,
                    first_message=v.first_message,
                    actions=[
                        admin_pb2.ActionRecord(
                            kind=a.kind,
                            status=a.status,
                            requested_at=a.requested_at,
                            done_at=a.done_at or 0.0,
                            detail=a.detail,
                        )
                        for a in v.actions
                    ],
                )
                for v in views
            ]
        )

    async def Uncordon(  # noqa: N802
        self, request: admin_pb2.UncordonRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.UncordonReply:
        try:
            health, detail = await self._engine.uncordon(
                request.node, request.requested_by or "unknown", request.reason
            )
        except UnknownNode:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no node named {request.node!r}")
        except Exception as exc:  # the API server refused or is down: say so, keep serving
            log.warning("uncordon_failed", node=request.node, error=repr(exc))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"could not release {request.node!r}: {exc}")
        return admin_pb2.UncordonReply(node=request.node, health=health.value, detail=detail)

    async def Resume(  # noqa: N802
        self, request: admin_pb2.ResumeRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ResumeReply:
        if not self._engine.breaker.tripped:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"automation is {self._engine.automation}")
        applied, dropped = await self._engine.resume(
            request.requested_by or "unknown", request.reason, request.apply_held
        )
        return admin_pb2.ResumeReply(automation=self._engine.automation, applied=applied, dropped=dropped)

    async def Sweep(  # noqa: N802
        self, request: admin_pb2.SweepRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[admin_pb2.SweepUpdate]:
        bad = [n for n in request.nodes if not is_node_name(n)]
        if bad:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a node name: {bad[0]!r}")
        try:
            spec = sweep_spec(
                self._sweeper.config,
                list(request.checks),
                dict(request.params),
                request.quarantine,
                request.min_busbw_gbps,
                request.requested_by,
            )
            nodes = await self._sweeper.select(list(request.nodes), request.selector, request.job, request.namespace)
        except (SweepError, SelectionError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        updates: asyncio.Queue[admin_pb2.SweepUpdate] = asyncio.Queue()
        try:
            sweep_id = self._sweeper.start(spec, nodes, updates.put_nowait)
        except SweepBusy as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        await context.send_initial_metadata((("sweep-id", sweep_id),))
        while True:
            update = await updates.get()
            if update.error:
                await context.abort(grpc.StatusCode.INTERNAL, f"sweep {sweep_id} broke: {update.error}")
            yield update
            if update.phase == "done":
                return
