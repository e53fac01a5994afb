"""The controller's engine: the thin, effectful shell around the pure decision function.

For each batch from an agent: drop what was seen before, decide each new signal, pass its actions
through the guardrails (dry-run, circuit breaker), commit signals, incidents, node state and
actions in one transaction, then acknowledge what needs nothing more. The action runner carries
the actions out; the agent's ack for a signal waits until its actions are done.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import structlog

from controller.metrics import ControllerMetrics
from controller.nodes.actions.apply import Applier, Received
from controller.nodes.actions.runner import ActionRunner
from controller.nodes.agent_outboxes import AgentOutboxes
from controller.nodes.app_faults import AppFaults
from controller.nodes.check_requests import CheckRequests
from controller.nodes.decide import decide, decide_held, heartbeat_returned, quarantine_not_carried_out
from controller.nodes.fleet import NO_JOBS, Fleet, NodeEntry, UnknownNode
from controller.nodes.found import Found, Outcome, Result, Source
from controller.nodes.guards.guard import Guard
from controller.nodes.rule_stats import rule_id
from controller.store import IncidentLog, PendingAction, Store, Tx
from controller.vocab.actions import Action, Page, Quarantine, action_kind
from controller.vocab.node_state import NodeState
from controller.vocab.policy import Policy
from protos.vigil.v1 import agent_pb2
from vigil_core.names import is_job_id
from vigil_core.rank_progress import RankRecord, is_valid
from vigil_core.signals import Signal, SignalKind

log = structlog.get_logger(__name__)


__all__ = ["Engine", "UnknownNode", "incident_id_for"]
MAX_JOBS_PER_NODE = 64
MAX_RANKS_PER_NODE = 256


def _pages(actions: Sequence[Action]) -> bool:
    return any(isinstance(a, Page) for a in actions)


def incident_id_for(node: str, spool_id: str, seq: int) -> str:
    """Deterministic, so a replayed signal could never open a second incident under a new name."""
    return f"{node}-{spool_id[:6]}-{seq}"


class Engine:
    """Built by the composition root (``controller.compose``) from the parts it is given."""

    def __init__(
        self,
        store: Store,
        policy: Policy,
        fleet: Fleet,
        runner: ActionRunner,
        guard: Guard,
        applier: Applier,
        app_faults: AppFaults,
        checks: CheckRequests,
        agents: AgentOutboxes,
        metrics: ControllerMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.policy = policy
        self.fleet = fleet
        self.runner = runner
        self.guard = guard
        self.applier = applier
        self.app_faults = app_faults
        self.checks = checks
        self.agents = agents  # commands to connected agents (the gateway opens their queues)
        self.metrics = metrics
        self.clock = clock
        # Remediation on: a quarantine a machine can repair is paged only if hands are needed (compose).
        self.defer_pages: Callable[[Signal, tuple[Action, ...], frozenset[str]], tuple[Action, ...]] = (
            lambda signal, actions, held: actions
        )

    # Agents --------------------------------------------------------------------------------

    def hello(
        self,
        node: str,
        spool_id: str,
        gpus: int,
        address: str = "",
        idle_heartbeat_s: float = 0.0,
        jobs: Sequence[str] = (),
        booted_at: float = 0.0,
    ) -> int:
        """Register a (re)connecting agent; returns the seq it may drop its spool up to (``ack_seq``).
        ``idle_heartbeat_s``: how long it may stay quiet with nothing new (0: it beats steadily);
        ``jobs``: what its processes run now; ``booted_at``: when the node booted (its clock; 0: not said)."""
        now = self.clock()
        entry = self.fleet.nodes.get(node)
        changed = entry is None  # what the database holds of the node: written only when it changes
        if entry is None:
            entry = self.fleet.add(node, NodeEntry(NodeState(node=node), spool_id, 0, now, gpus))
        elif entry.spool_id != spool_id:
            log.info("agent_new_spool", node=node, old=entry.spool_id, new=spool_id, old_last_seq=entry.last_seq)
            self._spool_replaced(node, entry, now)
            entry.spool_id, entry.last_seq, entry.spooled, changed = spool_id, 0, 0, True
        state = heartbeat_returned(entry.state)
        changed = changed or state is not entry.state or gpus != entry.gpus or gpus > entry.expected_gpus
        entry.state = state
        entry.last_heartbeat, entry.gpus, entry.address = now, gpus, address  # connected once its stream opens
        entry.connected_at, entry.idle_heartbeat_s, entry.booted_at = now, max(0.0, idle_heartbeat_s), booted_at
        self._jobs_seen(node, entry, jobs)
        self.fleet.watch_silence(node, now + self.policy.heartbeat_timeout_s)
        expected, entry.expected_gpus = entry.expected_gpus, max(entry.expected_gpus, gpus)
        if changed:  # a reconnection after a restart writes nothing: 100,000 agents come back at once
            self.store.nodes.register(entry.state, spool_id, entry.last_seq, gpus, now, entry.expected_gpus)
        if gpus < expected:
            reason = f"the node came back with {gpus} of its {expected} GPUs"
            outcome = self.found(Found(node, f"inventory-{int(now)}", reason, Source.INVENTORY, SignalKind.GPU_LOST))
            log.error("gpus_missing", node=node, gpus=gpus, expected=expected, outcome=str(outcome))
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
        outcome = self.found(
            Found(node, f"spool-{entry.spool_id[:12]}", reason, Source.CONTROLLER, SignalKind.SPOOL_LOST)
        )
        log.error("agent_spool_signals_maybe_lost", node=node, signals=entry.spooled, outcome=str(outcome))

    async def durable(self) -> None:
        """Return once what was recorded so far is on disk (before an ack; ``store.group_commit``)."""
        await self.store.group.durable()

    async def hello_durable(self, node: str) -> None:
        """Return once what the answer to the node's Hello lets its agent drop is on disk: the
        batches it sent before (``NodeEntry.recorded_at``), not what other nodes' agents sent since.
        Not the Hello's own write either: a controller that stops before that is on disk has
        nobody to answer, and the agent says its Hello again to the next, which writes it then;
        the node's batches that follow are acknowledged only once everything before them, that
        write too, is on disk. So an agent whose faults wait is not answered after the writes of a
        whole fleet saying Hello at once (measured at 100,000 nodes on PostgreSQL: 0.2-3.0 s at P50).

        Only such a Hello waits this little (``AgentSessions.start``): the fleet's wait for the
        flush of everything before them is what paces them through a relay. With every Hello
        answered at once the controller's event loop was never free, the relays' streams were read
        seconds behind (what gRPC had taken of them no fault can pass), and a fault's signals
        after its Hello waited 2.6-3.7 s there (0.1 s before); a fleet connected no sooner."""
        entry = self.fleet.nodes.get(node)
        await self.store.group.durable(entry.recorded_at if entry is not None else 0)

    def send_ack(self, node: str) -> None:
        """An action finished: once that is on disk, the agent may drop the signals that asked for it."""
        self.store.group.then(
            lambda: self.agents.send(node, agent_pb2.ControllerMessage(ack=agent_pb2.Ack(acked_seq=self.ack_seq(node))))
        )

    def ack_seq(self, node: str) -> int:
        """What the agent may drop: everything received, except signals whose actions are under way."""
        entry = self.fleet.entry(node)
        held_back = self.runner.held_back_seq(node)
        return entry.last_seq if held_back is None else min(entry.last_seq, held_back - 1)

    def _jobs_seen(self, node: str, entry: NodeEntry, jobs: Sequence[str]) -> None:
        seen = frozenset(j for j in jobs[:MAX_JOBS_PER_NODE] if is_job_id(j))
        if seen != entry.jobs:  # else the set it has stays: a new one every heartbeat would be long-lived garbage
            entry.jobs = seen or NO_JOBS
        self.app_faults.membership.agent_sees(node, entry.jobs)

    def heartbeat(
        self,
        node: str,
        dropped_faults: int = 0,
        spooled: int = 0,
        jobs: Sequence[str] = (),
        unparsed: Sequence[str] = (),
        unparsed_total: int = 0,
        ranks: Sequence[RankRecord] = (),
    ) -> None:
        entry = self.fleet.entry(node)
        entry.last_heartbeat, entry.spooled = self.clock(), max(0, spooled)
        self._jobs_seen(node, entry, jobs)
        entry.ranks = tuple(r for r in ranks[:MAX_RANKS_PER_NODE] if r.node == node and is_valid(r))
        if len(entry.ranks) < len(ranks):  # its agent sent what no agent of this version sends
            log.warning("agent_rank_progress_refused", node=node, sent=len(ranks), kept=len(entry.ranks))
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
            self.store.nodes.save([new_state], durable=False)
            self.store.group.soon()

    def connected(self, node: str) -> None:
        """A stream of the node's agent is open and answered (its Hello was recorded)."""
        if (entry := self.fleet.nodes.get(node)) is not None:
            entry.connected = True

    def disconnected(self, node: str) -> None:
        if (entry := self.fleet.nodes.get(node)) is not None:
            entry.connected, entry.disconnected_at = False, self.clock()
            self.fleet.watch_silence(node, entry.disconnected_at + self.policy.heartbeat_timeout_s)
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
                incident_id = incident_id_for(node, entry.spool_id, signal.seq)
                state, item = self._decide(state, signal, now, incident_id, entry.spool_id)
                last_seq = signal.seq
                received.append(item)
            if not received:
                return self.ack_seq(node)
            self.applier.commit(entry.spool_id, received, state, last_seq, now, self._stored_with)
        entry.state, entry.last_seq, entry.last_heartbeat = state, last_seq, now
        entry.recorded_at = self.store.group.made
        return self.ack_seq(node)

    # Actions -------------------------------------------------------------------------------

    def resume_pending(self) -> int:
        """At start: the actions an earlier controller left PENDING, and the guard's pages it owed."""
        self.guard.resume_owed()
        pending = self.store.actions.pending()
        faults = self.store.incidents.faults_of([p.incident_id for p in pending if p.action.node])
        for p in pending:
            if why := self._held_at_restart(p, faults.get(p.incident_id)):
                self.store.actions.set_status([(p.incident_id, action_kind(p.action))], "HELD", why)
                log.warning("action_held", incident=p.incident_id, node=p.action.node, why=why)
                continue
            self.runner.schedule(p)
        if pending:
            log.info("actions_resumed", count=len(pending))
        return len(pending)

    def _held_at_restart(self, pending: PendingAction, fault: tuple[str, int] | None) -> str | None:
        """Why to hold a quarantine or page left PENDING (it was settling when the controller
        stopped, and its fault's fleet incident holds it); None: carry it out."""
        if fault is None or not isinstance(pending.action, (Quarantine, Page)):
            return None
        return self.guard.holds_resumed(pending.action, rule_id(*fault))

    def _decide(
        self, state: NodeState, signal: Signal, now: float, incident_id: str, filed_under: str, shared: bool = True
    ) -> tuple[NodeState, Received]:
        """Decide one signal (filed under its agent's spool, or what found it) and pass its actions
        through the guardrails (``shared``: one fault on many nodes may be a shared cause; not for
        what the controller's own checks found)."""
        job, page = self.app_faults.crash_of(signal, self.policy, now)
        if page is not None:
            self.runner.request(page, now)
        decision = decide(state, signal, self.policy, now, incident_id, job)
        application = not job and self.policy.rule_for(signal).application
        if application and _pages(decision.actions) and self.app_faults.may_be_crash(signal.node):
            # Its job's other nodes may not have reported theirs yet: wait for them before deciding.
            decision = decide(state, signal, self.policy, now, incident_id, hold=True)
            self.app_faults.hold(signal, filed_under, now)
        rule = rule_id(signal.kind.value, signal.code) if shared else ""
        return self._guarded(decision.state, decision.actions, Received(signal, incident_id, ()), now, rule)

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
                held, rule = Received(signal, "", (), new=False), rule_id(signal.kind.value, signal.code)
                state, item = self._guarded(decision.state, decision.actions, held, now, rule)
                self.applier.commit(entry.spool_id, [item], state, entry.last_seq, now, self._stored_with)
            entry.state = state
            log.info(
                "application_fault_decided", node=signal.node, code=signal.code, held_s=self.app_faults.config.grace_s
            )
        waiting, gone = self.app_faults.changes()  # decided with nothing to do: no longer held all the same
        if waiting or gone:
            with self.store.tx(durable=False) as db:
                IncidentLog.held(db, waiting, gone)
            self.store.group.soon()
        return len(due)

    def _stored_with(self, db: Tx) -> None:
        """What a decision changed beside its batch, in the batch's transaction: the guard's windows
        and the application XIDs held (a controller killed between two writes would lose them)."""
        self.guard.write_with(db)
        IncidentLog.held(db, *self.app_faults.changes())

    def _guarded(
        self, state: NodeState, decided: tuple[Action, ...], item: Received, now: float, rule: str = ""
    ) -> tuple[NodeState, Received]:
        """Pass a decision's actions through the guardrails."""
        actions, held = self.guard.apply(decided, now, rule)
        actions = self.defer_pages(item.signal, actions, held)
        if any(isinstance(a, Quarantine) and a.dry_run for a in actions):
            state = quarantine_not_carried_out(state)
        return state, replace(item, actions=actions, held=held)

    async def wait_for_actions(self) -> None:
        """Wait for the actions under way to finish (tests and benchmarks)."""
        await self.runner.drain()

    async def shutdown(self) -> None:
        """Stop now: actions still under way stay PENDING in the store and resume at the next start."""
        self.guard.cancel()
        await self.runner.shutdown()

    # Faults the controller found itself -------------------------------------------------------

    def found(self, fault: Found) -> Outcome:
        """Decide a fault the controller found itself, like an agent's signal: through the policy and
        the guardrails. A fabric component's nodes are held together in its failure domain: one page
        names the component, and none of them is cordoned one by one."""
        if fault.is_component:
            return self._component(fault)
        entry = self.fleet.nodes.get(fault.node)
        if entry is None:
            return Outcome(Result.UNKNOWN_NODE)
        now = self.clock()
        signal = Signal(fault.node, fault.kind, message=fault.reason, source=fault.source.value, observed_at=now)
        incident_id = f"{fault.node}-{fault.key}"
        with self.guard.saving():
            state, item = self._decide(entry.state, signal, now, incident_id, fault.key, shared=False)
            # Filed under its key (the sweep, the job), not the agent's spool: the agent's seq stays its own.
            self.applier.commit(fault.key, [item], state, entry.last_seq, now, self._stored_with)
        entry.state = state
        quarantine = next((a for a in item.actions if isinstance(a, Quarantine)), None)
        if quarantine is None:
            return Outcome(Result.NOT_QUARANTINED, incident_id, f"the node is {state.health.value}")
        if action_kind(quarantine) in item.held:
            return Outcome(Result.HELD_BY_BREAKER, incident_id)
        return Outcome(Result.DRY_RUN if quarantine.dry_run else Result.QUARANTINE_REQUESTED, incident_id)

    def _component(self, fault: Found) -> Outcome:
        domain = fault.domain or f"fabric={fault.node}"
        nodes = [n for n in fault.behind if n in self.fleet.nodes]
        with self.guard.saving():
            news = self.guard.hold_component(fault.node, domain, nodes, fault.reason, self.clock())
        for node in nodes:
            reason = f"behind {fault.node}: {fault.reason}"
            self.found(Found(node, f"{fault.key}-{domain}", reason, fault.source, fault.kind))
        paged = "paged once" if news else "its domain was suspect already: not paged again"
        return Outcome(
            Result.HELD_IN_DOMAIN, "", f"{domain}: {len(nodes)} node(s) behind it, none taken out of service; {paged}"
        )
