"""The admin service (gRPC) behind ``vigil status``, ``incidents``, ``uncordon``, ``resume``,
``sweep`` and ``jobs``. Bad input gets a gRPC status that names the problem."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import grpc
import structlog

from controller.act.actuators import SelectionError
from controller.edge.authz import caller
from controller.edge.sweep_updates import update_to_proto
from controller.jobs.monitor import JobMonitor
from controller.nodes.by_hand import ByHand, IncidentNotOpen, UnknownIncident
from controller.nodes.fleet import Fleet, UnknownNode
from controller.nodes.guards.guard import Guard
from controller.repairs.repairs import Repairs
from controller.store import IncidentLog
from controller.sweeps.result import SweepDone, SweepEvent
from controller.sweeps.spec import SweepError, sweep_spec
from controller.sweeps.sweeper import SweepBusy, Sweeper
from protos.codec import gpu_to_proto
from protos.vigil.v1 import admin_pb2, admin_pb2_grpc
from vigil_core.names import is_node_name

log = structlog.get_logger(__name__)


class Admin(admin_pb2_grpc.AdminServicer):
    def __init__(
        self,
        fleet: Fleet,
        by_hand: ByHand,
        guard: Guard,
        incidents: IncidentLog,
        problems: Callable[[], list[str]],
        sweeper: Sweeper,
        jobs: JobMonitor,
        replica: str = "",
        clock: Callable[[], float] = time.time,
        repairs: Repairs | None = None,
    ) -> None:
        self._repairs = repairs
        self._fleet = fleet  # read only, for status
        self._by_hand = by_hand  # what people ask by hand: uncordon, resolve, resume
        self._guard = guard  # the breaker's state
        self._incidents = incidents
        self._problems = problems  # what keeps the controller from its work now
        self._clock = clock
        self._sweeper = sweeper
        self._jobs = jobs
        self._replica = replica

    async def ListJobs(  # noqa: N802
        self, request: admin_pb2.JobsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.JobsReply:
        return admin_pb2.JobsReply(jobs=self._jobs.statuses())

    async def ListRepairs(  # noqa: N802
        self, request: admin_pb2.RepairsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.RepairsReply:
        if self._repairs is None:
            return admin_pb2.RepairsReply()
        r = self._repairs
        repairs = [
            admin_pb2.RepairStatus(
                node=x.node,
                incident_id=x.incident_id,
                phase=x.phase.value,
                step=x.step.value,
                ladder=[s.value for s in x.ladder],
                waiting_for=x.waiting_for,
                tried=list(x.tried),
                opened_at=x.opened_at,
                since=x.since,
            )  # fmt: skip
            for x in sorted(r.repairs.values(), key=lambda x: (x.phase.ended, x.node))
        ]
        return admin_pb2.RepairsReply(
            enabled=r.config.enabled, repairs=repairs, released=r.counts["released"], hands=r.counts["hands"]
        )

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
                open_incident=self._fleet.incident_of(name),
            )
            for name, e in sorted(self._fleet.entries())
        ]
        return admin_pb2.StatusReply(
            nodes=nodes,
            now=self._clock(),
            automation=self._guard.automation,
            held_nodes=list(self._guard.breaker.held),
            replica=self._replica,
            leader=True,  # only the leader serves: a standby replica has not opened its port
            problems=self._problems(),
        )

    async def ListIncidents(  # noqa: N802
        self, request: admin_pb2.IncidentsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.IncidentsReply:
        views = self._incidents.list(request.open_only, request.node, request.limit or 100)
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
        await _bounded(context, requested_by=request.requested_by, reason=request.reason)
        try:
            health, detail = await self._by_hand.uncordon(
                request.node, _who(request.requested_by), request.reason, request.verdict
            )
        except ValueError as exc:  # a verdict it does not know
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except UnknownNode:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no node named {request.node!r}")
        except Exception as exc:  # the API server refused or is down: say so, keep serving
            log.warning("uncordon_failed", node=request.node, error=repr(exc))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"could not release {request.node!r}: {exc}")
        return admin_pb2.UncordonReply(node=request.node, health=health.value, detail=detail)

    async def Resolve(  # noqa: N802
        self, request: admin_pb2.ResolveRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ResolveReply:
        await _bounded(context, requested_by=request.requested_by, note=request.note, incident_id=request.incident_id)
        try:
            node, health, detail = self._by_hand.resolve_incident(
                request.incident_id, _who(request.requested_by), request.note
            )
        except UnknownIncident:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no incident {request.incident_id[:200]!r}")
        except IncidentNotOpen as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return admin_pb2.ResolveReply(incident_id=request.incident_id, node=node, health=health.value, detail=detail)

    async def ListRules(  # noqa: N802
        self, request: admin_pb2.RulesRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.RulesReply:
        stats = await asyncio.to_thread(self._by_hand.rules)
        return admin_pb2.RulesReply(
            rules=[
                admin_pb2.RuleStats(
                    rule=s.rule,
                    quarantines=s.quarantines,
                    pages=s.pages,
                    undone=s.undone,
                    resolved_by_hand=s.resolved_by_hand,
                    repaired=s.repaired,
                    precision=s.precision if s.precision is not None else 0.0,
                )
                for s in stats
            ],
            undo_window_s=self._by_hand.undo_window_s,
        )

    async def Resume(  # noqa: N802
        self, request: admin_pb2.ResumeRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ResumeReply:
        await _bounded(context, requested_by=request.requested_by, reason=request.reason)
        if not self._guard.holding:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"automation is {self._guard.automation}")
        applied, dropped, nodes = await self._by_hand.resume(
            _who(request.requested_by), request.reason, request.apply_held
        )
        return admin_pb2.ResumeReply(automation=self._guard.automation, applied=applied, dropped=dropped, nodes=nodes)

    async def Sweep(  # noqa: N802
        self, request: admin_pb2.SweepRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[admin_pb2.SweepUpdate]:
        await _bounded(context, requested_by=request.requested_by)
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
                _who(request.requested_by),
            )
            nodes = await self._sweeper.select(list(request.nodes), request.selector, request.job, request.namespace)
        except (SweepError, SelectionError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        updates: asyncio.Queue[SweepEvent] = asyncio.Queue()
        try:
            sweep_id = self._sweeper.start(spec, nodes, updates.put_nowait)
        except SweepBusy as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        await context.send_initial_metadata((("sweep-id", sweep_id),))
        while True:
            event = await updates.get()
            if isinstance(event, SweepDone) and event.error:
                await context.abort(grpc.StatusCode.INTERNAL, f"sweep {sweep_id} broke: {event.error}")
            yield update_to_proto(event)
            if isinstance(event, SweepDone):
                return


def _who(requested_by: str) -> str:
    """Who asked, as recorded: the caller's certificate under TLS (what the client says of itself is
    kept as a note beside it); in plaintext only the client's word is there."""
    who = caller()
    said = requested_by.strip()
    if who is None:
        return said or "unknown"
    return str(who) if not said or said == str(who) else f"{who} (says {said!r})"


MAX_TEXT = {"requested_by": 200, "incident_id": 200, "reason": 2000, "note": 2000}


async def _bounded(context: grpc.aio.ServicerContext, **fields: str) -> None:
    """A person's words are kept (operator actions, Slack threads): each field within its bound,
    else INVALID_ARGUMENT naming it."""
    for name, text in fields.items():
        if len(text) > MAX_TEXT[name]:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"{name} is {len(text)} characters; at most {MAX_TEXT[name]}"
            )
