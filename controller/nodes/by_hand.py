"""What people ask of the controller, beside its own decisions: return a node to service
(``vigil uncordon``), resolve an incident of a node still in service (``vigil resolve``), resume
automation after the circuit breaker tripped (``vigil resume``). Each is recorded with who asked
and why, and said in the incidents' threads."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from controller.metrics import ControllerMetrics
from controller.nodes.actions.fold_reports import FoldReports
from controller.nodes.actions.runner import ActionRunner
from controller.nodes.decide import incident_resolved, recovered
from controller.nodes.fleet import Fleet
from controller.nodes.guards.guard import Guard
from controller.nodes.rule_stats import (
    AUTOMATIC,
    VERDICTS,
    Decision,
    PersonAction,
    RuleStats,
    count_rules,
    rule_id,
)
from controller.store import Store
from controller.vocab.actions import PageUpdate, action_kind
from controller.vocab.node_state import Health

log = structlog.get_logger(__name__)


class UnknownIncident(Exception):
    pass


class IncidentNotOpen(Exception):
    """The incident cannot be resolved by hand; the message says why and what to do instead."""


class ByHand:
    def __init__(
        self,
        fleet: Fleet,
        store: Store,
        runner: ActionRunner,
        folds: FoldReports,
        guard: Guard,
        clock: Callable[[], float],
        metrics: ControllerMetrics,
        undo_window_s: float,
    ) -> None:
        self._fleet = fleet
        self._store = store
        self._runner = runner
        self._folds = folds
        self._guard = guard
        self._clock = clock
        self._metrics = metrics
        self.undo_window_s = undo_window_s

    async def uncordon(self, node: str, requested_by: str, reason: str, verdict: str = "") -> tuple[Health, str]:
        """Return a node to service, at a person's request: only what Vigil quarantined is released.
        ``verdict``: "repaired" (the fault was real, and is fixed), "not-a-fault" (the quarantine was
        wrong), or "" (unsaid: a repair if a check of the node passed since its quarantine)."""
        if verdict not in VERDICTS:
            raise ValueError(f"verdict {verdict!r}: one of {', '.join(repr(v) for v in VERDICTS)}")
        entry = self._fleet.entry(node)
        release = await asyncio.to_thread(self._runner.actuator.release, node, reason or f"requested by {requested_by}")
        now = self._clock()
        self._store.records.operator_action(VERDICTS[verdict], node, requested_by, reason, release.detail, now)
        if not release.released and entry.state.health not in (Health.UNHEALTHY, Health.QUARANTINED):
            return entry.state.health, release.detail
        if requested_by != AUTOMATIC and verdict != "repaired":
            self._count_undone(node, now, checked=verdict == "")
        text = f"Resolved: {node} returned to service by {requested_by}" + (f" ({reason})" if reason else "")
        text += f"; {release.detail}"  # e.g. "left cordoned: kubectl-cordon changed its cordon ..."
        resolved = self.resolve_node(node, text, now)
        log.info("node_uncordoned", node=node, by=requested_by, reason=reason, incidents_resolved=resolved)
        return entry.state.health, f"{release.detail}; back in service; {resolved} incident(s) resolved"

    def _count_undone(self, node: str, now: float, checked: bool) -> None:
        """A person releases a node soon after Vigil quarantined it: a false positive of that rule
        (``checked``: unless a check of the node passed since, which makes it a repair)."""
        passed = self._store.records.passed_checks(node).get(node, []) if checked else []
        for incident in self._store.incidents.list(open_only=True, node=node, limit=10000):
            done = [a.done_at for a in incident.actions if a.kind == "QUARANTINE" and a.status == "DONE"]
            if not done or done[0] is None or now - done[0] > self.undo_window_s:
                continue
            if not any(done[0] <= at <= now for at in passed):
                self._metrics.rule_undone.labels(rule_id(incident.kind, incident.code)).inc()

    def rules(self) -> list[RuleStats]:
        """Each rule's quarantines and pages, and how often a person undid them within the window."""
        decisions = [
            Decision(i, node, rule_id(kind, code), "QUARANTINE" if a == "QUARANTINE" else "PAGE", at)
            for i, node, kind, code, a, at in self._store.incidents.decisions()
        ]
        people = [
            PersonAction(w, n or "", b or "", at, d or "")
            for at, w, n, b, _, d in self._store.records.operator_actions()
        ]
        return count_rules(decisions, people, self.undo_window_s, self._store.records.passed_checks())

    def resolve_incident(self, incident_id: str, requested_by: str, note: str) -> tuple[str, Health, str]:
        """A person resolves an open incident of a node still in service; returns (node, its health,
        what was done). Raises UnknownIncident, or IncidentNotOpen with what to do instead."""
        found = self._store.incidents.get(incident_id)
        if found is None:
            raise UnknownIncident(incident_id)
        node, status = found
        entry = self._fleet.entry(node)
        if status != "OPEN" or entry.state.health in (Health.UNHEALTHY, Health.QUARANTINED):
            why = f"it is {status}" if status != "OPEN" else f"{node} is {entry.state.health.value}: vigil uncordon"
            raise IncidentNotOpen(f"incident {incident_id} cannot be resolved: {why}")
        now = self._clock()
        self._store.incidents.resolve_one(incident_id, now)
        others = self._store.incidents.list(open_only=True, node=node, limit=1)
        entry.state = incident_resolved(entry.state, incident_id, bool(others))
        self._store.nodes.save([entry.state])
        if not others:
            self._fleet.open_incident.pop(node, None)
        self._folds.resolved(incident_id)
        self._store.records.operator_action("resolve", node, requested_by, note, incident_id, now)
        text = f"Resolved by {requested_by}" + (f": {note}" if note else "")
        self._runner.request(PageUpdate(incident_id, node, "RESOLVED", text, resolve=True), now)
        log.info("incident_resolved", incident=incident_id, node=node, by=requested_by, note=note)
        return node, entry.state.health, f"resolved; {node} is {entry.state.health.value}"

    def resolve_node(self, node: str, text: str, now: float) -> int:
        """Back in service: the node's open incidents resolved, each thread told; returns how many."""
        entry = self._fleet.entry(node)
        open_incidents = self._store.incidents.list(open_only=True, node=node, limit=10000)
        resolved = self._store.incidents.resolve(node, now)
        self._fleet.open_incident.pop(node, None)
        entry.state = recovered(entry.state)
        self._store.nodes.save([entry.state])
        for incident in open_incidents:
            self._folds.resolved(incident.id)
            self._runner.request(PageUpdate(incident.id, node, "RESOLVED", text, resolve=True), now)
        return resolved

    async def resume(self, requested_by: str, reason: str, apply_held: bool) -> tuple[int, int, list[str]]:
        """A person resumes automation after the breaker tripped; returns (applied, dropped) held actions
        and the nodes they were for (one node's quarantine may hold more than one action)."""
        held = self._store.actions.held()
        nodes = sorted({h.action.node for h in held})
        self._guard.resume()
        keys = [(h.incident_id, action_kind(h.action)) for h in held]
        if apply_held:
            self._store.actions.set_status(keys, "PENDING", f"released by {requested_by}")
            for h in held:
                self._runner.schedule(h)
        else:
            self._store.actions.set_status(keys, "SKIPPED", f"dropped when {requested_by} resumed automation")
        detail = f"{'applied' if apply_held else 'dropped'} {len(held)} held action(s)"
        self._store.records.operator_action("resume", "", requested_by, reason, detail, self._clock())
        log.warning("automation_resumed", by=requested_by, reason=reason, apply_held=apply_held, held=len(held))
        return ((len(held), 0) if apply_held else (0, len(held))) + (nodes,)
