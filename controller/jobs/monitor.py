"""The job monitor: the training jobs Vigil protects, their MFU, and bringing them back.

Jobs register themselves: rank 0's hook reports Progress every window (and polls in between), with
the nodes the job runs on and each rank's step time. The monitor judges each window
(``controller.jobs.mfu``, pure) and acts:

- A node running a job is quarantined, for any reason (an XID, a failed check): the job gets
  ``CHECKPOINT_AND_RESTART`` with that node excluded, in the reply to its next report.
- The job's MFU drops and a node is to blame: that node goes through the engine as a fault the
  controller found (``Source.MFU``; the policy and the guardrails decide, and the outcome says
  what they decided: a tripped breaker or dry-run stops nothing), which is a quarantine, hence the
  command above; once the job has checkpointed (or its deadline passed), the
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

from controller.jobs.drops import DropJudge
from controller.jobs.goodput import KINDS, committed, started, trained
from controller.jobs.hang import Hang, gone_silent, hang_of, seconds_per_step
from controller.jobs.hang_evidence import fault_of, hang_blame
from controller.jobs.mfu import Track
from controller.jobs.progress import progress_wavefront
from controller.jobs.restarts import Restarts
from controller.jobs.settings import JobsConfig
from controller.jobs.stacks import Collective, RankDump, Wavefront, wavefront
from controller.jobs.state import BadProgress, Job, JobPhase, TooManyJobs, job_status, validate
from controller.metrics import ControllerMetrics
from controller.nodes.app_faults import JobMembership
from controller.nodes.fleet import FleetView
from controller.nodes.found import Found, Report, Source
from controller.nodes.node_events import NodeEvents
from controller.planning.plan import JobPlan, job_plan
from controller.sweeps.sweeper import Sweeper
from controller.vocab.actions import ExternalAction, Page, PageUpdate
from controller.vocab.node_state import Health
from controller.vocab.policy import Severity
from protos.vigil.v1 import admin_pb2, trainer_pb2
from vigil_core.names import is_job_id, is_node_name
from vigil_core.rank_progress import RankRecord
from vigil_core.waiting import wait_event

log = structlog.get_logger(__name__)

MAX_STACK_RANKS = 4096  # dumps taken from one PlanRequest
MAX_STACKS_CHARS = 32768  # of one rank's dump


class JobMonitor:
    def __init__(
        self,
        fleet: FleetView,
        report: Report,
        request: Callable[[ExternalAction], bool],
        metrics: ControllerMetrics,
        sweeper: Sweeper,
        config: JobsConfig,
        quarantines: NodeEvents,
        clock: Callable[[], float] = time.time,
        membership: JobMembership | None = None,
        held_since: Callable[[float], float] = lambda _: 0.0,
    ) -> None:
        self._fleet = fleet
        self._metrics = metrics
        self._membership = membership or JobMembership()  # the jobs' nodes, for the engine's application faults
        self._held_since = held_since  # the controller's own lateness since a time: not the job's stall
        self._request = request
        self.config = config
        self.clock = clock
        self.jobs: dict[str, Job] = {}
        self.finished: deque[Job] = deque(maxlen=64)  # for reports only
        self._report = report  # a node blamed for a hang goes through the policy and the guardrails
        self._drops = DropJudge(fleet, report, request, metrics, config, clock)
        self._restarts = Restarts(self.jobs, fleet, request, metrics, sweeper, config, clock)
        quarantines.subscribe(self._restarts.node_quarantined)  # a node is going: the jobs on it must stop
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
        self._progressed(job, p, restarted, now)
        if p.nodes:
            job.nodes = tuple(dict.fromkeys(p.nodes))
            self._membership.set(job.job_id, job.nodes)
        job.world_size = p.world_size or job.world_size
        job.step, job.last_report = (p.step if restarted else max(job.step, p.step)), now
        job.committed_step = max(job.committed_step, p.committed_step)
        if p.event == "end":  # finished: a later job of the same id starts afresh
            log.info("job_finished", job=p.job_id, step=p.step, goodput=job.goodput.ratio)
            self._unhung(job, f"the job ended at step {p.step}")
            job.move(JobPhase.FINISHED)
            self.finished.append(self.jobs.pop(p.job_id))
            self._membership.forget(p.job_id)
            return []
        for ack in p.acks:
            if job.phase is JobPhase.STOPPING and job.command is not None and ack.id == job.command.id:
                log.info("job_checkpointed", job=job.job_id, command=ack.id, step=ack.checkpoint_step)
                self._restarts.note(job, "JOB-CHECKPOINTED", f"checkpointed at step {ack.checkpoint_step} and exited")
                self._restarts.stopped(job)
            elif job.saves.acknowledged(ack.id):
                log.info("job_saved_on_request", job=job.job_id, command=ack.id, step=ack.checkpoint_step)
        if job.phase is JobPhase.RUNNING:
            self._restarts.on_nodes_out_of_service(job)
        if job.phase is JobPhase.RUNNING and self.config.checkpoint_now:
            self._ask_to_save(job, now)
        if not p.event and job.phase is JobPhase.RUNNING:
            self._drops.judge(job, p)
        return self._restarts.commands(job)

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

    def _progressed(self, job: Job, p: trainer_pb2.Progress, restarted: bool, now: float) -> None:
        """Hangs (controller.jobs.hang): when the step last moved, the job's seconds per step, its pause."""
        advanced = restarted or p.step > job.step
        if advanced or (job.pause and not p.pause):  # a pause's time is not a stall
            job.stepped_at = now
        if advanced:
            self._unhung(job, f"stepping again at step {p.step}")
        job.pause = p.pause
        if p.event == "start":
            job.window_step = p.step  # its first window, warm-up, is not learnt from
        elif not p.event:
            if job.window_step >= 0 and p.step > job.window_step and not restarted:
                per = seconds_per_step(p.window_end - p.window_start, p.step - job.window_step, p.checkpoint_s)
                if per is not None and job.window_step != job.restart_step:
                    job.per_step.append(per)
            job.window_step = p.step

    def _stacks(self, job: Job, stacks: Sequence[trainer_pb2.RankStacks]) -> None:
        """The ranks' stacks its launcher took in a hang: the wavefront, said on the hang's page."""
        if job.hang is None or job.wavefront is not None:
            return
        dumps = [
            RankDump(
                s.rank,
                s.node if is_node_name(s.node) else "?",
                s.answered,
                s.text[:MAX_STACKS_CHARS],
                s.state[:1] if s.state[:1].isalpha() else "",
                s.kernel_wait[:64] if s.kernel_wait.replace("_", "").replace(".", "").isalnum() else "",
                tuple(
                    Collective(c.group[:128], c.seq, c.op[:64], c.completed)
                    for c in s.collectives[:16]
                    if c.group.isprintable() and c.op.isprintable()
                ),
            )
            for s in stacks[:MAX_STACK_RANKS]
        ]
        self._located(job, wavefront(dumps), f"its {len(dumps)} ranks' stacks")
        self._judge_hang(job)

    def _located(self, job: Job, found: Wavefront, source: str) -> None:
        """Where the hang is stuck, kept for its judgement, logged and said in its thread."""
        job.wavefront = found
        log.error("job_hang_located", job=job.job_id, verdict=found.verdict.value, source=source,
                  culprits=[(c.rank, c.node) for c in found.culprits][:20], waiting=found.waiting)  # fmt: skip
        text = f"where it is stuck, from {source}: {found.describe()}"
        self._request(PageUpdate(job.hang_incident, "", "WAVEFRONT", text[:3000]))

    def _judge_hang(self, job: Job) -> None:
        """Once per hang: its wavefront (or none) joined with its nodes' own signals; a node with
        evidence goes to the engine as a fault the controller found, and its quarantine stops the job."""
        if job.hang is None or job.hang_judged:
            return
        job.hang_judged = True
        if job.wavefront is None:  # no stacks: the ranks' progress records, as the nodes' agents sent them
            records = self._records(job)
            if (found := progress_wavefront(records)) is not None:
                self._located(job, found, f"its {len(records)} ranks' progress records")
        faults = [
            f
            for node in job.nodes
            for key, at in self._fleet.recent_faults(node)
            if (f := fault_of(node, key, at)) is not None
        ]
        cfg = self.config.hang
        out = {n for n in job.nodes if self._fleet.health(n) in (Health.UNHEALTHY, Health.QUARANTINED)}
        nodes = [n for n in job.nodes if n not in out]
        blame = hang_blame(job.wavefront, nodes, faults, job.hang.since, cfg.evidence_s)
        log.warning("job_hang_judged", job=job.job_id, blamed=list(blame.nodes), why=blame.why)
        if not blame.nodes:
            self._request(PageUpdate(job.hang_incident, "", "NO-EVIDENCE", blame.why[:3000]))
            return
        said = []
        for node in blame.nodes:
            evidence = ", ".join(sorted({f.describe() for f in blame.evidence if f.node == node}))
            reason = f"job {job.job_id} hung with {node}'s own signals ({evidence}): {blame.why}"
            outcome = self._report(Found(node, job.hang_incident, reason[:2000], Source.HANG))
            said.append(f"{node}: {outcome}")
            log.warning("job_hang_blamed", job=job.job_id, node=node, outcome=str(outcome))
        text = f"{blame.why}. Blamed: {'; '.join(said)}"
        self._request(PageUpdate(job.hang_incident, "", "HARDWARE", text[:3000]))

    def _unhung(self, job: Job, how: str) -> None:
        if job.hang is None:
            return
        log.info("job_unhung", job=job.job_id, how=how, stalled_s=round(job.hang.stalled_s, 1))
        text = f"{how}, after {job.hang.stalled_s:.0f} s without a step"
        self._request(PageUpdate(job.hang_incident, "", "RESUMED", text, resolve=True))
        self._metrics.job_hung.labels(job.job_id).set(0)
        job.hang, job.wavefront, job.hang_judged = None, None, False

    def _check_hung(self, job: Job, now: float) -> None:
        cfg = self.config.hang
        recent = list(job.per_step)[-cfg.learn_windows :]
        hang = hang_of(job.stepped_at, job.last_report, job.pause, recent, cfg, now, self._held_since)
        if hang is not None and (seen := self._ranks_step(job)) > job.step:
            # Its ranks step on, as their nodes' agents see them: rank 0's reports do not reach here.
            log.warning("job_stepping_per_agents", job=job.job_id, step=seen, reported_step=job.step,
                        silent_s=round(now - job.last_report, 1))  # fmt: skip
            job.step, job.stepped_at, hang = seen, now, None
        if hang is None:
            return
        if job.hang is None:
            job.hangs += 1
            job.hang_found_at, job.hang_judged = now, False
            log.error("job_hung", job=job.job_id, step=job.step, stalled_s=round(hang.stalled_s, 1),
                      bound_s=round(hang.bound_s, 1), silent=hang.silent, nodes=list(job.nodes))  # fmt: skip
            self._request(hang_page(job, hang))
        job.hang = hang
        self._metrics.job_hung.labels(job.job_id).set(hang.stalled_s)
        if job.wavefront is None and now - job.hang_found_at > cfg.stacks_wait_s:
            self._judge_hang(job)  # no stacks came (a job not under vigil launch): judged without them

    def _ranks_step(self, job: Job) -> int:
        """The step every rank of the job has finished, from its ranks' progress records as the nodes'
        agents last sent them; -1 unless every rank of it has one."""
        steps: dict[int, int] = {}
        for r in self._records(job):
            steps[r.rank] = max(steps.get(r.rank, -1), r.step)
        return min(steps.values()) if steps and len(steps) >= job.world_size > 0 else -1

    def _records(self, job: Job) -> list[RankRecord]:
        """The job's ranks' progress records, as its nodes' agents last sent them."""
        return [r for node in job.nodes for r in self._fleet.ranks(node) if r.job == job.job_id]

    def plan_of(self, job: Job) -> JobPlan | None:
        """The job's plan, from its size and its own measured save and restart times."""
        g = job.goodput
        return job_plan(job.world_size, self.config.failures_per_1000_gpu_days, g.mean_save_s, g.mean_restart_s)

    def _started(self, job: Job, p: trainer_pb2.Progress) -> None:
        if job.command is not None:
            left_out = ", ".join(sorted(job.exclude)) or "none"
            text = f"restarted on {len(p.nodes)} node(s), {left_out} left out; resumed at step {p.step}"
            self._restarts.note(job, "JOB-RESUMED", text)
            log.info("job_restarted", job=job.job_id, restart=p.restart_count, step=p.step, left_out=left_out)
        job.move(JobPhase.RUNNING)
        job.restart_count, job.track, job.command = p.restart_count, Track(), None
        job.restart_step, job.window_step = p.step, -1
        job.exclude, job.incidents, job.sweep_on_stop, job.recovery_note = set(), [], False, ""

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

    # Launchers -----------------------------------------------------------------------------

    def restart_plan(self, request: trainer_pb2.PlanRequest) -> trainer_pb2.PlanReply:
        if not is_job_id(request.job_id):
            raise BadProgress(f"PlanRequest.job_id {request.job_id!r} is not a job id")
        bad = [n for n in request.nodes if not is_node_name(n)]
        if bad:
            raise BadProgress(f"PlanRequest names {bad[0]!r}, which is not a node name")
        out_of_service = self._restarts.out_of_service(request.nodes)
        job = self.jobs.get(request.job_id)
        if job is None:
            return trainer_pb2.PlanReply(exclude_nodes=sorted(out_of_service), ready=True, detail="job not known")
        if request.stacks:
            self._stacks(job, request.stacks)
        want_stacks = job.hang is not None and job.stacks_asked < job.hangs
        if want_stacks:
            job.stacks_asked = job.hangs  # once per hang
        if request.stopped and job.phase is JobPhase.STOPPING and job.command is not None:
            log.info("job_exited", job=job.job_id, command=job.command.id)
            self._restarts.stopped(job)
        return trainer_pb2.PlanReply(
            commands=self._restarts.commands(job),
            exclude_nodes=sorted(job.exclude | out_of_service),
            ready=job.ready,
            detail=job.recovery_note,
            want_stacks=want_stacks,
        )

    def statuses(self) -> list[admin_pb2.JobStatus]:
        """Every job, running ones first, for ``vigil jobs``."""
        jobs = [*sorted(self.jobs.values(), key=lambda j: j.job_id), *reversed(self.finished)]
        return [job_status(job, self.plan_of(job)) for job in jobs]

    # Time-driven ---------------------------------------------------------------------------

    def tick(self) -> None:
        """Deadlines, pending recovery sweeps, and forgetting jobs gone silent."""
        now = self.clock()
        for job_id, job in list(self.jobs.items()):
            if self._restarts.deadline_passed(job, now):
                continue
            if job.phase is JobPhase.RUNNING:
                self._check_hung(job, now)
            elif job.hang is not None:  # told to stop (a node of it went): no longer a hang to watch
                self._unhung(job, f"the job is {job.state} now")
            if job.phase is JobPhase.SWEEP_PENDING:
                self._restarts.start_recovery_sweep(job)
            elif job.phase is not JobPhase.SWEEPING and self._forgotten(job, now):
                log.info("job_forgotten", job=job_id, silent_s=round(now - job.last_report))
                self._metrics.job_hung.labels(job_id).set(0)
                del self.jobs[job_id]
                self._membership.forget(job_id)

    def _forgotten(self, job: Job, now: float) -> bool:
        return gone_silent(job.last_report, now, self.config.forget_after_s, self._held_since)

    async def watch(self, stop: asyncio.Event, every_s: float = 1.0) -> None:
        while not stop.is_set():
            self.tick()
            await wait_event(stop, every_s)

    async def stop(self) -> None:
        await self._restarts.stop()


def hang_page(job: Job, hang: Hang) -> Page:
    """The one page for a hung job (about the job, not a node): a hang alone cordons nothing."""
    nodes = ", ".join(job.nodes[:20]) + (f" and {len(job.nodes) - 20} more" if len(job.nodes) > 20 else "")
    return Page(
        incident_id=job.hang_incident,
        node="",
        severity=Severity.SUSPECT,
        summary=f"job {job.job_id} is hung: {hang.describe(job.step)}; on {nodes or 'nodes not reported'}",
        remedy="look at its ranks' stacks (py-spy dump --pid, on every node) and collective state (the flight "
        "recorder, TORCH_FR_BUFFER_SIZE); the rank that never entered the collective the others wait in is "
        "the culprit. Under vigil launch, this page's thread names it from the ranks' stacks",
        observed_at=hang.since,
        did="nothing taken out of service: a hang alone does not say the hardware (most are the application's"
        " or the host's)",
    )
