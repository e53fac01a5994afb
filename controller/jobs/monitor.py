"""The job monitor: the training jobs Vigil protects, their MFU, and bringing them back.

Jobs register themselves: rank 0's hook reports Progress every window (and polls in between), with
the nodes the job runs on and each rank's step time. The monitor judges each window
(``controller.jobs.mfu``, pure) and acts:

- A node running a job is quarantined, for any reason (an XID, a failed check): the job gets
  ``CHECKPOINT_AND_RESTART`` with that node excluded, in the reply to its next report.
- The job's MFU drops and a node is to blame: that node goes through the engine as a failed check
  (the policy and the guardrails decide; a tripped breaker or dry-run stops nothing), which is a
  quarantine, hence the command above; once the job has checkpointed (or its deadline passed), the
  nodes it will restart on are swept, and the failures quarantined too.
- The MFU drops and nobody is to blame: a person is paged with the evidence; the job runs on.

Launchers ask ``plan`` before they start a job again: which nodes to leave out, and whether the
recovery sweep is still running. The registry lives in memory: a restarted controller learns the
jobs again from their next reports (a command in flight is lost with it; the deadline does not
apply then, and the job runs on until something else stops it).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence

import structlog

from controller.jobs.goodput import KINDS, committed, started, trained
from controller.jobs.mfu import RankTime, Reading, Track, blame, describe_figure, observe, stragglers, window_figure
from controller.jobs.settings import JobsConfig
from controller.jobs.state import BadProgress, Job, JobPhase, TooManyJobs, job_status, validate
from controller.metrics import ControllerMetrics
from controller.nodes.app_faults import JobMembership
from controller.nodes.fleet import FleetView, ReportFailure, UnknownNode
from controller.nodes.node_events import NodeEvents
from controller.planning.plan import JobPlan, job_plan
from controller.sweeps.spec import sweep_spec
from controller.sweeps.sweeper import SweepBusy, Sweeper
from controller.vocab.actions import ExternalAction, Page, PageUpdate, Quarantine
from controller.vocab.node_state import Health
from controller.vocab.policy import Severity
from protos.vigil.v1 import admin_pb2, common_pb2, trainer_pb2
from vigil_core.names import is_job_id, is_node_name
from vigil_core.waiting import wait_event

log = structlog.get_logger(__name__)


class JobMonitor:
    def __init__(
        self,
        fleet: FleetView,
        report_failure: ReportFailure,
        request: Callable[[ExternalAction], bool],
        metrics: ControllerMetrics,
        sweeper: Sweeper,
        config: JobsConfig,
        quarantines: NodeEvents,
        clock: Callable[[], float] = time.time,
        membership: JobMembership | None = None,
    ) -> None:
        self._fleet = fleet
        self._report_failure = report_failure  # a blamed node goes through the policy and the guardrails
        self._request = request  # pages and thread notes, through the action runner
        self._metrics = metrics
        self._membership = membership or JobMembership()  # the jobs' nodes, for the engine's application faults
        self._sweeper = sweeper
        self.config = config
        self.clock = clock
        self.jobs: dict[str, Job] = {}
        self.finished: deque[Job] = deque(maxlen=64)  # for reports only
        self._tasks: set[asyncio.Task[None]] = set()
        quarantines.subscribe(self.node_quarantined)  # a node is going: the jobs on it must stop
        quarantines.subscribe_warnings(self.node_warned)  # a node may go soon: the jobs on it should save

    # Reports -------------------------------------------------------------------------------

    def report(self, p: trainer_pb2.Progress) -> list[trainer_pb2.JobCommand]:
        """Take one report from a job's rank 0; returns the commands waiting for the job."""
        validate(p)
        now = self.clock()
        job = self.jobs.get(p.job_id)
        if job is None:
            if len(self.jobs) >= self.config.max_jobs:
                raise TooManyJobs(
                    f"{len(self.jobs)} jobs are followed already (jobs.max_jobs); a silent one is forgotten "
                    f"after {self.config.forget_after_s:.0f} s, a finished one at once"
                )
            job = self.jobs[p.job_id] = Job(p.job_id)
            log.info("job_registered", job=p.job_id, nodes=list(p.nodes), world_size=p.world_size)
        restarted = p.event == "start" or p.restart_count > job.restart_count
        if restarted:
            self._started(job, p)
        self._account(job, p, restarted, now)
        if p.nodes:
            job.nodes = tuple(dict.fromkeys(p.nodes))
            self._membership.set(job.job_id, job.nodes)
        job.world_size = p.world_size or job.world_size
        job.step, job.last_report = (p.step if restarted else max(job.step, p.step)), now
        job.committed_step = max(job.committed_step, p.committed_step)
        if p.event == "end":  # finished: a later job of the same id starts afresh
            log.info("job_finished", job=p.job_id, step=p.step, goodput=job.goodput.ratio)
            job.move(JobPhase.FINISHED)
            self.finished.append(self.jobs.pop(p.job_id))
            self._membership.forget(p.job_id)
            return []
        for ack in p.acks:
            if job.phase is JobPhase.STOPPING and job.command is not None and ack.id == job.command.id:
                log.info("job_checkpointed", job=job.job_id, command=ack.id, step=ack.checkpoint_step)
                self._note(job, "JOB-CHECKPOINTED", f"checkpointed at step {ack.checkpoint_step} and exited")
                self._stopped(job)
            elif job.saves.acknowledged(ack.id):
                log.info("job_saved_on_request", job=job.job_id, command=ack.id, step=ack.checkpoint_step)
        if job.phase is JobPhase.RUNNING:
            self._on_nodes_out_of_service(job)
        if job.phase is JobPhase.RUNNING and self.config.checkpoint_now:
            self._ask_to_save(job, now)
        if not p.event and job.phase is JobPhase.RUNNING:
            self._judge(job, p)
        return self._commands(job)

    def _account(self, job: Job, p: trainer_pb2.Progress, restarted: bool, now: float) -> None:
        """Goodput: fold the report into the job's timeline, on the job's own clock."""
        g, at = job.goodput, p.window_end or now
        if restarted and p.event:  # a start: at the step it resumed from
            g = started(g, at, p.step, p.restore_s)
        elif restarted:  # a run first heard of by a window: it began with the window, at its committed step
            g = started(g, p.window_start or at, p.committed_step, p.restore_s)
        if not p.event:
            g = trained(g, at, p.step, p.checkpoint_s, since=p.window_start or None)
        elif p.event in ("checkpointed", "end"):
            g = trained(g, at, p.step, p.checkpoint_s)
        steps = [p.committed_step, *(a.checkpoint_step for a in p.acks)]
        job.goodput = committed(g, max(steps))
        metrics = self._metrics
        for kind in KINDS:
            metrics.job_time.labels(job.job_id, kind).set(getattr(job.goodput, f"{kind}_s"))
        if job.goodput.ratio is not None:
            metrics.job_goodput.labels(job.job_id).set(job.goodput.ratio)
        if (plan := self.plan_of(job)) is not None:
            metrics.job_planned_ettr.labels(job.job_id).set(plan.ettr)
            metrics.job_recommended_checkpoint.labels(job.job_id).set(plan.interval_s)

    def plan_of(self, job: Job) -> JobPlan | None:
        """The job's plan, from its size and its own measured save and restart times."""
        g = job.goodput
        return job_plan(job.world_size, self.config.failures_per_1000_gpu_days, g.mean_save_s, g.mean_restart_s)

    def _on_nodes_out_of_service(self, job: Job) -> None:
        """A job that runs on a node already quarantined (it started there, or the controller
        restarted after the quarantine) is told to leave it, as if the quarantine were new. A node
        that is only UNHEALTHY (its quarantine held by the tripped breaker, or dry-run) stops no job:
        a person decides, as for the node itself."""
        for node in self._out_of_service(job.nodes, (Health.QUARANTINED,)):
            job.exclude.add(node)
            if incident := self._fleet.incident_of(node):
                job.incidents.append(incident)
        if job.exclude:
            self._command(job, f"runs on {', '.join(sorted(job.exclude))}, out of service")

    def _started(self, job: Job, p: trainer_pb2.Progress) -> None:
        if job.command is not None:
            left_out = ", ".join(sorted(job.exclude)) or "none"
            text = f"restarted on {len(p.nodes)} node(s), {left_out} left out; resumed at step {p.step}"
            self._note(job, "JOB-RESUMED", text)
            log.info("job_restarted", job=job.job_id, restart=p.restart_count, step=p.step, left_out=left_out)
        job.move(JobPhase.RUNNING)
        job.restart_count, job.track, job.command = p.restart_count, Track(), None
        job.exclude, job.incidents, job.sweep_on_stop, job.recovery_note = set(), [], False, ""

    def _judge(self, job: Job, p: trainer_pb2.Progress) -> None:
        found = window_figure(p.mfu, p.tokens_per_s)
        if found is None:
            return
        figure, unit = found
        if unit is not job.unit:  # a baseline in one unit says nothing of windows in the other
            job.unit, job.track = unit, Track()
            job.figures.clear()
        job.track, reading = observe(job.track, figure, self.config)
        job.figures.append(figure)
        job.window_s = max(0.0, p.window_end - p.window_start)
        if reading in (Reading.LOW, Reading.DROP):
            job.low_since = job.low_since or (p.window_start or self.clock())
        else:
            job.low_since = 0.0
        self._metrics.job_mfu.labels(job.job_id).set(p.mfu)
        self._metrics.job_tokens_per_s.labels(job.job_id).set(p.tokens_per_s)
        if reading is Reading.DROP:
            times = [RankTime(t.rank, t.node, t.step_time_s) for t in p.step_times]
            self._drop(job, figure, times)

    def _drop(self, job: Job, figure: float, times: Sequence[RankTime]) -> None:
        baseline = job.track.baseline or 0.0
        job.drops += 1
        # A doubted node is blamed only for a fault of its own inside the drop (from one window before
        # the low windows began): a node SUSPECT since long before explains nothing about this drop.
        doubted, since = {}, job.low_since - job.window_s
        for node in job.nodes:
            health = self._fleet.health(node)
            if health is None or health in (Health.HEALTHY, Health.UNKNOWN):
                continue
            if self._fleet.last_fault_at(node) < since:
                log.info(
                    "mfu_drop_not_blamed", job=job.job_id, node=node, health=health.value, why="fault before the drop"
                )
                continue
            incident = self._fleet.incident_of(node)
            doubted[node] = f"{health.value}" + (f" (incident {incident})" if incident else "")
        found = blame(job.nodes, stragglers(times, self.config.straggler_ratio), doubted)
        self._metrics.mfu_drops.labels("yes" if found.nodes else "no").inc()
        shown = ", ".join(describe_figure(f, job.unit) for f in job.figures)
        what = (
            f"job {job.job_id}: {describe_figure(figure, job.unit)}, {1 - figure / baseline:.0%} below its baseline "
            f"{describe_figure(baseline, job.unit)} "
            f"for {self.config.drop_windows} window(s) (recent windows: {shown})"
        )
        evidence = "; ".join(found.evidence) or "no straggler rank and no doubted node"
        log.warning("mfu_drop", job=job.job_id, step=job.step, figure=figure, baseline=baseline, unit=job.unit.value,
                    blamed=list(found.nodes), evidence=evidence)  # fmt: skip
        if not found.nodes or not self.config.act_on_drop:
            self._page_drop(job, what, evidence, found.nodes)
            return
        confirmed = self._confirmed(job, found.nodes)
        if len(confirmed) < len(found.nodes):
            unconfirmed = [n for n in found.nodes if n not in confirmed]
            self._page_drop(job, what, evidence, unconfirmed, unconfirmed=True)
            if not confirmed:
                return
        job.sweep_on_stop = True  # the command the blame brings (through a quarantine) is a drop's
        for node in confirmed:
            try:
                outcome = self._report_failure(node, job.drop_incident, f"{what}; {evidence}")
            except UnknownNode:
                outcome = "not quarantined: no agent of that name has ever connected"
            log.info("mfu_blame_acted_on", job=job.job_id, node=node, outcome=outcome)
        if job.phase is JobPhase.RUNNING:  # nothing was quarantined (dry-run, breaker): a person decides
            job.sweep_on_stop = False
            self._page_drop(job, what, evidence, found.nodes)

    def _confirmed(self, job: Job, blamed: Sequence[str]) -> list[str]:
        """The blamed nodes the controller may act on: where required, only those whose own agents see
        the job's processes (a trainer's word alone never takes a node out of service)."""
        if not self.config.blame_needs_agents:
            return list(blamed)
        confirmed = [n for n in blamed if self._fleet.runs_job(n, job.job_id)]
        for node in blamed:
            if node not in confirmed:
                self._metrics.blame_unconfirmed.inc()
                log.warning("mfu_blame_unconfirmed", job=job.job_id, node=node, why="its agent does not see the job")
        return confirmed

    def _page_drop(self, job: Job, what: str, evidence: str, blamed: Sequence[str], unconfirmed: bool = False) -> None:
        incident_id = job.drop_incident
        did = (
            f"blamed {', '.join(blamed)} but took no action there: its agent does not see the job's processes "
            "on it, so the job's word alone is not enough"
            if unconfirmed
            else f"blamed {', '.join(blamed)} but took no action (dry-run, breaker or act_on_drop off)"
            if blamed
            else "nothing: the drop is not attributable to a node (no straggler rank, no node's fault during it); "
            "the job runs on"
        )
        page = Page(incident_id, "", Severity.SUSPECT, what, f"look at the job; evidence: {evidence}", did=did)
        self._request(page)

    # Commands ------------------------------------------------------------------------------

    def node_quarantined(self, action: Quarantine) -> None:
        """The engine decided to quarantine a node: every job on it checkpoints and restarts without it."""
        for job in self.jobs.values():
            if action.node not in job.nodes or job.phase not in (JobPhase.RUNNING, JobPhase.STOPPING):
                continue
            job.exclude.add(action.node)
            job.incidents.append(action.incident_id)
            if job.command is None:
                self._command(job, f"{action.node} quarantined: {action.reason}")
            else:
                job.command.exclude_nodes[:] = sorted(job.exclude)

    def _command(self, job: Job, reason: str) -> None:
        job.move(JobPhase.STOPPING)
        job.commands_sent += 1
        job.command = trainer_pb2.CheckpointAndRestart(
            id=f"{job.job_id}-r{max(job.restart_count, 0)}-c{job.commands_sent}",
            reason=reason,
            exclude_nodes=sorted(job.exclude),
            deadline=self.clock() + self.config.deadline_s,
        )
        self._metrics.job_commands.labels("mfu" if job.sweep_on_stop else "quarantine").inc()
        log.warning("job_command", job=job.job_id, command=job.command.id, exclude=sorted(job.exclude), reason=reason)
        self._note(job, "JOB-STOPPING", f"asked to checkpoint and restart without {', '.join(sorted(job.exclude))}")

    def _commands(self, job: Job) -> list[trainer_pb2.JobCommand]:
        if job.phase is JobPhase.RUNNING and (save := job.saves.outstanding(self.clock(), 4 * job.window_s + 30)):
            return [trainer_pb2.JobCommand(checkpoint_now=save)]
        if job.phase is not JobPhase.STOPPING:
            return []
        return [trainer_pb2.JobCommand(checkpoint_and_restart=job.command)]

    # Saves on early warnings (controller.save_now) -----------------------------------------------

    def node_warned(self, node: str, what: str) -> None:
        for job in self.jobs.values():
            if node in job.nodes and job.phase is JobPhase.RUNNING:
                job.saves.warn(node, what)

    def _ask_to_save(self, job: Job, now: float) -> None:
        suspects = {n for n in job.nodes if self._fleet.health(n) is Health.SUSPECT}
        every_s = self.config.checkpoint_now_every_s
        if (asked := job.saves.decide(job.job_id, job.nodes, suspects, now, every_s)) is not None:
            log.warning("job_asked_to_save", job=job.job_id, command=asked.id, reason=asked.reason)
            self._metrics.checkpoint_now.labels(job.job_id).inc()

    def recommended_checkpoint_s(self, job_id: str) -> float:
        """How often the job should save (0: not known yet): for ReportReply."""
        job = self.jobs.get(job_id)
        plan = self.plan_of(job) if job is not None else None
        return plan.interval_s if plan is not None else 0.0

    def _stopped(self, job: Job) -> None:
        if not job.sweep_on_stop:
            job.move(JobPhase.STOPPED)
            return
        job.move(JobPhase.SWEEP_PENDING)
        self._start_recovery_sweep(job)

    # Launchers -----------------------------------------------------------------------------

    def restart_plan(self, request: trainer_pb2.PlanRequest) -> trainer_pb2.PlanReply:
        if not is_job_id(request.job_id):
            raise BadProgress(f"PlanRequest.job_id {request.job_id!r} is not a job id")
        bad = [n for n in request.nodes if not is_node_name(n)]
        if bad:
            raise BadProgress(f"PlanRequest names {bad[0]!r}, which is not a node name")
        out_of_service = self._out_of_service(request.nodes)
        job = self.jobs.get(request.job_id)
        if job is None:
            return trainer_pb2.PlanReply(exclude_nodes=sorted(out_of_service), ready=True, detail="job not known")
        if request.stopped and job.phase is JobPhase.STOPPING and job.command is not None:
            log.info("job_exited", job=job.job_id, command=job.command.id)
            self._stopped(job)
        return trainer_pb2.PlanReply(
            commands=self._commands(job),
            exclude_nodes=sorted(job.exclude | out_of_service),
            ready=job.ready,
            detail=job.recovery_note,
        )

    def statuses(self) -> list[admin_pb2.JobStatus]:
        """Every job, running ones first, for ``vigil jobs``."""
        jobs = [*sorted(self.jobs.values(), key=lambda j: j.job_id), *reversed(self.finished)]
        return [job_status(job, self.plan_of(job)) for job in jobs]

    def _out_of_service(
        self, nodes: Sequence[str], states: tuple[Health, ...] = (Health.UNHEALTHY, Health.QUARANTINED)
    ) -> set[str]:
        """The nodes in one of ``states``; by default, those no job should start on."""
        return {n for n in nodes if self._fleet.health(n) in states}

    # Recovery sweep ------------------------------------------------------------------------

    def _start_recovery_sweep(self, job: Job) -> None:
        nodes = [n for n in job.nodes if n not in job.exclude]
        if not nodes:
            job.recovery_note = "no node left to sweep"
            job.move(JobPhase.STOPPED)
            return
        spec = sweep_spec(self._sweeper.config, self.config.sweep_checks, {}, True, 0.0, f"vigil (job {job.job_id})")
        done: asyncio.Future[admin_pb2.SweepSummary | None] = asyncio.get_running_loop().create_future()

        def emit(update: admin_pb2.SweepUpdate) -> None:
            if update.phase == "done" and not done.done():
                done.set_result(update.summary if update.HasField("summary") else None)

        try:
            sweep_id = self._sweeper.start(spec, nodes, emit)
        except SweepBusy:
            return  # the next watch tick tries again
        job.move(JobPhase.SWEEPING)
        log.info("job_recovery_sweep", job=job.job_id, sweep=sweep_id, nodes=nodes)
        task = asyncio.get_running_loop().create_task(self._sweep_done(job, sweep_id, done))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sweep_done(self, job: Job, sweep_id: str, done: asyncio.Future[admin_pb2.SweepSummary | None]) -> None:
        try:
            summary = await done
            if summary is None:
                job.recovery_note = f"sweep {sweep_id} broke; restarting without the blamed nodes only"
            else:
                failed = {r.node for r in summary.rows if r.verdict == common_pb2.FAIL}
                job.exclude |= failed
                job.recovery_note = f"sweep {sweep_id}: {summary.verdict}" + (
                    f", failed: {', '.join(sorted(failed))}" if failed else ""
                )
            self._note(job, "JOB-SWEPT", job.recovery_note)
        finally:
            if job.phase is JobPhase.SWEEPING:  # not when the job was started again meanwhile
                job.move(JobPhase.STOPPED)

    # Time-driven ---------------------------------------------------------------------------

    def tick(self) -> None:
        """Deadlines, pending recovery sweeps, and forgetting jobs gone silent."""
        now = self.clock()
        for job_id, job in list(self.jobs.items()):
            if job.phase is JobPhase.STOPPING and job.command is not None and now > job.command.deadline:
                log.warning("job_deadline_passed", job=job_id, command=job.command.id)
                self._note(job, "JOB-DEADLINE", "did not checkpoint before the deadline: its launcher kills it")
                self._stopped(job)
            elif job.phase is JobPhase.SWEEP_PENDING:
                self._start_recovery_sweep(job)
            elif now - job.last_report > self.config.forget_after_s and job.phase is not JobPhase.SWEEPING:
                log.info("job_forgotten", job=job_id, silent_s=round(now - job.last_report))
                del self.jobs[job_id]
                self._membership.forget(job_id)

    async def watch(self, stop: asyncio.Event, every_s: float = 1.0) -> None:
        while not stop.is_set():
            self.tick()
            await wait_event(stop, every_s)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # Pages ---------------------------------------------------------------------------------

    def _note(self, job: Job, tag: str, text: str) -> None:
        """A word in the thread of each incident this job's stop follows."""
        for incident_id in job.incidents or ([job.drop_incident] if job.drops else []):
            self._request(PageUpdate(incident_id, "", f"{tag}:{job.job_id}", f"Job {job.job_id} {text}"))
