"""A job told to leave its bad nodes: the command (checkpoint and restart without them), its
acknowledgement or deadline, and, after an MFU drop, the recovery sweep of the nodes it will start
on again. The job monitor owns the jobs; this holds what stopping and restarting them takes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import structlog

from controller.jobs.settings import JobsConfig
from controller.jobs.state import Job, JobPhase
from controller.metrics import ControllerMetrics
from controller.nodes.fleet import FleetView
from controller.sweeps.result import SweepDone, SweepEvent, SweepResult
from controller.sweeps.spec import sweep_spec
from controller.sweeps.sweeper import SweepBusy, Sweeper
from controller.vocab.actions import ExternalAction, PageUpdate, Quarantine
from controller.vocab.node_state import Health
from protos.vigil.v1 import trainer_pb2

log = structlog.get_logger(__name__)


class Restarts:
    def __init__(
        self,
        jobs: dict[str, Job],
        fleet: FleetView,
        request: Callable[[ExternalAction], bool],
        metrics: ControllerMetrics,
        sweeper: Sweeper,
        config: JobsConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._jobs = jobs  # the job monitor's, read here
        self._fleet = fleet
        self._request = request  # thread notes, through the action runner
        self._metrics = metrics
        self._sweeper = sweeper
        self.config = config
        self.clock = clock
        self._tasks: set[asyncio.Task[None]] = set()

    def node_quarantined(self, action: Quarantine) -> None:
        """The engine decided to quarantine a node: every job on it checkpoints and restarts without it."""
        for job in self._jobs.values():
            if action.node not in job.nodes or job.phase not in (JobPhase.RUNNING, JobPhase.STOPPING):
                continue
            job.exclude.add(action.node)
            job.incidents.append(action.incident_id)
            if job.command is None:
                self._command(job, f"{action.node} quarantined: {action.reason}")
            else:
                job.command.exclude_nodes[:] = sorted(job.exclude)

    def on_nodes_out_of_service(self, job: Job) -> None:
        """A job that runs on a node already quarantined (it started there, or the controller
        restarted after the quarantine) is told to leave it, as if the quarantine were new. A node
        that is only UNHEALTHY (its quarantine held by the tripped breaker, or dry-run) stops no job:
        a person decides, as for the node itself."""
        for node in self.out_of_service(job.nodes, (Health.QUARANTINED,)):
            job.exclude.add(node)
            if incident := self._fleet.incident_of(node):
                job.incidents.append(incident)
        if job.exclude:
            self._command(job, f"runs on {', '.join(sorted(job.exclude))}, out of service")

    def _command(self, job: Job, reason: str) -> None:
        job.move(JobPhase.STOPPING)
        job.commands_sent += 1
        # A hung job cannot save: its launcher aborts it soon, and it restarts from its last checkpoint.
        give_s = self.config.hang.abort_after_s if job.hang is not None else self.config.deadline_s
        job.command = trainer_pb2.CheckpointAndRestart(
            id=f"{job.job_id}-r{max(job.restart_count, 0)}-c{job.commands_sent}",
            reason=reason,
            exclude_nodes=sorted(job.exclude),
            deadline=self.clock() + give_s,
        )
        self._metrics.job_commands.labels("mfu" if job.sweep_on_stop else "quarantine").inc()
        log.warning("job_command", job=job.job_id, command=job.command.id, exclude=sorted(job.exclude), reason=reason)
        self.note(job, "JOB-STOPPING", f"asked to checkpoint and restart without {', '.join(sorted(job.exclude))}")

    def commands(self, job: Job) -> list[trainer_pb2.JobCommand]:
        if job.phase is JobPhase.RUNNING and (save := job.saves.outstanding(self.clock(), 4 * job.window_s + 30)):
            return [trainer_pb2.JobCommand(checkpoint_now=save)]
        if job.phase is not JobPhase.STOPPING:
            return []
        return [trainer_pb2.JobCommand(checkpoint_and_restart=job.command)]

    def stopped(self, job: Job) -> None:
        if not job.sweep_on_stop:
            job.move(JobPhase.STOPPED)
            return
        job.move(JobPhase.SWEEP_PENDING)
        self.start_recovery_sweep(job)

    def out_of_service(
        self, nodes: Sequence[str], states: tuple[Health, ...] = (Health.UNHEALTHY, Health.QUARANTINED)
    ) -> set[str]:
        """The nodes in one of ``states``; by default, those no job should start on."""
        return {n for n in nodes if self._fleet.health(n) in states}

    def start_recovery_sweep(self, job: Job) -> None:
        nodes = [n for n in job.nodes if n not in job.exclude]
        if not nodes:
            job.recovery_note = "no node left to sweep"
            job.move(JobPhase.STOPPED)
            return
        spec = sweep_spec(self._sweeper.config, self.config.sweep_checks, {}, True, 0.0, f"vigil (job {job.job_id})")
        done: asyncio.Future[SweepResult | None] = asyncio.get_running_loop().create_future()

        def emit(event: SweepEvent) -> None:
            if isinstance(event, SweepDone) and not done.done():
                done.set_result(event.result)

        try:
            sweep_id = self._sweeper.start(spec, nodes, emit)
        except SweepBusy:
            return  # the next watch tick tries again
        job.move(JobPhase.SWEEPING)
        log.info("job_recovery_sweep", job=job.job_id, sweep=sweep_id, nodes=nodes)
        task = asyncio.get_running_loop().create_task(self._sweep_done(job, sweep_id, done))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sweep_done(self, job: Job, sweep_id: str, done: asyncio.Future[SweepResult | None]) -> None:
        try:
            summary = await done
            if summary is None:
                job.recovery_note = f"sweep {sweep_id} broke; restarting without the blamed nodes only"
            else:
                failed = set(summary.failed)
                job.exclude |= failed
                job.recovery_note = f"sweep {sweep_id}: {summary.verdict.value}" + (
                    f", failed: {', '.join(sorted(failed))}" if failed else ""
                )
            self.note(job, "JOB-SWEPT", job.recovery_note)
        finally:
            if job.phase is JobPhase.SWEEPING:  # not when the job was started again meanwhile
                job.move(JobPhase.STOPPED)

    def note(self, job: Job, tag: str, text: str) -> None:
        """A word in the thread of each incident this job's stop follows."""
        for incident_id in job.incidents or ([job.drop_incident] if job.drops else []):
            self._request(PageUpdate(incident_id, "", f"{tag}:{job.job_id}", f"Job {job.job_id} {text}"))

    def deadline_passed(self, job: Job, now: float) -> bool:
        """A job told to stop that did not before its deadline: its launcher kills it; it counts as stopped."""
        if job.phase is not JobPhase.STOPPING or job.command is None or now <= job.command.deadline:
            return False
        log.warning("job_deadline_passed", job=job.job_id, command=job.command.id)
        self.note(job, "JOB-DEADLINE", "did not checkpoint before the deadline: its launcher kills it")
        self.stopped(job)
        return True

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
