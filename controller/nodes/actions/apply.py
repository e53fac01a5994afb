"""What each action means, in one place.

The pure decision (``controller.nodes.decide``) and the guardrails turn a signal into actions; here each
kind of action is given its effects, in three steps read top to bottom:

1. ``Applier.commit`` records a batch in one transaction: its signals; incidents opened, folded into
   or escalated; external actions as PENDING (or HELD by the breaker); the node's new state.
2. After the commit, the controller's views follow: open incidents, flood counts, the quarantine
   feed (the job monitor), and the external actions go to the action runner.
3. ``execute`` carries an external action out through the actuator or the pager (the runner calls
   it in a thread, with retries).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from controller.act.actuators import Actuator, Pager, Unfinished, UrgentFirst
from controller.metrics import ControllerMetrics
from controller.nodes.actions.fold_reports import FoldReports
from controller.nodes.fleet import Fleet
from controller.nodes.node_events import NodeEvents
from controller.nodes.rule_stats import rule_id
from controller.store import ActionLog, IncidentLog, NodeTable, PendingAction, Store, Tx
from controller.vocab.actions import (
    Action,
    Drain,
    EscalateIncident,
    ExternalAction,
    FoldIntoIncident,
    OpenIncident,
    Page,
    PageUpdate,
    Quarantine,
    ResolveIncident,
    action_kind,
)
from controller.vocab.node_state import NodeState
from controller.vocab.policy import EARLY_WARNING_KINDS, Severity
from vigil_core.signals import Signal

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Received:
    """One new signal and what was decided about it, ready to be committed."""

    signal: Signal
    incident_id: str
    actions: tuple[Action, ...]
    held: frozenset[str] = frozenset()  # kinds of its actions that the guardrails hold back
    new: bool = True  # False: a signal recorded before, decided again (a held application XID)


class Applier:
    def __init__(
        self,
        store: Store,
        schedule: Callable[[PendingAction], None],
        fleet: Fleet,
        folds: FoldReports,
        quarantines: NodeEvents,
        metrics: ControllerMetrics,
    ) -> None:
        self._store = store
        self._schedule = schedule  # the action runner's
        self._fleet = fleet
        self._folds = folds
        self._quarantines = quarantines
        self._metrics = metrics

    def commit(
        self,
        filed_under: str,
        received: Sequence[Received],
        state: NodeState,
        last_seq: int,
        now: float,
        also: Callable[[Tx], None] = lambda db: None,
    ) -> None:
        """Record the batch (signals filed under ``filed_under``: the agent's spool or a sweep's key),
        then let the views follow and start the external actions. ``also`` writes in the same
        transaction what else the decision changed (the guardrails' windows)."""
        with self._store.tx(durable=False) as db:  # on disk with the next flush; the agent's ack awaits it
            for item in received:
                if item.new:
                    IncidentLog.signal(db, state.node, filed_under, item.signal, item.incident_id, now)
                for action in item.actions:
                    self._record(db, action, item, now)
            NodeTable.received(db, state, last_seq, now)
            also(db)
        self._store.group.soon()
        for item in received:
            if item.new:
                self._metrics.signals.labels(item.signal.kind.value).inc()
                if item.signal.kind in EARLY_WARNING_KINDS:
                    self._quarantines.warn(state.node, item.signal.describe())
            for action in item.actions:
                self._follow(state.node, action, item)

    @staticmethod
    def _record(db: Tx, action: Action, item: Received, now: float) -> None:
        match action:
            case OpenIncident():
                IncidentLog.open(db, action, now)
            case FoldIntoIncident():
                IncidentLog.fold(db, action)
            case EscalateIncident():
                IncidentLog.escalate(db, action)
            case ResolveIncident():
                IncidentLog.resolved(db, action)
            case Quarantine() | Drain() | Page() | PageUpdate():
                ActionLog.add_in(db, action, now, item.signal.seq, held=action_kind(action) in item.held)

    def _follow(self, node: str, action: Action, item: Received) -> None:
        match action:
            case OpenIncident(incident=incident):
                if incident.severity is not Severity.RECORD:
                    self._fleet.open_incident[node] = incident.id
                self._metrics.incidents.labels(incident.severity.value).inc()
                # Record-only incidents (stored, no action; hundreds a second across a large fleet) are
                # counted and listed (``vigil incidents``), logged only at debug level.
                said = log.debug if incident.severity is Severity.RECORD else log.info
                said(
                    "incident_opened",
                    node=node,
                    incident=incident.id,
                    severity=incident.severity.value,
                    kind=incident.kind.value,
                    code=incident.code,
                    gpu=incident.gpu.index,
                )
            case FoldIntoIncident():
                self._folds.folded(action.incident_id)
            case EscalateIncident():
                if action.severity is not Severity.RECORD:
                    self._fleet.open_incident[node] = action.incident_id
            case ResolveIncident():
                if self._fleet.open_incident.get(node) == action.incident_id:
                    del self._fleet.open_incident[node]
                self._folds.resolved(action.incident_id)
                log.info("incident_cleared_by_driver", node=node, incident=action.incident_id)
            case Quarantine() | Drain() | Page() | PageUpdate():
                if action_kind(action) in item.held:
                    return  # the breaker holds it: a person applies or drops it (``vigil resume``)
                self._schedule(PendingAction(action.incident_id, action, 0, item.signal.seq))
                if isinstance(action, (Quarantine, Page)) and not (isinstance(action, Quarantine) and action.dry_run):
                    rule = rule_id(item.signal.kind.value, item.signal.code)
                    self._metrics.rule_decisions.labels(rule, action_kind(action).split(":")[0]).inc()
                if isinstance(action, Page):
                    self._folds.paged(action.incident_id, node)
                elif isinstance(action, Quarantine) and not action.dry_run:
                    self._quarantines.publish(action)


def execute(action: ExternalAction, actuator: Actuator, pager: Pager) -> str | Unfinished:
    """Carry an external action out (blocking); returns a one-line account of what was done, or for
    a quarantine with an urgent part (``UrgentFirst``) what is left once that part is done."""
    match action:
        case Quarantine(dry_run=True):
            return f"dry run: would quarantine ({actuator.quarantine_means}); nothing changed"
        case Quarantine() if isinstance(actuator, UrgentFirst):
            return actuator.quarantine_urgent_first(action)
        case Quarantine():
            return actuator.quarantine(action)
        case Drain():
            return actuator.drain(action)
        case Page():
            return pager.page(action)
        case PageUpdate():
            return pager.update(action)
