"""Checks the agent runs when the controller sends RunCheck.

The GPU health snapshot it answers itself, from the backend it already holds. The diagnostic
workloads (burn, bandwidth, all-reduce) live in ``checks/`` and run as subprocesses under the
request's deadline (``checks.runner``), so torch never enters the agent's process (a check the
controller stops, ``StopCheck``, ends with its processes: ``ControllerLink``); where torch is
not installed (the agent's own image) they answer UNKNOWN with that reason. An unknown check is
UNKNOWN, never OK.
"""

from __future__ import annotations

import asyncio
import time

from checks.codec import result_to_proto
from checks.runner import run_check_async
from gpus.backend import GpuBackend
from gpus.health import health_problems
from protos.vigil.v1 import agent_pb2, common_pb2


class LocalChecks:
    def __init__(self, node: str, backend: GpuBackend) -> None:
        self._node = node
        self._backend = backend

    async def run(self, request: agent_pb2.RunCheck) -> common_pb2.CheckResult:
        started = time.time()
        result = common_pb2.CheckResult(
            request_id=request.request_id, node=self._node, check=request.check, started_at=started
        )
        if request.check != "gpu_health":
            args = [a for key, value in sorted(request.params.items()) for a in (f"--{key}", value)]
            answer = await run_check_async(request.check, args, request.deadline_s or 120.0)
            # The agent's own request and times frame the answer, whatever the program reported.
            answered = result_to_proto(self._node, answer, request.request_id)
            result.verdict, result.reason = answered.verdict, answered.reason
            result.figures.update(answered.figures)
            result.not_run = answered.not_run
        else:
            try:
                readings = await asyncio.wait_for(
                    asyncio.to_thread(lambda: [self._backend.read(g.index) for g in self._backend.gpus()]),
                    timeout=request.deadline_s or 30.0,
                )
            except Exception as exc:  # a crashed or hung check is UNKNOWN, never a pass
                result.verdict = common_pb2.UNKNOWN
                result.reason = f"could not read GPUs: {exc!r}"
            else:
                problems = health_problems(readings)
                result.verdict = common_pb2.FAIL if problems else common_pb2.OK
                result.reason = "; ".join(problems) or f"{len(readings)} GPUs healthy"
                result.figures["gpus"] = len(readings)
        result.finished_at = time.time()
        return result
