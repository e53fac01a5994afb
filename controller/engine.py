"""The controller's engine: the thin, effectful shell around the pure decision function.

For each batch from an agent: drop what was seen before, decide each new signal, commit signals,
incidents, node state and pending actions in one transaction, then acknowledge. Actions run
afterwards, each retried with backoff, and any left PENDING by a previous process run on start.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from controller.actuators import Actuator, Pager
from controller.decide import (
    Health,
    NodeState,
    OpenIncident,
    Page,
    Quarantine,
    decide,
    heartbeat_returned,
    heartbeat_silence,
    quarantine_confirmed,
    recovered,
)
from controller.metrics import ControllerMetrics
from controller.policy import Policy
from controller.store import PendingAction, Received, Store, action_kind
from protos.vigil.v1 import common_pb2
from vigil.signals import Signal
from vigil.waiting import wait_event

log = structlog.get_logger(__name__)

MAX_ACTION_ATTEMPTS = 8


@dataclass
class NodeEntry:
    state: NodeState
    spool_id: str
    last_seq: int
    last_heartbeat: float
    gpus: int
    connected: bool = False
    dropped_faults: int = 0  # as the agent last reported it


class UnknownNode(Exception):
    pass


def incident_id_for(node: str, spool_id: str, seq: int) -> str:
    """Deterministic, so a replayed signal could never open a second incident under a new name."""
    return f"{node}-{spool_id[:6]}-{seq}"


class Engine:
    def __init__(
        self,
        store: Store,
        policy: Policy,
        actuator: Actuator,
        pager: Pager,
        metrics: ControllerMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.policy = policy
        self.actuator = actuator
        self.pager = pager
        self.metrics = metrics or ControllerMetrics()
        self.clock = clock
        self.nodes: dict[str, NodeEntry] = {
            name: NodeEntry(row.state, row.spool_id, row.last_seq, row.last_heartbeat, row.gpus)
            for name, row in store.load_nodes().items()
        }
        self._in_flight: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    # Agents --------------------------------------------------------------------------------

    def hello(self, node: str, spool_id: str, gpus: int) -> int:
        """Register a (re)connecting agent; returns the highest seq held for its spool."""
        now = self.clock()
        entry = self.nodes.get(node)
        if entry is None:
            entry = NodeEntry(NodeState(node=node), spool_id, 0, now, gpus)
            self.nodes[node] = entry
        elif entry.spool_id != spool_id:
            log.info("agent_new_spool", node=node, old=entry.spool_id, new=spool_id, old_last_seq=entry.last_seq)
            entry.spool_id, entry.last_seq = spool_id, 0
        entry.state = heartbeat_returned(entry.state)
        entry.last_heartbeat, entry.gpus, entry.connected = now, gpus, True
        self.store.register_node(entry.state, spool_id, entry.last_seq, gpus, now)
        return entry.last_seq

    def heartbeat(self, node: str, dropped_faults: int = 0) -> None:
        entry = self._entry(node)
        entry.last_heartbeat = self.clock()
        if dropped_faults > entry.dropped_faults:
            # The agent's spool overflowed during an outage: faults were lost before they got here.
            log.error(
                "agent_dropped_faults",
                node=node,
                dropped_total=dropped_faults,
                new=dropped_faults - entry.dropped_faults,
            )
            self.metrics.agent_dropped_faults.labels(node).set(dropped_faults)
            entry.dropped_faults = dropped_faults
        new_state = heartbeat_returned(entry.state)
        if new_state is not entry.state:
            entry.state = new_state
            self.store.save_states([new_state])

    def disconnected(self, node: str) -> None:
        if node in self.nodes:
            self.nodes[node].connected = False

    def receive(self, node: str, signals: Sequence[Signal]) -> int:
        """Decide and durably record a batch; returns the seq to acknowledge."""
        entry = self._entry(node)
        now = self.clock()
        state, last_seq, received = entry.state, entry.last_seq, []
        for signal in sorted(signals, key=lambda s: s.seq):
            if signal.seq <= last_seq:
                self.metrics.duplicates.inc()
                continue
            incident_id = incident_id_for(node, entry.spool_id, signal.seq)
            decision = decide(state, signal, self.policy, now, incident_id)
            state, last_seq = decision.state, signal.seq
            received.append(Received(signal, incident_id, decision.actions))
        if not received:
            return entry.last_seq
        self.store.commit_batch(node, entry.spool_id, received, state, last_seq, now)
        entry.state, entry.last_seq, entry.last_heartbeat = state, last_seq, now
        for item in received:
            self.metrics.signals.labels(item.signal.kind.value).inc()
            for action in item.actions:
                if isinstance(action, (Quarantine, Page)):
                    self._schedule(PendingAction(action.incident_id, action, 0))
                elif isinstance(action, OpenIncident):
                    self.metrics.incidents.labels(action.incident.severity.value).inc()
                    log.info(
                        "incident_opened",
                        node=node,
                        incident=action.incident.id,
                        severity=action.incident.severity.value,
                        kind=action.incident.kind.value,
                        code=action.incident.code,
                        gpu=action.incident.gpu.index,
                    )
        return last_seq

    def _entry(self, node: str) -> NodeEntry:
        entry = self.nodes.get(node)
        if entry is None:
            raise UnknownNode(node)
        return entry

    # Actions -------------------------------------------------------------------------------

    def resume_pending(self) -> int:
        pending = self.store.pending_actions()
        for p in pending:
            self._schedule(p)
        if pending:
            log.info("actions_resumed", count=len(pending))
        return len(pending)

    def _schedule(self, pending: PendingAction) -> None:
        key = (pending.incident_id, action_kind(pending.action))
        if key in self._in_flight:
            return
        self._in_flight.add(key)
        task = asyncio.get_running_loop().create_task(self._run_action(pending))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_action(self, pending: PendingAction) -> None:
        action, kind = pending.action, action_kind(pending.action)
        bound = log.bind(incident=pending.incident_id, node=action.node, action=kind)
        try:
            for attempt in range(pending.attempts, MAX_ACTION_ATTEMPTS):
                try:
                    detail = await asyncio.to_thread(self._carry_out, action)
                except Exception as exc:  # the actuator's failure is retried, never fatal
                    bound.warning("action_failed", attempt=attempt, error=repr(exc))
                    self.store.count_attempt(pending.incident_id, kind, repr(exc)[:500])
                    await asyncio.sleep(min(30.0, 0.5 * 2**attempt))
                    continue
                now = self.clock()
                self.store.finish_action(pending.incident_id, kind, "DONE", detail, now)
                self.metrics.actions.labels(kind, "DONE").inc()
                if action.observed_at > 0:
                    self.metrics.fault_to_action.labels(kind).observe(now - action.observed_at)
                if isinstance(action, Quarantine):
                    self._confirm_quarantine(action.node)
                bound.info("action_done", detail=detail, latency_s=round(now - action.observed_at, 4))
                return
            self.store.finish_action(pending.incident_id, kind, "FAILED", "gave up after retries", self.clock())
            self.metrics.actions.labels(kind, "FAILED").inc()
            bound.error("action_gave_up", attempts=MAX_ACTION_ATTEMPTS)
        finally:
            self._in_flight.discard((pending.incident_id, kind))

    def _carry_out(self, action: Quarantine | Page) -> str:
        if isinstance(action, Quarantine):
            return self.actuator.quarantine(action)
        return self.pager.page(action)

    def _confirm_quarantine(self, node: str) -> None:
        entry = self.nodes.get(node)
        if entry is not None and entry.state.health is Health.UNHEALTHY:
            entry.state = quarantine_confirmed(entry.state)
            self.store.save_states([entry.state])

    async def drain(self) -> None:
        """Wait for the actions under way to finish."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def shutdown(self) -> None:
        """Stop now: actions still under way stay PENDING in the store and resume at the next start."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # Time-driven ---------------------------------------------------------------------------

    def check_silence(self) -> list[str]:
        """Mark nodes UNKNOWN whose heartbeats stopped; returns their names."""
        now, changed = self.clock(), []
        for name, entry in self.nodes.items():
            new_state = heartbeat_silence(entry.state, now - entry.last_heartbeat, self.policy)
            if new_state is not entry.state:
                entry.state = new_state
                changed.append(new_state)
                log.warning("node_unknown", node=name, silent_s=round(now - entry.last_heartbeat, 1))
        if changed:
            self.store.save_states(changed)
        return [s.node for s in changed]

    def persist_heartbeats(self) -> None:
        self.store.save_states([], {n: e.last_heartbeat for n, e in self.nodes.items()})

    def update_gauges(self) -> None:
        counts = {h: 0 for h in Health}
        for entry in self.nodes.values():
            counts[entry.state.health] += 1
        for health, count in counts.items():
            self.metrics.nodes.labels(health.value).set(count)
        self.metrics.connected_agents.set(sum(e.connected for e in self.nodes.values()))

    async def watch(self, stop: asyncio.Event, every_s: float = 1.0) -> None:
        ticks = 0
        while not stop.is_set():
            self.check_silence()
            self.update_gauges()
            ticks += 1
            if ticks % 30 == 0:
                self.persist_heartbeats()
            await wait_event(stop, every_s)

    # Operators -----------------------------------------------------------------------------

    def uncordon(self, node: str, requested_by: str, reason: str) -> tuple[Health, str]:
        """Return a node Vigil quarantined to service. A person asks; the local actuator obeys."""
        entry = self._entry(node)
        owner = self.store.release_quarantine(node)
        if owner is None and entry.state.health is not Health.UNHEALTHY:
            return entry.state.health, "not quarantined by Vigil: left as it is"
        now = self.clock()
        resolved = self.store.resolve_incidents(node, now)
        entry.state = recovered(entry.state)
        self.store.save_states([entry.state])
        log.info("node_uncordoned", node=node, by=requested_by, reason=reason, incidents_resolved=resolved)
        return entry.state.health, f"back in service; {resolved} incident(s) resolved"

    def record_check_result(self, node: str, r: common_pb2.CheckResult) -> None:
        self.store.record_check_result(
            r.request_id,
            node,
            r.check,
            common_pb2.Verdict.Name(r.verdict),
            r.reason,
            dict(r.figures),
            r.started_at,
            r.finished_at,
        )
