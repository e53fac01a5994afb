"""The repairs under way: the thin shell around ``controller.repairs.repair`` (pure); the steps are
carried out by ``steps``, the certification by ``certify``.

Every second (``tick``): a node Vigil quarantined gets a repair (its ladder from its open
incidents); each repair's next move is decided by the pure functions and carried out here: a GPU
or bus reset asked of the node's agent (the GPU Operator's components on the node paused by their
labels around it), a reboot asked of the configured executor (done when the node's agent says
hello again), certification (a sweep of the node and a known-good peer: ``gpu_health``, the burn
and bandwidth checks judged against the peer, and an all-reduce between the two), then the
release, or hands: a page that says what was tried (and a ticket, where configured). A node
repaired and released is one line in the day's digest thread, not a page.

Repairs survive a restart or a change of leader: their state is kept in the store's records
(``repairs``), as the guard keeps its own, and what was under way when the controller went away is
taken up as ``resumed`` says.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import asdict, replace
from typing import Any

import structlog

from controller.metrics import ControllerMetrics
from controller.nodes.check_requests import CheckRequests
from controller.nodes.fleet import Fleet
from controller.nodes.guards.domains import node_domains
from controller.nodes.guards.guard import Guard
from controller.nodes.rule_stats import AUTOMATIC
from controller.repairs.certify import Certification
from controller.repairs.config import RemediationConfig
from controller.repairs.ladder import Fault, OwnLadder, Step
from controller.repairs.owners import OwnerReadings
from controller.repairs.pages import digest_id
from controller.repairs.reboot import Reboot
from controller.repairs.repair import (
    Phase,
    Repair,
    Stops,
    certifying,
    hands_summary,
    held_down,
    open_repair,
    reboot_done,
    refusal,
    resumed,
    settled,
    start,
    step_result,
    timed_out,
)
from controller.repairs.steps import NodeOwners, ResetJobs, Steps
from controller.store import IncidentLog, Records
from controller.sweeps.sweeper import Sweeper
from controller.vocab.actions import ExternalAction, Page, PageUpdate
from controller.vocab.node_state import Health
from controller.vocab.policy import Severity
from vigil_core.signals import SignalKind
from vigil_core.supervise import Tasks
from vigil_core.waiting import wait_event

log = structlog.get_logger(__name__)

RECORD_KEY = "repairs"
Release = Callable[[str, str, str], Coroutine[Any, Any, tuple[Health, str]]]


class Repairs:
    def __init__(
        self,
        config: RemediationConfig,
        fleet: Fleet,
        incidents: IncidentLog,
        checks: CheckRequests,
        sweeper: Sweeper,
        owners: NodeOwners,
        reboot: Reboot,
        request: Callable[[ExternalAction], bool],
        release: Release,
        records: Records,
        guard: Guard,
        labels: Callable[[str], dict[str, str]],
        tasks: Tasks,
        metrics: ControllerMetrics,
        own_ladder: OwnLadder = lambda fault: None,
        clock: Callable[[], float] = time.time,
        reset_jobs: ResetJobs | None = None,
    ) -> None:
        self._steps = Steps(config, incidents, checks, owners, reboot, records, clock, reset_jobs)
        self._certification = Certification(config, fleet, sweeper, clock)
        self._metrics = metrics
        self._own_ladder = own_ladder  # the policy rules' own ladders
        self.config = config
        self._fleet = fleet
        self._incidents = incidents
        self._request = request
        self._release = release
        self._records = records
        self._guard = guard
        self._labels = labels
        self._tasks = tasks
        self._clock = clock
        self.repairs: dict[str, Repair] = {}
        self.repaired_at: dict[str, list[float]] = {}  # node -> when its repairs ended released
        self.ended: dict[str, str] = {}  # node -> the incident whose repair ended (not opened again)
        self.started: list[float] = []  # when steps started, for the hourly cap
        self._busy: set[str] = set()  # nodes with a step or a certification under way in a task
        self.counts: Counter[str] = Counter()  # repairs ended since the start: released, hands
        self._owners_now = OwnerReadings(owners, tasks, clock)
        self._load()

    def under_repair(self, node: str) -> bool:
        """Whether the node's return to service is this room's business (not the release checks')."""
        repair = self.repairs.get(node)
        return repair is not None and not repair.phase.ended

    async def watch(self, stop: asyncio.Event, every_s: float = 1.0) -> None:
        while not stop.is_set():
            self._tasks.run_step("repairs", self.tick)
            await wait_event(stop, every_s)

    # The tick ----------------------------------------------------------------------------------

    def tick(self) -> None:
        if not self.config.enabled:
            return
        now = self._clock()
        self._owners_now.tick(now)
        changed = self._open_new(now)
        for node, repair in list(self.repairs.items()):
            if repair.phase.ended or node in self._busy:
                continue
            if self._fleet.health(node) not in (Health.QUARANTINED, Health.UNHEALTHY):  # someone returned it
                log.info(
                    "repair_abandoned", node=node, incident=repair.incident_id, health=str(self._fleet.health(node))
                )
                del self.repairs[node]
                changed = True
                continue
            moved = self._advance(repair, now)
            if moved != repair:
                self._moved(repair, moved, now)
                changed = True
        if changed:
            self._save()
        phases = Counter(r.phase.value for r in self.repairs.values() if not r.phase.ended)
        for phase in Phase:
            if not phase.ended:
                self._metrics.repairs_waiting.labels(phase.value).set(phases.get(phase.value, 0))

    def _open_new(self, now: float) -> bool:
        opened = False
        for node in self._fleet.in_health(Health.QUARANTINED):
            if self.under_repair(node):
                continue
            if self._fleet.incident_of(node) in ("", self.ended.get(node)):  # nothing new since its repair ended
                continue
            incidents = self._incidents.list(open_only=True, node=node, limit=50)
            if not incidents or self.ended.get(node) == incidents[0].id:
                continue
            faults = [Fault(_kind(i.kind), i.code, i.first_message, i.gpu.pci_bus_id) for i in incidents]
            repaired = self.repaired_at.get(node, ())
            repair = open_repair(node, incidents[0].id, faults, self.config, now, repaired, self._own_ladder)
            self.repairs[node] = repair
            log.info("repair_opened", node=node, incident=repair.incident_id, ladder=[s.value for s in repair.ladder])
            if repair.phase is Phase.HANDS:
                self._hands(repair)
            opened = True
        return opened

    def _advance(self, repair: Repair, now: float) -> Repair:
        entry = self._fleet.nodes.get(repair.node)
        if entry is None:
            return repair
        if repair.phase is Phase.WAITING:
            stops = self._stops(repair)
            if repair.step is not Step.REPLACE and not refusal(stops, repair.step, self.config):
                stops = replace(stops, others=self._owners_now.held_by_others(repair.node))  # read only now
            return start(repair, stops, self.config, now)
        back = reboot_done(repair, entry.connected, entry.connected_at, entry.booted_at, now)
        if back is not repair:
            return back
        if repair.phase is Phase.RUNNING:
            return timed_out(repair, self.config, now)
        if settled(repair, self.config, now):
            return certifying(repair, now)
        return held_down(repair, entry.state.last_fault_at, self.config, now)

    def _moved(self, before: Repair, repair: Repair, now: float) -> None:
        self.repairs[repair.node] = repair
        if repair.waiting_for and repair.waiting_for != before.waiting_for:
            log.info("repair_waiting", node=repair.node, step=repair.step.value, why=repair.waiting_for)
        if repair.phase is before.phase and repair.rung == before.rung:
            return
        if ended := step_result(before, repair):
            self._metrics.repair_steps.labels(before.step.value, ended).inc()
        log.info("repair_moved", node=repair.node, incident=repair.incident_id, phase=repair.phase.value,
                 step=repair.step.value, tried=list(repair.tried[-1:]))  # fmt: skip
        if repair.phase is Phase.RUNNING:
            self.started.append(now)
            self._run(repair, self._steps.run(repair))
        elif repair.phase is Phase.CERTIFYING:
            self._run(repair, self._certification.run(repair))
        elif repair.phase is Phase.HANDS:
            self._hands(repair)
        elif repair.phase is Phase.RELEASED:
            self._released(repair)

    def _run(self, repair: Repair, work: Coroutine[Any, Any, Repair]) -> None:
        node = repair.node
        self._busy.add(node)

        async def carried_out() -> None:
            try:
                done = await work
            finally:
                self._busy.discard(node)
            if self.repairs.get(node) is repair:  # nobody ended it meanwhile (a person's release)
                self._moved(repair, done, self._clock())
                self._save()

        task = asyncio.get_running_loop().create_task(carried_out())
        self._tasks.watch("repair", task)

    def _stops(self, repair: Repair) -> Stops:
        node, now = repair.node, self._clock()
        entry = self._fleet.entry(node)
        labels = self._labels(node)
        domains = node_domains(labels, self._guard.config.domains)
        under_way = [d for r in self._running() if r.node != node for d in self._domains(r.node)]
        busy_domain = next((d for d in domains if under_way.count(d) >= self.config.per_domain), "")
        return Stops(
            jobs=entry.jobs,
            labels=labels,
            domain_busy=busy_domain,
            started_last_hour=sum(1 for t in self.started if t > now - 3600),
            storm=self._guard.automation if self._guard.holding else "",
        )

    def _running(self) -> list[Repair]:
        return [r for r in self.repairs.values() if r.phase in (Phase.RUNNING, Phase.SETTLING, Phase.CERTIFYING)]

    def _domains(self, node: str) -> list[str]:
        return node_domains(self._labels(node), self._guard.config.domains)

    # Ends ---------------------------------------------------------------------------------

    def _released(self, repair: Repair) -> None:
        """Certified: back in service, and one line in the day's digest."""
        self.ended[repair.node] = repair.incident_id  # now: the release under way must not open another

        async def release() -> None:
            health, detail = await self._release(repair.node, AUTOMATIC, "repaired: " + "; ".join(repair.tried))
            self.repaired_at.setdefault(repair.node, []).append(self._clock())
            self._metrics.repairs_ended.labels("released").inc()  # a page saved
            self.counts["released"] += 1
            self._save()
            self._digest(repair, detail)
            log.info("repair_released", node=repair.node, incident=repair.incident_id, health=health.value,
                     tried=list(repair.tried), detail=detail)  # fmt: skip

        self._tasks.watch("repair-release", asyncio.get_running_loop().create_task(release()))

    def _digest(self, repair: Repair, detail: str) -> None:
        day = time.strftime("%Y-%m-%d", time.gmtime(self._clock()))
        incident = digest_id(day)
        summary = f"Vigil's repairs on {day}: each node repaired and certified without a person, one line each"
        self._request(Page(incident, "", Severity.RECORD, summary, "nothing to do; read when convenient"))
        took = self._clock() - repair.opened_at
        text = f"{repair.node} ({repair.incident_id}): {'; '.join(repair.tried)}; back in service after {took:.0f} s"
        self._request(PageUpdate(incident, "", f"REPAIRED:{repair.incident_id}", text[:2900]))

    def _hands(self, repair: Repair) -> None:
        self.ended[repair.node] = repair.incident_id
        self._metrics.repairs_ended.labels("hands").inc()
        self.counts["hands"] += 1
        summary = hands_summary(repair)
        did = "quarantined; " + ("; ".join(repair.tried) or "no repair tried")
        self._request(Page(repair.incident_id, repair.node, Severity.QUARANTINE, summary, "repair or replace the node",
                           did=did[:1000]))  # fmt: skip
        if repair.tried:  # its quarantine's page said the rest already when nothing could be tried
            self._request(PageUpdate(repair.incident_id, repair.node, "HANDS", summary[:2900]))
        if evidence := self._steps.evidence.get(repair.incident_id):
            kept = f"evidence:{repair.incident_id}:{repair.attempt}"
            note = f"Evidence before the last step (whole in the controller's records, {kept}):\n{evidence}"
            self._request(PageUpdate(repair.incident_id, repair.node, "EVIDENCE", note[:2900]))
        log.error("repair_needs_hands", node=repair.node, incident=repair.incident_id, tried=list(repair.tried))
        if self.config.ticket_url:
            body: dict[str, object] = {"node": repair.node, "incident": repair.incident_id, "tried": list(repair.tried)}
            self._tasks.watch("repair-ticket", asyncio.get_running_loop().create_task(self._ticket(body)))

    async def _ticket(self, body: dict[str, object]) -> None:
        assert self.config.ticket_url
        request = urllib.request.Request(
            self.config.ticket_url, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        await asyncio.to_thread(lambda: urllib.request.urlopen(request, timeout=10).close())
        log.info("repair_ticket_opened", node=body["node"], url=self.config.ticket_url)

    # State -----------------------------------------------------------------------------------

    def _save(self) -> None:
        state = {
            "repairs": [asdict(r) for r in self.repairs.values() if not r.phase.ended],
            "repaired_at": self.repaired_at,
            "ended": self.ended,
            "started": [t for t in self.started if t > self._clock() - 3600],
        }
        self._records.set_meta(RECORD_KEY, json.dumps(state))

    def _load(self) -> None:
        raw = self._records.get_meta(RECORD_KEY)
        if not raw:
            return
        state = json.loads(raw)
        for r in state.get("repairs", []):
            r.update(ladder=tuple(Step(s) for s in r["ladder"]), gpus=tuple(r["gpus"]), phase=Phase(r["phase"]),
                     tried=tuple(r["tried"]))  # fmt: skip
            repair = Repair(**r)
            repair = resumed(repair, self._clock())
            self.repairs[repair.node] = repair
        self.repaired_at = {n: list(ts) for n, ts in state.get("repaired_at", {}).items()}
        self.ended = dict(state.get("ended", {}))
        self.started = list(state.get("started", []))


def _kind(name: str) -> SignalKind:
    try:
        return SignalKind(name)
    except ValueError:
        return SignalKind.XID if name.isdigit() else SignalKind.CHECK_FAILED
