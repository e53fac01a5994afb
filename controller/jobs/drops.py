"""An MFU drop judged: whom to blame (``controller.jobs.mfu``, pure), whether the controller may act
on that word (the node's own agent must see the job where required), and what it does: a blamed
node goes to the engine as a fault the controller found (``Source.MFU``), and its outcome, not the
job's phase afterwards, says whether a person must be paged instead."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import structlog

from controller.jobs.mfu import RankTime, Reading, Track, blame, describe_figure, observe, stragglers, window_figure
from controller.jobs.settings import JobsConfig
from controller.jobs.state import Job
from controller.metrics import ControllerMetrics
from controller.nodes.fleet import FleetView
from controller.nodes.found import Found, Report, Source
from controller.vocab.actions import ExternalAction, Page
from controller.vocab.node_state import Health
from controller.vocab.policy import Severity
from protos.vigil.v1 import trainer_pb2

log = structlog.get_logger(__name__)


class DropJudge:
    def __init__(
        self,
        fleet: FleetView,
        report: Report,
        request: Callable[[ExternalAction], bool],
        metrics: ControllerMetrics,
        config: JobsConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._fleet = fleet
        self._report = report  # a blamed node goes through the policy and the guardrails
        self._request = request  # pages, through the action runner
        self._metrics = metrics
        self.config = config
        self.clock = clock

    def judge(self, job: Job, p: trainer_pb2.Progress) -> None:
        found = window_figure(p.mfu, p.tokens_per_s, job.unit if job.track.windows else None)
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
            f"{describe_figure(baseline, job.unit)} (its own windows within {job.track.noise / baseline:.0%} of it) "
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
        quarantined = False
        for node in confirmed:
            outcome = self._report(Found(node, job.drop_incident, f"{what}; {evidence}", Source.MFU))
            quarantined |= outcome.quarantined
            log.info("mfu_blame_acted_on", job=job.job_id, node=node, outcome=str(outcome))
        if not quarantined:  # dry-run, the breaker, or already out: a person decides
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
