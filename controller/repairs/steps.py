"""A repair's step carried out: a GPU or bus reset by the node's agent or a reset Job, with the GPU
Operator's components paused around it, or a reboot asked of the configured executor; the evidence
bundle kept before each. Returns what the pure ``step_done`` makes of the executor's answer."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

import structlog

from controller.nodes.check_requests import CheckRequests
from controller.repairs.config import RemediationConfig
from controller.repairs.ladder import Step
from controller.repairs.reboot import Reboot, RebootFailed
from controller.repairs.repair import Phase, Repair, done_as_of, step_done
from controller.store import IncidentLog, Records
from protos.vigil.v1 import agent_pb2, common_pb2

log = structlog.get_logger(__name__)

EVIDENCE_INCIDENTS = 20  # the node's latest incidents in an evidence bundle
EVIDENCE_CHARS = 24_576
# The GPU Operator's per-node switches for its components that hold the GPUs open (NVIDIA's
# documented way to stop them on one node); restored to what they were after the step.
OPERATOR_PAUSE = {
    "nvidia.com/gpu.deploy.device-plugin": "false",
    "nvidia.com/gpu.deploy.dcgm-exporter": "false",
    "nvidia.com/gpu.deploy.dcgm": "false",
    "nvidia.com/gpu.deploy.gpu-feature-discovery": "false",
}
OPERANDS_GONE_S = 120.0  # how long the paused components' pods may take to leave the node


@runtime_checkable
class NodeOwners(Protocol):
    def held_by_others(self, node: str) -> str: ...

    def set_labels(self, node: str, labels: dict[str, str | None]) -> dict[str, str | None]: ...

    def operand_pods(self, node: str) -> list[str]:
        """The GPU Operator's component pods still on the node (those OPERATOR_PAUSE stops)."""
        ...


class ResetJobs(Protocol):
    """Resets run as a short-lived privileged Job on the node (``remediation.resets: job``)."""

    def run_remedy_job(
        self, node: str, name: str, namespace: str, image: str, remedy: str, gpus: Sequence[str], deadline_s: float
    ) -> None: ...

    def remedy_result(self, namespace: str, name: str) -> dict[str, Any] | None: ...


