"""A training job as the job monitor sees it: its phase (an explicit state machine), its figures
and goodput, and the validation of the reports its rank 0 sends."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from controller.jobs.goodput import Goodput
from controller.jobs.hang import Hang
from controller.jobs.mfu import Track, Unit
from controller.jobs.save_now import SaveRequests
from controller.jobs.stacks import Wavefront
from controller.planning.plan import JobPlan
from protos.vigil.v1 import admin_pb2, trainer_pb2
from vigil_core.names import is_job_id, is_node_name

MAX_RANKS = 1 << 17
MAX_NODES = 1 << 15


class BadProgress(ValueError):
    """A report that cannot be taken: the message names the field."""


class TooManyJobs(Exception):
    """A report of a new job while ``jobs.max_jobs`` are followed already."""


class JobPhase(StrEnum):
    """Where a job is in its life as the monitor sees it."""

    RUNNING = "running"  # training; no command for it
    STOPPING = "stopping"  # told to checkpoint and restart; waiting for its ack, its exit or the deadline
    SWEEP_PENDING = "sweep pending"  # stopped after an MFU drop; its recovery sweep waits for the sweeper
    SWEEPING = "sweeping"  # stopped; its recovery sweep runs (a launcher waits before starting it again)
    STOPPED = "stopped"  # stopped; may start again
    FINISHED = "finished"  # ended; a later job of the same id starts afresh


# A (re)start report may come in any phase but the last: the job is then RUNNING again.
_TRANSITIONS: dict[JobPhase, frozenset[JobPhase]] = {
    JobPhase.RUNNING: frozenset({JobPhase.RUNNING, JobPhase.STOPPING, JobPhase.FINISHED}),
    JobPhase.STOPPING: frozenset({JobPhase.RUNNING, JobPhase.SWEEP_PENDING, JobPhase.STOPPED, JobPhase.FINISHED}),
    JobPhase.SWEEP_PENDING: frozenset({JobPhase.RUNNING, JobPhase.SWEEPING, JobPhase.STOPPED, JobPhase.FINISHED}),
    JobPhase.SWEEPING: frozenset({JobPhase.RUNNING, JobPhase.STOPPED, JobPhase.FINISHED}),
    JobPhase.STOPPED: frozenset({JobPhase.RUNNING, JobPhase.FINISHED}),
    JobPhase.FINISHED: frozenset(),
}
_AFTER_STOP = (JobPhase.SWEEP_PENDING, JobPhase.SWEEPING, JobPhase.STOPPED)


@dataclass
class Job:
    job_id: str
    nodes: tuple[str, ...] = ()
    restart_count: int = -1
    step: int = 0
    committed_step: int = 0
    last_report: float = 0.0
    track: Track = field(default_factory=Track)
    figures: deque[float] = field(default_factory=lambda: deque(maxlen=12))  # recent windows, for pages
    unit: Unit = Unit.MFU  # what the figures are: MFU where the job reports it, else tokens/s
    phase: JobPhase = JobPhase.RUNNING
    command: trainer_pb2.CheckpointAndRestart | None = None  # the one sent in this run, if any
    low_since: float = 0.0  # when the current run of low windows began (the job's clock); 0: not low
    window_s: float = 0.0  # the last window's length
    sweep_on_stop: bool = False  # this stop follows an MFU drop: sweep the nodes it will restart on
    exclude: set[str] = field(default_factory=set)
    incidents: list[str] = field(default_factory=list)  # paged incidents that this stop follows
    recovery_note: str = ""
    commands_sent: int = 0
    drops: int = 0
    goodput: Goodput = field(default_factory=Goodput)
    world_size: int = 0  # ranks, as the job reports (one GPU each)
    saves: SaveRequests = field(default_factory=SaveRequests)  # CHECKPOINT_NOW asks (controller.save_now)
    stepped_at: float = 0.0  # when its step last moved, or it (re)started or ended a pause: the controller's clock
    restart_step: int = -1  # the step this run started at
    window_step: int = -1  # the step at its last window (-1: none yet this run), for seconds per step
    per_step: deque[float] = field(default_factory=lambda: deque(maxlen=256))  # its windows' seconds per step
    pause: str = ""  # what it says it is doing between steps ("checkpoint", "evaluation"); "": stepping
    hang: Hang | None = None  # hung now (controller.jobs.hang), paged once
    hangs: int = 0  # hangs paged, for their incidents' names
    stacks_asked: int = 0  # the hang whose stacks its launcher was asked for
    wavefront: Wavefront | None = None  # where the current hang is stuck, from the ranks' stacks
    hang_found_at: float = 0.0  # when the current hang was found (the controller's clock)
    hang_judged: bool = False  # the current hang joined with its nodes' signals (once per hang)

    def move(self, to: JobPhase) -> None:
        if to not in _TRANSITIONS[self.phase]:
            raise ValueError(f"job {self.job_id}: no transition from {self.phase.value} to {to.value}")
        self.phase = to

    @property
    def hang_incident(self) -> str:
        return f"hang-{self.job_id}-{self.hangs}"

    @property
    def drop_incident(self) -> str:
        """The incident of the job's latest MFU drop (its blamed nodes' and its page's)."""
        return f"mfu-{self.job_id}-{self.drops}"

    @property
    def stopped(self) -> bool:
        """The job acknowledged its command, its launcher said it exited, or the deadline passed."""
        return self.phase in _AFTER_STOP

    @property
    def state(self) -> str:
        """For ``vigil jobs``: running, stopping, stopped or finished."""
        return "stopped" if self.stopped else self.phase.value

    @property
    def ready(self) -> bool:
        """Whether a launcher may start the job again now (not while its recovery sweep is due or runs)."""
        waiting_for_sweep = self.phase is JobPhase.STOPPING and self.sweep_on_stop
        return not waiting_for_sweep and self.phase not in (JobPhase.SWEEP_PENDING, JobPhase.SWEEPING)


