"""The trainer gateway: training jobs report their progress, launchers ask for their plan.

Both are unary calls: a job's rank 0 reports once per window and polls once a second in between,
so a command waits at most that long; the controller never holds a stream per job.

Under mutual TLS a job belongs to the ``trainer:`` identity that first reported or planned it: another
trainer's certificate may neither report it (its nodes, its step times, its end) nor plan it
(PERMISSION_DENIED, logged). An ``admin:`` certificate may speak for any job. The binding lives as
long as the controller process: after a restart the first caller binds the job again.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import grpc
import structlog

from controller.edge.authz import caller
from controller.edge.limits import LimitsConfig
from controller.jobs.monitor import JobMonitor
from controller.jobs.state import BadProgress, TooManyJobs
from controller.nodes.guards.rules import RateLimiter
from protos.vigil.v1 import trainer_pb2, trainer_pb2_grpc

log = structlog.get_logger(__name__)


MAX_TRACKED_JOBS = 10_000


class TrainerGateway(trainer_pb2_grpc.TrainerGatewayServicer):
    def __init__(self, jobs: JobMonitor, limits: LimitsConfig | None = None) -> None:
        self._jobs = jobs
        self._limits = limits or LimitsConfig()
        # Per job id, its reports and its launcher's plans; ids are the client's to choose.
        self._rate = RateLimiter(self._limits.reports_per_s, self._limits.report_burst, MAX_TRACKED_JOBS)
        self._owners: OrderedDict[str, str] = OrderedDict()  # job id -> the trainer identity that owns it

    async def _owned(self, job_id: str, context: grpc.aio.ServicerContext) -> None:
        """A trainer speaks only for its own jobs (under TLS; in plaintext nobody is checked)."""
        who = caller()
        if who is None or who.role != "trainer":
            return
        owner = self._owners.setdefault(job_id[:128], str(who))
        self._owners.move_to_end(job_id[:128])
        if len(self._owners) > MAX_TRACKED_JOBS:
            self._owners.popitem(last=False)
        if owner != str(who):
            why = f"job {job_id[:128]!r} belongs to {owner}; {who} may not report or plan it"
            log.warning("call_refused", peer=context.peer(), why=why)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)

    async def _within_rate(self, job_id: str, context: grpc.aio.ServicerContext) -> None:
        if not self._rate.allow(job_id[:128], time.monotonic()):
            why = f"job {job_id[:128]!r} calls more than {self._limits.reports_per_s:g} times/s"
            log.warning("job_rate_limited", peer=context.peer(), why=why)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)

    async def Report(  # noqa: N802 (gRPC method name)
        self, request: trainer_pb2.Progress, context: grpc.aio.ServicerContext
    ) -> trainer_pb2.ReportReply:
        await self._within_rate(request.job_id, context)
        await self._owned(request.job_id, context)
        try:
            commands = self._jobs.report(request)
        except BadProgress as exc:
            log.warning("bad_progress", job=request.job_id[:200], peer=context.peer(), error=str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except TooManyJobs as exc:
            log.warning("job_refused", job=request.job_id[:200], peer=context.peer(), why=str(exc))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        interval = self._jobs.recommended_checkpoint_s(request.job_id)
        return trainer_pb2.ReportReply(commands=commands, recommended_checkpoint_s=interval)

    async def Plan(  # noqa: N802
        self, request: trainer_pb2.PlanRequest, context: grpc.aio.ServicerContext
    ) -> trainer_pb2.PlanReply:
        await self._within_rate(request.job_id, context)
        await self._owned(request.job_id, context)
        try:
            return self._jobs.restart_plan(request)
        except BadProgress as exc:
            log.warning("bad_plan_request", job=request.job_id[:200], peer=context.peer(), error=str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # unreachable: abort raises
