"""The controller's engine: the thin, effectful shell around the pure decision function.

For each batch from an agent: drop what was seen before, decide each new signal, pass its actions
through the guardrails (dry-run, circuit breaker), commit signals, incidents, node state and
actions in one transaction, then acknowledge what needs nothing more. The action runner carries
the actions out; the agent's ack for a signal waits until its actions are done.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import structlog

from controller.act.actuators import Actuator, Pager
from controller.metrics import ControllerMetrics
from controller.nodes.action_runner import ActionRunner
from controller.nodes.agent_outboxes import AgentOutboxes
from controller.nodes.app_faults import AppFaults, JobMembership
from controller.nodes.apply import Applier, Received
from controller.nodes.by_hand import ByHand
from controller.nodes.check_requests import CheckRequests
from controller.nodes.decide import (
    decide,
    decide_held,
    heartbeat_returned,
    heartbeat_silence,
    quarantine_confirmed,
    quarantine_not_carried_out,
    suspicion_lapsed,
)
from controller.nodes.fleet import Fleet, NodeEntry, UnknownNode
from controller.nodes.fold_reports import FoldReports
from controller.nodes.guard import Guard
from controller.nodes.guard_rules import BreakerState, GuardrailConfig, TokenBucket
from controller.nodes.node_events import NodeEvents
from controller.nodes.recovery import RecoveryConfig, repeat_offender, repeat_offender_note
from controller.nodes.release_checks import ReleaseChecks
from controller.store import PendingAction, Store
from controller.vocab.actions import Action, Drain, Page, PageUpdate, Quarantine, action_kind
from controller.vocab.node_state import Health, NodeState
from controller.vocab.policy import Policy, Severity
from protos.vigil.v1 import agent_pb2
from vigil_core.names import is_job_id
from vigil_core.signals import Signal, SignalKind
from vigil_core.supervise import Tasks
from vigil_core.waiting import wait_event

log = structlog.get_logger(__name__)


__all__ = ["Engine", "UnknownNode", "incident_id_for"]
MAX_JOBS_PER_NODE = 64


def _pages(actions: Sequence[Action]) -> bool:
    return any(isinstance(a, Page) for a in actions)


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
        quarantines: NodeEvents | None = None,
        app_faults: AppFaults | None = None,
        retention_s: float | None = None,
        tasks: Tasks | None = None,
        check_results_per_node_hour: int = 120,
    ) -> None:
        self.store = store
        self.policy = policy
        self.metrics = metrics or ControllerMetrics()
        self.clock = clock
        # The background work's health: failures logged, counted, and retried with backoff.
        self.tasks = tasks or Tasks(lambda task: self.metrics.task_failures.labels(task).inc())
        store.health.on_failure = self.metrics.store_write_failures.inc
        self.metrics.store_up.set_function(lambda: 0 if store.health.failing_since is not None else 1)
        self.metrics.tasks_down.set_function(lambda: len(self.tasks.down()))
        self.guardrails = guardrails or GuardrailConfig()
        self.recovery = recovery or RecoveryConfig()
        self.drain_after_quarantine = drain
        self.retention_s = retention_s  # None: keep everything
        # Commands to connected agents (the gateway opens their queues); quarantines told to whoever
        # must act on them too (the job monitor).
        self.agents = agents or AgentOutboxes()
        self.quarantines = quarantines or NodeEvents()
        self.app_faults = app_faults or AppFaults(JobMembership())
        self.checks = CheckRequests(
            store.records,
            self.agents.send,
            check_results_per_node_hour,
            lambda node: self.metrics.check_results_refused.labels(node).inc(),
            clock,
        )
        self.fleet = Fleet(store.nodes.load(), store.incidents.latest_open(), clock())
        bucket = TokenBucket(self.guardrails.quarantines_per_s, self.guardrails.quarantine_burst)
        self.runner = ActionRunner(
            store.actions,
            actuator,
            pager,
            self.metrics,
            bucket,
            clock,
            on_done=self._action_done,
            on_ack=self._send_ack,
            tasks=self.tasks,
        )
        self.folds = FoldReports(fold_report_s, store.incidents.signal_counts, self.runner.schedule, clock)
        self.applier = Applier(store, self.runner.schedule, self.fleet, self.folds, self.quarantines, self.metrics)
        self.labels: dict[str, dict[str, str]] = {}  # node -> its labels, refreshed from the actuator
        self.guard = Guard(
            self.guardrails,
            store.records,
            self.runner,
            self.metrics,
            lambda: len(self.fleet),
            clock,
            lambda node: self.labels.get(node, {}),
        )
        self.by_hand = ByHand(
            self.fleet, store, self.runner, self.folds, self.guard, clock, self.metrics, self.recovery.undo_window_s
        )
        self.releases = ReleaseChecks(self.fleet, self.checks, self.recovery, self.by_hand.uncordon, clock, self.tasks)

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
        entry = self.fleet.nodes.get(node)
        if entry is None:
            entry = self.fleet.add(node, NodeEntry(NodeState(node=node), spool_id, 0, now, gpus))
        elif entry.spool_id != spool_id:
            log.info("agent_new_spool", node=node, old=entry.spool_id, new=spool_id, old_last_seq=entry.last_seq)
            self._spool_replaced(node, entry, now)
            entry.spool_id, entry.last_seq, entry.spooled = spool_id, 0, 0
        entry.state = heartbeat_returned(entry.state)
        entry.last_heartbeat, entry.gpus, entry.connected, entry.address = now, gpus, True, address
        expected, entry.expected_gpus = entry.expected_gpus, max(entry.expected_gpus, gpus)
        self.store.nodes.register(entry.state, spool_id, entry.last_seq, gpus, now, entry.expected_gpus)
        if gpus < expected:
            reason = f"the node came back with {gpus} of its {expected} GPUs"
            outcome = self.report(node, SignalKind.GPU_LOST, f"inventory-{int(now)}", reason, "inventory")
            log.error("gpus_missing", node=node, gpus=gpus, expected=expected, outcome=outcome)
        return self.ack_seq(node)

    def _spool_replaced(self, node: str, entry: NodeEntry, now: float) -> None:
        """An agent came back with another spool while its old one still held unsent signals: they
        may be gone. Said aloud (an incident, paged as the policy says SPOOL_LOST; the agent's own
        SPOOL_LOST, when it found the damage, folds into it) and counted."""
        if entry.spooled <= 0:
            return
        reason = (
            f"the agent came back with a new spool ({entry.spool_id[:12]} was replaced); {entry.spooled} signal(s) "
            f"waiting in the old one at its last heartbeat may be gone: read the node's kernel log since then"
        )
        self.metrics.spool_signals_maybe_lost.labels(node).inc(entry.spooled)
        outcome = self.report(node, SignalKind.SPOOL_LOST, f"spool-{entry.spool_id[:12]}", reason, "controller")
        log.error("agent_spool_signals_maybe_lost", node=node, signals=entry.spooled, outcome=outcome)

    def _send_ack(self, node: str) -> None:
        """An action finished: the agent may now drop the signals that asked for it."""
        self.agents.send(node, agent_pb2.ControllerMessage(ack=agent_pb2.Ack(acked_seq=self.ack_seq(node))))

    def ack_seq(self, node: str) -> int:
        """What the agent may drop: everything received, except signals whose actions are under way."""
        entry = self.fleet.entry(node)
        held_back = self.runner.held_back_seq(node)
        return entry.last_seq if held_back is None else min(entry.last_seq, held_back - 1)

    def heartbeat(
        self,
        node: str,
        dropped_faults: int = 0,
        spooled: int = 0,
        jobs: Sequence[str] = (),
        unparsed: Sequence[str] = (),
        unparsed_total: int = 0,
    ) -> None:
        entry = self.fleet.entry(node)
        entry.last_heartbeat, entry.spooled = self.clock(), max(0, spooled)
        entry.jobs = frozenset(j for j in jobs[:MAX_JOBS_PER_NODE] if is_job_id(j))
        if unparsed:  # driver lines its agent could not read: what the fleet misses, said
            self.metrics.agent_unparsed_lines.labels(node).set(max(0, unparsed_total))
            log.warning("agent_unparsed_driver_lines", node=node, total=unparsed_total, samples=list(unparsed[:5]))
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
            self.store.nodes.save([new_state])

    def disconnected(self, node: str) -> None:
        if node in self.fleet.nodes:
            self.fleet.nodes[node].connected = False
        self.checks.disconnected(node)  # whoever waits on its checks learns now, not at their deadline

    def receive(self, node: str, signals: Sequence[Signal]) -> int:
        """Decide and durably record a batch; returns the seq to acknowledge."""
        entry = self.fleet.entry(node)
        now = self.clock()
        state, last_seq, received = entry.state, entry.last_seq, []
        with self.guard.saving():
            for signal in sorted(signals, key=lambda s: s.seq):
                if signal.seq <= last_seq:
                    self.metrics.duplicates.inc()
                    continue
                state, item = self._decide(state, signal, now, incident_id_for(node, entry.spool_id, signal.seq))
                last_seq = signal.seq
                received.append(item)
            if not received:
                return self.ack_seq(node)
            self.applier.commit(entry.spool_id, received, state, last_seq, now)
        entry.state, entry.last_seq, entry.last_heartbeat = state, last_seq, now
        return self.ack_seq(node)

    # Actions -------------------------------------------------------------------------------

    def resume_pending(self) -> int:
        pending = self.store.actions.pending()
        for p in pending:
            self.runner.schedule(p)
        if pending:
            log.info("actions_resumed", count=len(pending))
        return len(pending)

    def _decide(self, state: NodeState, signal: Signal, now: float, incident_id: str) -> tuple[NodeState, Received]:
        """Decide one signal and pass its actions through the guardrails."""
        job, page = self.app_faults.crash_of(signal, self.policy, now)
        if page is not None:
            self.runner.request(page, now)
        decision = decide(state, signal, self.policy, now, incident_id, job)
        application = not job and self.policy.rule_for(signal).application
        if application and _pages(decision.actions) and self.app_faults.may_be_crash(signal.node):
            # Its job's other nodes may not have reported theirs yet: wait for them before deciding.
            decision = decide(state, signal, self.policy, now, incident_id, hold=True)
            self.app_faults.hold(signal, now)
        return self._guarded(decision.state, decision.actions, Received(signal, incident_id, ()), now)

    def decide_held(self) -> int:
        """Application XIDs whose grace is over, no crash of their job having claimed them: decided
        now. Returns how many."""
        now = self.clock()
        due = self.app_faults.due(now)
        for signal in due:
            entry = self.fleet.nodes.get(signal.node)
            if entry is None:
                continue
            decision = decide_held(entry.state, signal, self.policy, now)
            if not decision.actions:
                continue
            with self.guard.saving():
                state, item = self._guarded(decision.state, decision.actions, Received(signal, "", (), new=False), now)
                self.applier.commit(entry.spool_id, [item], state, entry.last_seq, now)
            entry.state = state
            log.info(
                "application_fault_decided", node=signal.node, code=signal.code, held_s=self.app_faults.config.grace_s
            )
        return len(due)

    def _guarded(
        self, state: NodeState, decided: tuple[Action, ...], item: Received, now: float
    ) -> tuple[NodeState, Received]:
        """Pass a decision's actions through the guardrails."""
        actions, held = self.guard.apply(decided, now)
        if any(isinstance(a, Quarantine) and a.dry_run for a in actions):
            state = quarantine_not_carried_out(state)
        return state, replace(item, actions=actions, held=held)

    def _action_done(self, pending: PendingAction, detail: str) -> None:
        action = pending.action
        if not isinstance(action, Quarantine) or action.dry_run:
            return
        entry = self.fleet.nodes.get(action.node)
        if entry is not None and entry.state.health is Health.UNHEALTHY:
            entry.state = quarantine_confirmed(entry.state, self.clock())
            self.store.nodes.save([entry.state])
            if times := repeat_offender(entry.state, self.recovery, self.clock()):
                text = repeat_offender_note(times, self.recovery)
                self.runner.request(PageUpdate(action.incident_id, action.node, "REPEAT", text))
                log.error("repeat_offender", node=action.node, quarantines=times)
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

    async def wait_for_actions(self) -> None:
        """Wait for the actions under way to finish (tests and benchmarks)."""
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
            adopted += self.store.incidents.adopt(q.node, q.incident_id, q.reason, q.at, now)
            self.fleet.open_incident.setdefault(q.node, q.incident_id)
            entry = self.fleet.nodes.get(q.node)
            if entry is None:
                entry = self.fleet.add(q.node, NodeEntry(NodeState(node=q.node), "", 0, now, 0))
                self.store.nodes.register(entry.state, "", 0, 0, now)
            if entry.state.health is not Health.QUARANTINED:
                entry.state = replace(entry.state, health=Health.QUARANTINED, quarantined_at=q.at or now)
                self.store.nodes.save([entry.state])
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
        for name, entry in self.fleet.entries():
            new_state = heartbeat_silence(entry.state, now - entry.last_heartbeat, self.policy)
            if new_state is not entry.state:
                entry.state = new_state  # shown at once, even while the database cannot record it
                changed.append(new_state)
                log.warning("node_unknown", node=name, silent_s=round(now - entry.last_heartbeat, 1))
        if changed:
            self.store.nodes.save(changed)
        return [s.node for s in changed]

    def clear_quiet_suspects(self) -> list[str]:
        """SUSPECT nodes quiet for the policy's ``suspect_clear_s`` are HEALTHY again, their incidents
        resolved (and said in their threads); returns their names."""
        now = self.clock()
        lapsed = [n for n, e in self.fleet.entries() if suspicion_lapsed(e.state, now, self.policy)]
        for node in lapsed:
            quiet_s = self.policy.suspect_clear_s
            self.by_hand.resolve_node(node, f"Resolved: {node} quiet for {quiet_s:.0f} s, back to HEALTHY", now)
            log.info("suspicion_lapsed", node=node, quiet_s=quiet_s)
        return lapsed

    def update_gauges(self) -> None:
        self.metrics.database_bytes.set(self.store.db.size_bytes())
        counts = {h: 0 for h in Health}
        for _, entry in self.fleet.entries():
            counts[entry.state.health] += 1
        for health, count in counts.items():
            self.metrics.nodes.labels(health.value).set(count)
        self.metrics.connected_agents.set(len(self.fleet.connected()))
        self.metrics.automation_paused.set(1 if self.breaker.tripped else 0)

    async def refresh_labels(self) -> None:
        """The nodes' labels (their failure domains), read from the cluster off the event loop."""
        try:
            self.labels = await asyncio.to_thread(self.actuator.node_labels)
        except Exception as exc:  # the API server is away: keep the last ones, say so
            log.warning("node_labels_unavailable", error=repr(exc)[:300])

    def apply_retention(self) -> dict[str, int]:
        """Delete what finished longer than ``retention_s`` ago; returns what went."""
        if self.retention_s is None:
            return {}
        gone = self.store.prune(self.clock() - self.retention_s)
        if gone:
            log.info("retention_applied", retention_days=round(self.retention_s / 86400, 2), **gone)
        return gone

    async def watch(
        self, stop: asyncio.Event, every_s: float = 1.0, labels_every_s: float = 30.0, retention_every_s: float = 600.0
    ) -> None:
        """The periodic work, each step on its own: one that raises (the database away) is logged,
        counted and tried again after its backoff, while the others go on."""
        last_labels = last_retention = float("-inf")
        steps: list[tuple[str, Callable[[], object]]] = [
            ("silence", self.check_silence),
            ("held_decisions", self.decide_held),
            ("quiet_suspects", self.clear_quiet_suspects),
            ("releases", self.releases.ask),
            ("fold_reports", self.folds.report),
            ("gauges", self.update_gauges),
        ]
        while not stop.is_set():
            if time.monotonic() - last_labels >= labels_every_s:
                await self.refresh_labels()
                last_labels = time.monotonic()
            if time.monotonic() - last_retention >= retention_every_s and self.tasks.run_step(
                "retention", self.apply_retention
            ):
                last_retention = time.monotonic()
            for name, step in steps:
                self.tasks.run_step(name, step)
            await wait_event(stop, every_s)

    def problems(self) -> list[str]:
        """What keeps this controller from doing its work now (readiness, ``vigil status``)."""
        found = [f"task {name} failing: {error}" for name, error in self.tasks.down().items()]
        if problem := self.store.health.problem:
            found.insert(0, problem)
        return found

    # Sweeps --------------------------------------------------------------------------------

    def check_failed(self, node: str, key: str, reason: str) -> str:
        """A failure the controller found itself (a sweep's check, a job's blamed node), decided and
        acted on like an agent's CHECK_FAILED signal. Returns what became of it."""
        return self.report(node, SignalKind.CHECK_FAILED, key, reason, "sweep")

    def component_failed(self, component: str, behind: Sequence[str], reason: str, domain: str, key: str) -> str:
        """A fabric component a sweep blamed (a leaf switch, an uplink, a spine): one page names it,
        and the nodes behind it go through the policy with their quarantines held in its failure
        domain, never cordoned one by one. Returns what became of them."""
        domain = domain or f"fabric={component}"
        nodes = [n for n in behind if n in self.fleet.nodes]
        with self.guard.saving():
            news = self.guard.hold_component(component, domain, nodes, reason, self.clock())
        for node in nodes:
            self.report(node, SignalKind.CHECK_FAILED, f"{key}-{domain}", f"behind {component}: {reason}", "sweep")
        paged = "paged once" if news else "its domain was suspect already: not paged again"
        return f"held in {domain}: {len(nodes)} node(s) behind it, none cordoned; {paged}"

    def report(self, node: str, kind: SignalKind, key: str, reason: str, source: str) -> str:
        """A fault the controller found itself, decided and acted on like an agent's signal: through
        the policy and the guardrails. Returns what became of it."""
        entry = self.fleet.entry(node)
        now = self.clock()
        signal = Signal(node, kind, message=reason, source=source, observed_at=now)
        incident_id = f"{node}-{key}"
        with self.guard.saving():
            state, item = self._decide(entry.state, signal, now, incident_id)
            # The signal is filed under the sweep, not the agent's spool: the agent's sequence stays its own.
            self.applier.commit(key, [item], state, entry.last_seq, now)
        entry.state = state
        held = item.held
        quarantine = next((a for a in item.actions if isinstance(a, Quarantine)), None)
        if quarantine is None:
            return f"not quarantined: the node is {entry.state.health.value} (incident {incident_id})"
        if action_kind(quarantine) in held:
            return f"held by the circuit breaker (incident {incident_id})"
        if quarantine.dry_run:
            return f"dry-run: would quarantine (incident {incident_id})"
        return f"quarantine requested (incident {incident_id})"
