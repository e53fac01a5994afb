"""The trainer gateway: training jobs report their progress, launchers ask for their plan.

Both are unary calls: a job's rank 0 reports once per window and polls once a second in between,
so a command waits at most that long; the controller never holds a stream per job.
"""

from __future__ import annotations

import grpc
import structlog

from controller.jobs import BadProgress, JobMonitor
from protos.vigil.v1 import trainer_pb2, trainer_pb2_grpc

log = structlog.get_logger(__name__)


class TrainerGateway(trainer_pb2_grpc.TrainerGatewayServicer):
    def __init__(self, jobs: JobMonitor) -> None:
        self._jobs = jobs

    async def Report(  # noqa: N802 (gRPC method name)
        self, request: trainer_pb2.Progress, context: grpc.aio.ServicerContext
    ) -> trainer_pb2.ReportReply:
        try:
            commands = self._jobs.report(request)
        except BadProgress as exc:
            log.warning("bad_progress", job=request.job_id[:200], peer=context.peer(), error=str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return trainer_pb2.ReportReply(commands=commands)

    async def Plan(  # noqa: N802
        self, request: trainer_pb2.PlanRequest, context: grpc.aio.ServicerContext
    ) -> trainer_pb2.PlanReply:
        try:
            return self._jobs.plan(request)
        except BadProgress as exc:
            log.warning("bad_plan_request", job=request.job_id[:200], peer=context.peer(), error=str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # unreachable: abort raises
