"""The decision function: ``(node state, signal, policy, time) -> (new state, actions)``. Pure.

States: HEALTHY → SUSPECT → UNHEALTHY (quarantine decided) → QUARANTINED (the actuator confirmed),
and UNKNOWN while Vigil cannot see the node: heartbeats are missing, or one of its agent's collectors
hung (COLLECTOR_HUNG; a wedged driver can hang NVML). A node's health only rises through signals;
it falls back only through an explicit recovery (``uncordon``), a returning heartbeat or the hung
collector's recovery signal (COLLECTOR_HUNG with code 0) — and only once nothing keeps it blind.

Counting is per GPU, kind and code, over the rule's window, timed by when the agent observed the
signal (a replay after an outage keeps the original times). A signal folded at the agent counts as
many observations as its ``count``. Signals of the same GPU, kind and code within ``fold_window_s``
of an incident fold into it: a flood of XID 45 is one incident with a count, and a count that
crosses a threshold escalates the same incident rather than opening another.

The cost of one decision does not grow with a flood: each key keeps only as many times as its
rule's highest threshold needs, and a node keeps at most ``MAX_KEYS`` keys and incident references
(a hostile stream of made-up codes forgets its oldest ones, never the node's memory).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from controller.vocab.actions import (
    Action,
    EscalateIncident,
    FoldIntoIncident,
    Incident,
    OpenIncident,
    Page,
    PageUpdate,
    Quarantine,
    ResolveIncident,
)
from controller.vocab.node_state import Health, IncidentRef, NodeState
from controller.vocab.policy import Policy, Severity
from controller.vocab.xid_catalog import RECOVERY_XID
from vigil_core.recovery import RecoveryAction, recovery_action
from vigil_core.signals import GpuRef, Signal, SignalKind

_OUT_OF_SERVICE = (Health.UNHEALTHY, Health.QUARANTINED)
MAX_KEYS = 256  # per node: counted keys and open incident references
MAX_QUARANTINE_HISTORY = 32  # per node: the times it was quarantined


@dataclass(frozen=True, slots=True)
class Decision:
    state: NodeState
    actions: tuple[Action, ...]


def describe_gpu(gpu: GpuRef) -> str:
    return gpu.describe() + (f", {gpu.uuid}" if gpu.uuid else "")


def signal_key(signal: Signal) -> str:
    return f"{signal.gpu.key}|{signal.kind.value}|{signal.code}"


def decide(
    state: NodeState,
    signal: Signal,
    policy: Policy,
    now: float,
    incident_id: str,
    job_fault: str = "",
    hold: bool = False,
) -> Decision:
    """What one signal means for its node. ``incident_id`` names the incident if one is opened;
    ``job_fault``: the job whose own crash this application XID is part of (recorded, no action);
    ``hold``: an application XID waiting for its job's other nodes (recorded and counted, decided
    later by ``decide_held``)."""
    if signal.kind is SignalKind.COLLECTOR_HUNG:
        state = _collector_hung(state, signal)
        if signal.code == 0:
            return Decision(state, ())  # the collector recovered
    rule = policy.rule_for(signal)
    if signal.value < rule.min_value or (signal.kind is SignalKind.THROTTLE and signal.code == 0):
        return Decision(state, ())  # below the rule's bar (throttling too short, or it ended)
    at = signal.observed_at if signal.observed_at > 0 else now
    key = signal_key(signal)
    recent = _prune(state.recent, at, policy.longest_window_s)
    cap = rule.count_cap
    prior = tuple(t for t in recent.get(key, ()) if t > at - rule.window_s)
    counted = _counted(signal, rule.application, prior, at, policy.crash_s)
    recent[key] = (prior + (at,) * min(counted, cap))[-cap:]
    severity = rule.severity_at(len(prior) + counted)
    if state.health in _OUT_OF_SERVICE:
        severity = Severity.RECORD  # already out of service: keep the evidence, act no further
    meaning = rule.meaning
    if job_fault and rule.application:
        severity, meaning = Severity.RECORD, f"{rule.meaning} (part of job {job_fault}'s own crash)"
    elif hold and rule.application:
        severity = Severity.RECORD
    summary = f"{signal.describe()}: {rule.meaning}"
    if signal.kind is SignalKind.CHECK_FAILED and signal.message:
        summary += f": {signal.message}"  # the check's own reason is the whole point of its page

    open_refs = tuple(r for r in state.incidents if r.last_at >= at - policy.fold_window_s)[-MAX_KEYS:]
    existing = next((r for r in open_refs if r.key == key), None)
    if existing is not None and _driver_recovered(signal) and state.health not in _OUT_OF_SERVICE:
        return _cleared(replace(state, recent=recent), existing, open_refs, signal.node, at)
    actions: list[Action] = []
    if existing is not None and severity.rank <= existing.severity.rank:
        refs = _replace_ref(open_refs, replace(existing, last_at=at))
        actions.append(FoldIntoIncident(existing.id, at, signal.count))
        return Decision(replace(state, recent=recent, incidents=refs), tuple(actions))
    if existing is not None:
        target = existing.id
        refs = _replace_ref(open_refs, replace(existing, severity=severity, last_at=at))
        actions.append(EscalateIncident(target, severity, at, signal.count))
    else:
        target = incident_id
        incident = Incident(
            id=incident_id,
            node=signal.node,
            gpu=signal.gpu,
            kind=signal.kind,
            code=signal.code,
            severity=severity,
            meaning=meaning,
            remedy=rule.remedy,
            first_message=signal.message,
            first_seq=signal.seq,
            first_observed_at=at,
            opened_at=now,
        )
        refs = (*open_refs, IncidentRef(incident_id, key, severity, at))[-MAX_KEYS:]
        actions.append(OpenIncident(incident, signal.count))

    health, before_unknown = state.health, state.health_before_unknown
    did = "recorded; nothing changed on the node"
    if severity is Severity.QUARANTINE:
        health = Health.UNHEALTHY
        did = "taking the node out of service (quarantine); an update follows when it is done"
        actions.append(Quarantine(target, signal.node, summary, rule.remedy, at))
    elif severity is Severity.SUSPECT and state.hung_collectors and health is Health.UNKNOWN:
        # Blind is worse than suspect: stay UNKNOWN, and come back as SUSPECT once it recovers.
        before_unknown = Health.SUSPECT if before_unknown is Health.HEALTHY else before_unknown
    elif severity is Severity.SUSPECT and health in (Health.HEALTHY, Health.UNKNOWN):
        health = Health.SUSPECT
        did = "marked the node SUSPECT; it stays in service"
    if severity is not Severity.RECORD:
        actions.append(Page(target, signal.node, severity, summary, rule.remedy, at, describe_gpu(signal.gpu), did))
    new_state = replace(state, health=health, health_before_unknown=before_unknown, recent=recent, incidents=refs)
    return Decision(new_state, tuple(actions))


def _counted(signal: Signal, application: bool, prior: tuple[float, ...], at: float, crash_s: float) -> int:
    """Observations this signal adds to its count. An application XID counts crashes, not lines: one
    crash writes a burst of them on a GPU (one per SM, folded by the agent or not), so lines within
    ``crash_s`` of the last counted one are that crash; a storm the agent folded is one crash, or two
    (its first and its last) when it lasted ``crash_s`` or more."""
    if not application:
        return signal.count
    if signal.count <= 0 or (prior and at - prior[-1] < crash_s):
        return 0
    first = signal.first_observed_at if 0 < signal.first_observed_at <= at else at
    return 2 if signal.count > 1 and at - first >= crash_s else 1  # a storm: its first and last crash


def _driver_recovered(signal: Signal) -> bool:
    """XID 154 saying the GPU needs no recovery action any more."""
    return (
        signal.kind is SignalKind.XID
        and signal.code == RECOVERY_XID
        and recovery_action(signal.message) is RecoveryAction.NONE
    )


def _cleared(
    state: NodeState, raised: IncidentRef, open_refs: tuple[IncidentRef, ...], node: str, at: float
) -> Decision:
    """What an earlier XID 154 raised on this GPU, cleared by a later one that says none: its
    incident resolved (and said in its thread, if it was paged), a SUSPECT node HEALTHY again when
    nothing else of it is open. A node out of service stays for its release checks."""
    others = any(r.id != raised.id and r.severity is not Severity.RECORD for r in open_refs)
    recent = {k: v for k, v in state.recent.items() if k != raised.key}
    state = incident_resolved(replace(state, recent=recent, incidents=open_refs), raised.id, others)
    actions: list[Action] = [ResolveIncident(raised.id, at)]
    if raised.severity is not Severity.RECORD:
        text = "Resolved: the driver says the GPU needs no recovery action any more (XID 154: none)"
        actions.append(PageUpdate(raised.id, node, "RESOLVED", text, resolve=True, observed_at=at))
    return Decision(state, tuple(actions))


def decide_held(state: NodeState, signal: Signal, policy: Policy, now: float) -> Decision:
    """A held application XID, decided now that no crash of its job claimed it: what its count (the
    held signals are already in it) means, as if it had arrived now, without counting it again.
    Nothing when its incident is gone meanwhile (a person resolved it)."""
    decision = decide(state, replace(signal, count=0, observed_at=now), policy, now, incident_id="")
    if any(isinstance(a, OpenIncident) for a in decision.actions):
        return Decision(state, ())
    return decision


def quarantine_not_carried_out(state: NodeState) -> NodeState:
    """Dry-run: the quarantine was decided and paged ("would quarantine") but nothing was done, so
    the node is still in service: SUSPECT, not UNHEALTHY (a later, worse fault decides and pages
    again; the same fault folds into its incident)."""
    if state.health is not Health.UNHEALTHY:
        return state
    return replace(state, health=Health.SUSPECT)


def suspicion_lapsed(
    state: NodeState, now: float, policy: Policy, held_since: Callable[[float], float] = lambda _: 0.0
) -> bool:
    """A SUSPECT node whose last page-worthy signal is older than the policy's quiet period, not
    counting the time the controller itself was held since (``held_since``, as for a node's silence):
    a new fault may be waiting to be read."""
    if state.health is not Health.SUSPECT or policy.suspect_clear_s is None:
        return False
    return now - state.last_fault_at - held_since(state.last_fault_at) > policy.suspect_clear_s


def quarantine_confirmed(state: NodeState, at: float) -> NodeState:
    """The actuator took the node out of service."""
    if state.health is Health.QUARANTINED:
        return state
    history = (*state.quarantine_history, at)[-MAX_QUARANTINE_HISTORY:]
    return replace(state, health=Health.QUARANTINED, quarantined_at=at, quarantine_history=history)


def heartbeat_silence(state: NodeState, silent_for: float, policy: Policy) -> NodeState:
    """UNKNOWN once heartbeats stop for longer than the policy allows; never from out-of-service."""
    if silent_for <= policy.heartbeat_timeout_s:
        return state
    return silenced(state)


def silenced(state: NodeState) -> NodeState:
    """The node's agent went silent: UNKNOWN, remembering what it was; never from out-of-service."""
    if state.health in (*_OUT_OF_SERVICE, Health.UNKNOWN):
        return state
    return replace(state, health=Health.UNKNOWN, health_before_unknown=state.health)


def silence_deadline(
    last_heard: float,
    connected: bool,
    disconnected_at: float,
    idle_heartbeat_s: float,
    policy: Policy,
    held_since: Callable[[float], float] = lambda _: 0.0,
) -> float:
    """When the node counts as silent if nothing more is heard. Its agent's stream closed: the
    policy's ``heartbeat_timeout_s`` after it closed. Its stream open (HTTP/2 keepalive says the
    machine answers): three of its idle heartbeats (what its Hello said; 0 for an agent that beats at
    a steady rate) after it last said anything, never sooner than the timeout: an agent stuck with
    its connection up. Either way later by as long as the controller itself was held since
    (``held_since``: its event loop's lateness, ``vigil_core.loop_lag``): what the agent said
    meanwhile may be waiting to be read."""
    if not connected:
        since = max(last_heard, disconnected_at)
        return since + policy.heartbeat_timeout_s + held_since(since)
    return last_heard + max(policy.heartbeat_timeout_s, 3 * idle_heartbeat_s) + held_since(last_heard)


def heartbeat_returned(state: NodeState) -> NodeState:
    if state.health is not Health.UNKNOWN or state.hung_collectors:
        return state  # a hung collector keeps the node UNKNOWN although its agent talks
    return replace(state, health=state.health_before_unknown)


def _collector_hung(state: NodeState, signal: Signal) -> NodeState:
    """COLLECTOR_HUNG names the collector in ``source``; code 1 means stuck, code 0 recovered."""
    collector = signal.source or "unnamed"
    if signal.code != 0:
        hung = state.hung_collectors | {collector}
        if state.health in _OUT_OF_SERVICE or state.health is Health.UNKNOWN:
            return replace(state, hung_collectors=hung)
        return replace(state, health=Health.UNKNOWN, health_before_unknown=state.health, hung_collectors=hung)
    state = replace(state, hung_collectors=state.hung_collectors - {collector})
    return heartbeat_returned(state)  # the agent just spoke, so only a hung collector keeps it blind


def incident_resolved(state: NodeState, incident_id: str, others_open: bool) -> NodeState:
    """A person resolved one incident of a node in service: it no longer folds new signals, and a
    SUSPECT node whose last open incident it was is HEALTHY again."""
    state = replace(state, incidents=tuple(r for r in state.incidents if r.id != incident_id))
    if state.health is Health.SUSPECT and not others_open:
        return recovered(state)
    return state


def recovered(state: NodeState) -> NodeState:
    """Back in service: forget the incidents' counts so old faults do not re-trigger; remember how
    often it was quarantined (a repeat offender is not released automatically)."""
    return NodeState(node=state.node, quarantine_history=state.quarantine_history)


def _prune(recent: dict[str, tuple[float, ...]], at: float, horizon: float) -> dict[str, tuple[float, ...]]:
    """Keys still inside the longest window; at most ``MAX_KEYS - 1`` of them, the latest seen."""
    pruned = {k: v for k, v in recent.items() if v and v[-1] > at - horizon}
    if len(pruned) >= MAX_KEYS:
        latest = sorted(pruned, key=lambda k: pruned[k][-1])[-(MAX_KEYS - 1) :]
        pruned = {k: pruned[k] for k in latest}
    return pruned


def _replace_ref(refs: tuple[IncidentRef, ...], new: IncidentRef) -> tuple[IncidentRef, ...]:
    return tuple(new if r.id == new.id else r for r in refs)