class Steps:
    def __init__(
        self,
        config: RemediationConfig,
        incidents: IncidentLog,
        checks: CheckRequests,
        owners: NodeOwners,
        reboot: Reboot,
        records: Records,
        clock: Callable[[], float],
        jobs: ResetJobs | None = None,
    ) -> None:
        if config.enabled and config.resets == "job" and jobs is None:
            raise ValueError("remediation.resets job needs the Kubernetes actuator (actuator: kubernetes)")
        self.config = config
        self._incidents = incidents
        self._checks = checks
        self._owners = owners
        self._reboot = reboot
        self._records = records
        self._clock = clock
        self._jobs = jobs
        self.evidence: dict[str, str] = {}  # incident -> the latest evidence bundle (also in the records)

    def _keep_evidence(self, repair: Repair, found_on_node: str = "") -> None:
        """The evidence bundle before a destructive step, kept with the incident (bounded): the node's
        recent signals as the controller has them, then what the node showed (``nvidia-smi -q``,
        the driver's kernel-log lines) where the step's executor gathered it."""
        recent = self._incidents.list(node=repair.node, limit=EVIDENCE_INCIDENTS)
        lines = [
            f"{time.strftime('%H:%M:%S', time.gmtime(i.first_observed_at))} {i.kind} {i.code} "
            f"GPU {i.gpu.pci_bus_id or '-'} x{i.signal_count} {i.status}: {i.first_message[:200]}"
            for i in recent
        ]
        text = f"before {repair.step.said} (attempt {repair.attempt}) on {repair.node}\n$ its recent signals\n"
        text += "\n".join(lines) + (f"\n\n{found_on_node}" if found_on_node else "")
        self.evidence[repair.incident_id] = text[:EVIDENCE_CHARS]
        self._records.set_meta(f"evidence:{repair.incident_id}:{repair.attempt}", text[:EVIDENCE_CHARS])

    async def run(self, repair: Repair) -> Repair:
        """Carry out the repair's step; returns the repair as it stands after it (running on, for a
        reboot, until the node's agent says Hello from a new boot)."""
        # Once more, right before acting: someone may have taken the node since the last reading.
        if others := await self._held(repair.node):
            return replace(repair, phase=Phase.WAITING, waiting_for=f"owner: {others}")
        self._keep_evidence(repair)
        if repair.step is Step.REBOOT:
            asked_at = self._clock()
            try:
                detail = await asyncio.to_thread(self._reboot.reboot, repair.node, repair.attempt)
            except RebootFailed as exc:
                return step_done(repair, False, False, str(exc), self._clock())
            log.info("reboot_asked", node=repair.node, detail=detail)
            return replace(repair, since=asked_at)  # running until its agent says Hello from a new boot
        return await self._on_agent(repair)

    async def _held(self, node: str) -> str:
        """Who else holds the node now ('' when nobody), read from the cluster."""
        try:
            return await asyncio.to_thread(self._owners.held_by_others, node)
        except Exception as exc:
            return f"cannot read the node: {exc!r}"[:200]

    async def _on_agent(self, repair: Repair) -> Repair:
        node, step = repair.node, repair.step
        run = agent_pb2.RunRemedy(
            request_id=f"repair-{repair.incident_id}-{repair.attempt}",
            remedy=step.value,
            pci_bus_ids=list(repair.gpus),
            deadline_s=self.config.timeout_s(step),
        )
        paused = await asyncio.to_thread(self._pause_operator, node)
        try:
            if paused and (left := await self._operands_gone(node)):
                return step_done(repair, False, False, f"the GPU Operator's {left} still on the node", self._clock())
            # Read once more right before the reset: pausing the GPU Operator took a while, and a
            # person who took the node meanwhile (a taint, a drain) must not find it reset.
            if others := await self._held(node):
                return replace(repair, phase=Phase.WAITING, waiting_for=f"owner: {others}")
            if self._jobs is not None and self.config.resets == "job":
                return await self._by_job(repair, run, self._jobs)
            future = self._checks.ask_remedy(node, run)
            if future is None:
                return step_done(repair, False, False, "the node's agent is not connected", self._clock())
            wait_s = self.config.timeout_s(step) + self.config.agent_answer_s
            try:
                answer = await asyncio.wait_for(future, wait_s)
            except TimeoutError:
                self._checks.forget(run.request_id)
                return step_done(repair, False, False, f"no answer from the agent within {wait_s:g} s", self._clock())
        finally:
            await asyncio.to_thread(self._restore_operator, node, paused)
        if answer.evidence:
            self._keep_evidence(repair, answer.evidence)
        ok, busy = answer.verdict == common_pb2.OK, answer.figures.get("busy", 0) > 0
        return done_as_of(step_done(repair, ok, busy, answer.reason, self._clock()), answer.finished_at)

    async def _by_job(self, repair: Repair, run: agent_pb2.RunRemedy, jobs: ResetJobs) -> Repair:
        """The reset as a privileged Job on the node; its result read back from its pod."""
        name = f"vigil-{run.remedy.replace('_', '-')}-{repair.node}-{repair.attempt}"[:63].rstrip("-")
        namespace = self.config.reboot.namespace
        try:
            await asyncio.to_thread(
                jobs.run_remedy_job, repair.node, name, namespace, self.config.resets_image, run.remedy,
                list(run.pci_bus_ids), run.deadline_s,
            )  # fmt: skip
        except Exception as exc:  # the API server refused it: said, and the ladder climbs
            return step_done(repair, False, False, f"the reset Job could not be created: {exc!r}"[:300], self._clock())
        give_up = self._clock() + run.deadline_s + self.config.agent_answer_s
        while (result := await asyncio.to_thread(jobs.remedy_result, namespace, name)) is None:
            if self._clock() > give_up:
                return step_done(repair, False, False, f"the reset Job {name} gave no result", self._clock())
            await asyncio.sleep(1.0)
        if evidence := str(result.get("evidence") or ""):
            self._keep_evidence(repair, evidence)
        ok, busy = result.get("verdict") == "OK", bool(result.get("busy"))
        done = step_done(repair, ok, busy, f"{result.get('reason', '')} (Job {namespace}/{name})", self._clock())
        return done_as_of(done, _seconds(result.get("finished_at")))

    def _pause_operator(self, node: str) -> dict[str, str | None]:
        try:
            return self._owners.set_labels(node, dict[str, str | None](OPERATOR_PAUSE))
        except Exception as exc:  # said; the agent's own check refuses a GPU still held open
            log.warning("gpu_operator_not_paused", node=node, error=repr(exc)[:300])
            return {}

    async def _operands_gone(self, node: str) -> str:
        """Wait (up to ``OPERANDS_GONE_S``) until the paused components' pods have left the node: they
        hold the GPUs open, and a reset would be refused "in use by another client". Returns what is
        still there ('' once all have gone)."""
        deadline = self._clock() + OPERANDS_GONE_S
        while True:
            try:
                left = await asyncio.to_thread(self._owners.operand_pods, node)
            except Exception as exc:  # the API server away: go on; the reset itself says what holds the GPU
                log.warning("gpu_operator_pods_not_read", node=node, error=repr(exc)[:300])
                return ""
            if not left or self._clock() >= deadline:
                return ", ".join(left)
            await asyncio.sleep(1.0)

    def _restore_operator(self, node: str, before: dict[str, str | None]) -> None:
        if not before:
            return
        try:
            self._owners.set_labels(node, before)
        except Exception as exc:
            log.error("gpu_operator_not_restored", node=node, labels=before, error=repr(exc)[:300])


def _seconds(value: object) -> float:
    """A time read back from a Job's result (its JSON: anything); 0 when it is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value) if math.isfinite(value) and value > 0 else 0.0