def validate(p: trainer_pb2.Progress) -> None:
    if not is_job_id(p.job_id):
        raise BadProgress(f"Progress.job_id {p.job_id!r} is not a job id (letters, digits, -_.)")
    if p.step < 0 or p.restart_count < 0 or p.tokens < 0 or p.committed_step < 0:
        raise BadProgress("Progress.step, restart_count, tokens and committed_step must be >= 0")
    if len(p.pause) > 64:
        raise BadProgress("Progress.pause is longer than 64 characters")
    if p.checkpoint_s < 0 or p.restore_s < 0 or p.window_end < p.window_start:
        raise BadProgress("Progress.checkpoint_s and restore_s must be >= 0, and window_end not before window_start")
    for name in ("mfu", "tokens_per_s", "loss", "checkpoint_s", "restore_s", "window_start", "window_end"):
        value = getattr(p, name)
        if not math.isfinite(value):
            raise BadProgress(f"Progress.{name} is {value}")
    if not 0 <= p.mfu <= 1.5:
        raise BadProgress(f"Progress.mfu {p.mfu} is not a fraction of the peak")
    if len(p.nodes) > MAX_NODES or len(p.step_times) > MAX_RANKS:
        raise BadProgress("Progress has more nodes or ranks than any job")
    bad = [n for n in (*p.nodes, *(t.node for t in p.step_times)) if not is_node_name(n)]
    if bad:
        raise BadProgress(f"Progress names {bad[0]!r}, which is not a node name")
    if any(not math.isfinite(t.step_time_s) or t.step_time_s < 0 for t in p.step_times):
        raise BadProgress("Progress.step_times has a negative or not finite step time")


def status_figures(job: Job) -> dict[str, float]:
    """The run's baseline and last window, in the JobStatus fields of the job's unit."""
    baseline, last = job.track.baseline or 0.0, job.figures[-1] if job.figures else 0.0
    return {f"baseline_{job.unit.value}": baseline, f"last_{job.unit.value}": last}


def job_status(job: Job, plan: JobPlan | None) -> admin_pb2.JobStatus:
    """What ``vigil jobs`` shows of a job: its state, where its time went, and its plan."""
    g = job.goodput
    planned = {}
    if plan is not None:
        planned = {
            "planned_ettr": plan.ettr,
            "recommended_checkpoint_s": plan.interval_s,
            "planned_save_s": plan.save_s,
        }
    return admin_pb2.JobStatus(
        job_id=job.job_id,
        state=job.state,
        nodes=job.nodes,
        step=job.step,
        committed_step=job.committed_step,
        restart_count=max(job.restart_count, 0),
        **status_figures(job),
        excluded=sorted(job.exclude),
        productive_s=g.productive_s,
        checkpoint_s=g.checkpoint_s,
        restore_s=g.restore_s,
        wasted_s=g.wasted_s,
        recovery_s=g.recovery_s,
        goodput=g.ratio or 0.0,
        drops=job.drops,
        gpus=job.world_size,
        hung_s=job.hang.stalled_s if job.hang is not None else 0.0,
        pause=job.pause,
        **planned,
    )
