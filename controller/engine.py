"""The controller's engine: the thin, effectful shell around the pure decision function.

For each batch from an agent: drop what was seen before, decide each new signal, pass its actions
through the guardrails (dry-run, circuit breaker), commit signals, incidents, node state and
actions in one transaction, then acknowledge what needs nothing more. The action runner carries
the actions out; the agent's ack for a signal waits until its actions are done.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import structlog

from controller.action_runner import ActionRunner
from controller.actions import (
    Drain,
    EscalateIncident,
    FoldIntoIncident,
    OpenIncident,
    Page,
    PageUpdate,
    Quarantine,
    action_kind,
    is_external,
)
from controller.actuators import Actuator, Pager
from controller.agent_outboxes import AgentOutboxes
from controller.check_requests import CheckRequests
from controller.decide import decide, heartbeat_returned, heartbeat_silence, quarantine_confirmed, recovered
from controller.guard import Guard
from controller.guard_rules import BreakerState, GuardrailConfig, TokenBucket
from controller.metrics import ControllerMetrics
from controller.node_state import Health, NodeState
from controller.policy import Policy, Severity
from controller.quarantine_feed import QuarantineFeed
from controller.recovery import RecoveryConfig, check_releases, release_check_due
from controller.store import PendingAction, Received, Store
from protos.vigil.v1 import agent_pb2, common_pb2
from vigil_core.signals import Signal, SignalKind
from vigil_core.waiting import wait_event

log = structlog.get_logger(__name__)


@dataclass
class NodeEntry:
    state: NodeState
    spool_id: str
    last_seq: int
    last_heartbeat: float
    gpus: int
    connected: bool = False
    dropped_faults: int = 0  # as the agent last reported it
    address: str = ""  # where the node's peers reach it (pairwise checks); known once its agent connects


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
        guardrails: GuardrailConfig | None = None,
        recovery: RecoveryConfig | None = None,
        fold_report_s: float = 300.0,
        drain: bool = False,
        agents: AgentOutboxes | None = None,
        quarantines: QuarantineFeed | None = None,
    ) -> None:
        self.store = store
        self.policy = policy
        self.metrics = metrics or ControllerMetrics()
        self.clock = clock
        self.guardrails = guardrails or GuardrailConfig()
        self.recovery = recovery or RecoveryConfig()
        self.drain_after_quarantine = drain
        # Commands to connected agents (the gateway opens their queues); quarantines told to whoever
        # must act on them too (the job monitor).
        self.agents = agents or AgentOutboxes()
        self.quarantines = quarantines or QuarantineFeed()
        self.checks = CheckRequests(store, self.agents.send)
        self._last_release_check: dict[str, float] = {}
        self._release_tasks: set[asyncio.Task[object]] = set()
        # Floods: a paged incident that keeps folding signals gets its count in its thread, at most
        # once per fold_report_s (best effort, not persisted: the count is in the store either way).
        self.fold_report_s = fold_report_s
        self._paged: dict[str, str] = {}  # incident id -> node, for incidents paged by this process
        self._folded: set[str] = set()
        self._last_fold_report = clock()
        # Heartbeats are not persisted as they come (20,000 nodes beat 4,000 times a second): after a
        # start every known node gets a full heartbeat timeout to reconnect before it counts as silent.
        started = clock()
        self.nodes: dict[str, NodeEntry] = {
            name: NodeEntry(row.state, row.spool_id, row.last_seq, started, row.gpus)
            for name, row in store.load_nodes().items()
        }
        bucket = TokenBucket(self.guardrails.quarantines_per_s, self.guardrails.quarantine_burst)
        self.runner = ActionRunner(
            store, actuator, pager, self.metrics, bucket, clock, on_done=self._action_done, on_ack=self._send_ack
        )
        # The latest open incident of each node, for status views (kept here, not read per request).
        self.open_incident: dict[str, str] = store.latest_open_incidents()
        self.guard = Guard(self.guardrails, store, self.runner, self.metrics, lambda: len(self.nodes), clock)

    @property
    def actuator(self) -> Actuator:
        return self.runner.actuator

    @property
    def pager(self) -> Pager:
        return self.runner.pager

    @property
    def automation(self) -> str:
        return self.guard.automation

    @property
    def breaker(self) -> BreakerState:
        return self.guard.breaker

    # Agents --------------------------------------------------------------------------------

    def hello(self, node: str, spool_id: str, gpus: int, address: str = "") -> int:
        """Register a (re)connecting agent; returns the seq it may drop its spool up to (``ack_seq``)."""
        now = self.clock()
        entry = self.nodes.get(node)
        if entry is None:
            entry = NodeEntry(NodeState(node=node), spool_id, 0, now, gpus)
            self.nodes[node] = entry
        elif entry.spool_id != spool_id:
            log.info("agent_new_spool", node=node, old=entry.spool_id, new=spool_id, old_last_seq=entry.last_seq)
            entry.spool_id, entry.last_seq = spool_id, 0
        entry.state = heartbeat_returned(entry.state)
        entry.last_heartbeat, entry.gpus, entry.connected, entry.address = now, gpus, True, address
        self.store.register_node(entry.state, spool_id, entry.last_seq, gpus, now)
        return self.ack_seq(node)

    def _send_ack(self, node: str) -> None:
        """An action finished: the agent may now drop the signals that asked for it."""
        self.agents.send(node, agent_pb2.ControllerMessage(ack=agent_pb2.Ack(acked_seq=self.ack_seq(node))))

    def ack_seq(self, node: str) -> int:
        """What the agent may drop: everything received, except signals whose actions are under way."""
        entry = self._entry(node)
        held_back = self.runner.held_back_seq(node)
        return entry.last_seq if held_back is None else min(entry.last_seq, held_back - 1)

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
        self.checks.disconnected(node)  # whoever waits on its checks learns now, not at their deadline

    def receive(self, node: str, signals: Sequence[Signal]) -> int:
        """Decide and durably record a batch; returns the seq to acknowledge."""
        entry = self._entry(node)
        now = self.clock()
        state, last_seq, received = entry.state, entry.last_seq, []
        breaker_before = self.breaker
        for signal in sorted(signals, key=lambda s: s.seq):
            if signal.seq <= last_seq:
                self.metrics.duplicates.inc()
                continue
            incident_id = incident_id_for(node, entry.spool_id, signal.seq)
            decision = decide(state, signal, self.policy, now, incident_id)
            state, last_seq = decision.state, signal.seq
            actions, held = self.guard.apply(decision.actions, now)
            received.append(Received(signal, incident_id, actions, held))
        if not received:
            return self.ack_seq(node)
        self.store.commit_batch(node, entry.spool_id, received, state, last_seq, now)
        if self.breaker != breaker_before:
            self.guard.save()
        entry.state, entry.last_seq, entry.last_heartbeat = state, last_seq, now
        self._carry_out(node, received)
        return self.ack_seq(node)

    def _carry_out(self, node: str, received: Sequence[Received]) -> None:
        """After the commit: schedule the external actions, and keep the in-memory views current."""
        for item in received:
            self.metrics.signals.labels(item.signal.kind.value).inc()
            for action in item.actions:
                if is_external(action) and action_kind(action) not in item.held:
                    self.runner.schedule(PendingAction(action.incident_id, action, 0, item.signal.seq))
                    if isinstance(action, Page):
                        self._paged[action.incident_id] = node
                    elif isinstance(action, Quarantine) and not action.dry_run:
                        self.quarantines.publish(action)
                elif isinstance(action, FoldIntoIncident) and action.incident_id in self._paged:
                    self._folded.add(action.incident_id)
                elif isinstance(action, EscalateIncident) and action.severity is not Severity.RECORD:
                    self.open_incident[node] = action.incident_id
                elif isinstance(action, OpenIncident):
                    if action.incident.severity is not Severity.RECORD:
                        self.open_incident[node] = action.incident.id
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

    def _entry(self, node: str) -> NodeEntry:
        entry = self.nodes.get(node)
        if entry is None:
            raise UnknownNode(node)
        return entry

    # Actions -------------------------------------------------------------------------------

    def resume_pending(self) -> int:
        pending = self.store.pending_actions()
        for p in pending:
            self.runner.schedule(p)
        if pending:
            log.info("actions_resumed", count=len(pending))
        return len(pending)

    def _action_done(self, pending: PendingAction, detail: str) -> None:
        action = pending.action
        if not isinstance(action, Quarantine) or action.dry_run:
            return
        entry = self.nodes.get(action.node)
        if entry is not None and entry.state.health is Health.UNHEALTHY:
            entry.state = quarantine_confirmed(entry.state, self.clock())
            self.store.save_states([entry.state])
        if self.drain_after_quarantine:
            drain = Drain(action.incident_id, action.node)
            self.runner.request(drain)
        latency = (
            f" {self.clock() - action.observed_at:.2f} s after the agent saw the fault"
            if action.observed_at > 0
            else ""
        )
        note = PageUpdate(action.incident_id, action.node, "QUARANTINED", f"Done{latency}: {detail}")
        self.runner.request(note)

    async def drain(self) -> None:
        """Wait for the actions under way to finish."""
        await self.runner.drain()

    async def shutdown(self) -> None:
        """Stop now: actions still under way stay PENDING in the store and resume at the next start."""
        self.guard.cancel()
        await self.runner.shutdown()

    async def adopt_cluster_state(self) -> int:
        """A new leader: take over the quarantines and pages that an earlier leader made."""
        found = await asyncio.to_thread(self.actuator.adopt)
        now, adopted = self.clock(), 0
        for q in found:
            adopted += self.store.adopt_quarantine(q.node, q.incident_id, q.reason, q.at, now)
            self.open_incident.setdefault(q.node, q.incident_id)
            entry = self.nodes.get(q.node)
            if entry is None:
                entry = NodeEntry(NodeState(node=q.node), "", 0, now, 0)
                self.nodes[q.node] = entry
                self.store.register_node(entry.state, "", 0, 0, now)
            if entry.state.health is not Health.QUARANTINED:
                entry.state = replace(entry.state, health=Health.QUARANTINED, quarantined_at=q.at or now)
                self.store.save_states([entry.state])
        self.guard.count_adopted([(q.node, q.at) for q in found])
        threads = await asyncio.to_thread(self.pager.resync)
        for q in found:
            # The previous leader may have died half-way: after the cordon, before the condition, the
            # Event or the page. Ask for both again; the actuator finishes only what is missing, and the
            # pager knows (Slack: the channel's history; webhook: idempotency key) what already went out.
            quarantine = Quarantine(q.incident_id, q.node, q.reason, "")
            self.runner.request(quarantine, now)
            page = Page(
                q.incident_id,
                q.node,
                Severity.QUARANTINE,
                q.reason,
                "see the incident's signals; the node stays quarantined until released",
                observed_at=0.0,
                did="quarantined the node (taint, cordon, node condition), by the previous leader replica",
            )
            self.runner.request(page, now)
        log.info("cluster_state_adopted", quarantines_found=len(found), new_here=adopted, paged_incidents=threads)
        return adopted

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

    def update_gauges(self) -> None:
        counts = {h: 0 for h in Health}
        for entry in self.nodes.values():
            counts[entry.state.health] += 1
        for health, count in counts.items():
            self.metrics.nodes.labels(health.value).set(count)
        self.metrics.connected_agents.set(sum(e.connected for e in self.nodes.values()))
        self.metrics.automation_paused.set(1 if self.breaker.tripped else 0)

    def ask_release_checks(self) -> list[str]:
        """Ask the agents of quarantined nodes past their hold-down for their health check."""
        now, asked = self.clock(), []
        for name, entry in self.nodes.items():
            if not release_check_due(entry.state, self._last_release_check.get(name), self.recovery, now):
                continue
            request_id = f"release-{name}-{int(now * 1000)}"
            run = agent_pb2.RunCheck(
                request_id=request_id, check=self.recovery.check, deadline_s=self.recovery.check_deadline_s
            )
            answer = self.checks.ask(name, run)
            if answer is not None:
                answer.add_done_callback(functools.partial(self._release_answered, name))
                self._last_release_check[name] = now
                asked.append(name)
                log.info("release_check_sent", node=name, check=self.recovery.check, request=request_id)
        return asked

    def _release_answered(self, node: str, answer: asyncio.Future[common_pb2.CheckResult]) -> None:
        if answer.cancelled():
            return
        r = answer.result()
        entry = self._entry(node)
        verdict = common_pb2.Verdict.Name(r.verdict)
        if check_releases(entry.state, verdict, r.started_at, self.recovery):
            reason = f"{r.check} passed after the hold-down: {r.reason}"
            task = asyncio.get_running_loop().create_task(self.uncordon(node, "vigil (automatic)", reason))
            self._release_tasks.add(task)
            task.add_done_callback(self._release_tasks.discard)
        else:
            log.warning("release_check_not_passed", node=node, check=r.check, verdict=verdict, reason=r.reason)

    def report_folds(self) -> int:
        """Tell the pager how many signals each flooding incident has folded since it was paged."""
        now = self.clock()
        if now - self._last_fold_report < self.fold_report_s or not self._folded:
            return 0
        self._last_fold_report = now
        counts = self.store.signal_counts(sorted(self._folded))
        for incident_id, count in counts.items():
            text = f"Still happening: {count} signals folded into this incident so far"
            note = PageUpdate(incident_id, self._paged[incident_id], "COUNT", text)
            self.runner.schedule(PendingAction(incident_id, note, 0))
        self._folded.clear()
        return len(counts)

    async def watch(self, stop: asyncio.Event, every_s: float = 1.0) -> None:
        while not stop.is_set():
            self.check_silence()
            self.ask_release_checks()
            self.report_folds()
            self.update_gauges()
            await wait_event(stop, every_s)

    # Operators -----------------------------------------------------------------------------

    async def uncordon(self, node: str, requested_by: str, reason: str) -> tuple[Health, str]:
        """Return a node to service, at a person's request: only what Vigil quarantined is released."""
        entry = self._entry(node)
        release = await asyncio.to_thread(self.actuator.release, node, reason or f"requested by {requested_by}")
        now = self.clock()
        self.store.record_operator_action("uncordon", node, requested_by, reason, release.detail, now)
        if not release.released and entry.state.health not in (Health.UNHEALTHY, Health.QUARANTINED):
            return entry.state.health, release.detail
        open_incidents = self.store.incidents(open_only=True, node=node, limit=10000)
        resolved = self.store.resolve_incidents(node, now)
        self.open_incident.pop(node, None)
        entry.state = recovered(entry.state)
        self.store.save_states([entry.state])
        for incident in open_incidents:
            self._paged.pop(incident.id, None)  # resolved: no more flood counts for it
            self._folded.discard(incident.id)
            text = f"Resolved: {node} returned to service by {requested_by}" + (f" ({reason})" if reason else "")
            note = PageUpdate(incident.id, node, "RESOLVED", text, resolve=True)
            self.runner.request(note, now)
        log.info("node_uncordoned", node=node, by=requested_by, reason=reason, incidents_resolved=resolved)
        return entry.state.health, f"{release.detail}; back in service; {resolved} incident(s) resolved"

    async def resume(self, requested_by: str, reason: str, apply_held: bool) -> tuple[int, int]:
        """A person resumes automation after the breaker tripped; returns (applied, dropped) held actions."""
        held = self.store.held_actions()
        self.guard.resume()
        keys = [(h.incident_id, action_kind(h.action)) for h in held]
        if apply_held:
            self.store.set_status(keys, "PENDING", f"released by {requested_by}")
            for h in held:
                self.runner.schedule(h)
        else:
            self.store.set_status(keys, "SKIPPED", f"dropped when {requested_by} resumed automation")
        detail = f"{'applied' if apply_held else 'dropped'} {len(held)} held action(s)"
        self.store.record_operator_action("resume", "", requested_by, reason, detail, self.clock())
        log.warning("automation_resumed", by=requested_by, reason=reason, apply_held=apply_held, held=len(held))
        return (len(held), 0) if apply_held else (0, len(held))

    # Sweeps --------------------------------------------------------------------------------

    def check_failed(self, node: str, key: str, reason: str) -> str:
        """A failure the controller found itself (a sweep's check), decided and acted on like an agent's
        CHECK_FAILED signal: through the policy and the guardrails. Returns what became of it."""
        entry = self._entry(node)
        now = self.clock()
        signal = Signal(node, SignalKind.CHECK_FAILED, message=reason, source="sweep", observed_at=now)
        incident_id = f"{node}-{key}"
        decision = decide(entry.state, signal, self.policy, now, incident_id)
        breaker_before = self.breaker
        actions, held = self.guard.apply(decision.actions, now)
        item = Received(signal, incident_id, actions, held)
        # The signal is filed under the sweep, not the agent's spool: the agent's sequence stays its own.
        self.store.commit_batch(node, key, [item], decision.state, entry.last_seq, now)
        if self.breaker != breaker_before:
            self.guard.save()
        entry.state = decision.state
        self._carry_out(node, [item])
        quarantine = next((a for a in actions if isinstance(a, Quarantine)), None)
        if quarantine is None:
            return f"not quarantined: the node is {entry.state.health.value} (incident {incident_id})"
        if action_kind(quarantine) in held:
            return f"held by the circuit breaker (incident {incident_id})"
        if quarantine.dry_run:
            return f"dry-run: would quarantine (incident {incident_id})"
        return f"quarantine requested (incident {incident_id})"
