"""One node's repair, from its quarantine to its return to service or a person's hands. Pure.

A repair climbs its ladder (``controller.repairs.ladder``) one rung at a time:

    WAITING ──(nothing stops it)──► RUNNING ──(done)──► SETTLING ──(settle_s)──► CERTIFYING ──(passed)──► HOLDING
       ▲                               │ failed, timed out                           │ failed            │ hold_down_s
       └── refused: a process holds ───┤                                             │ ◄── a fault again ┤ quiet
           the GPU (the job has not    ▼                                             ▼                   ▼
           left yet)                 the next rung ◄─────────────────────────────────┘                RELEASED
                                       └── replace: HANDS (a person is paged, with what was tried)

A re-check runs nothing: it settles and certifies. Nothing starts while something stops it
(``refusal``): the node's workload still there (waited for up to ``workload_wait_s``, then hands),
another owner holding the node, the domain's or the fleet's repairs at their cap, or the fleet's
guard holding a storm. A node repaired ``max_repairs`` times within ``repairs_window_s`` goes
straight to hands: a repeat offender is replaced, not repaired again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from controller.repairs.config import RemediationConfig
from controller.repairs.ladder import Fault, OwnLadder, Step, gpus_to_reset, plan_ladder


class Phase(StrEnum):
    WAITING = "waiting"  # for what stops it to go (its workload, an owner, a cap, a storm)
    RUNNING = "running"  # a step under way
    SETTLING = "settling"  # a step done: the node settles before it is certified
    CERTIFYING = "certifying"
    HOLDING = "holding"  # certified: out of service a while longer, in case the fault comes back
    RELEASED = "released"  # certified and back in service (or left to an owner who changed it)
    HANDS = "hands"  # replace: a person is paged

    @property
    def ended(self) -> bool:
        return self in (Phase.RELEASED, Phase.HANDS)


@dataclass(frozen=True, slots=True)
class Repair:
    node: str
    incident_id: str
    ladder: tuple[Step, ...]
    gpus: tuple[str, ...]  # the faulted GPUs' PCI bus ids (a reset's target); () the node's
    opened_at: float
    since: float  # when its phase began
    rung: int = 0
    phase: Phase = Phase.WAITING
    waiting_for: str = ""  # what stops it, said
    tried: tuple[str, ...] = ()  # each rung tried and what became of it, said
    attempt: int = 0  # steps started: each step's request is named by it
    repaired_at: float = 0.0  # when its last step was done: a fault of the node after it, it did not fix

    @property
    def step(self) -> Step:
        return self.ladder[min(self.rung, len(self.ladder) - 1)]


@dataclass(frozen=True, slots=True)
class Stops:
    """What may stop a repair from starting its step now, as the shell read it."""

    jobs: frozenset[str] = frozenset()  # training jobs the node's agent sees there
    labels: Mapping[str, str] = field(default_factory=dict)
    others: str = ""  # another owner changed the node since Vigil's quarantine (the actuator says)
    domain_busy: str = ""  # a failure domain whose repairs under way are at the cap
    started_last_hour: int = 0
    storm: str = ""  # the fleet's guard holds quarantines for a person


def refusal(stops: Stops, step: Step, config: RemediationConfig) -> str:
    """Why the step must not start now ('' when nothing stops it). Replace is a page: nothing
    stops it. A re-check runs nothing on the node, but still waits for the workload to leave."""
    if step is Step.REPLACE:
        return ""
    if stops.jobs:
        return f"workload: job {', '.join(sorted(stops.jobs))} still runs there"
    for label, free in config.hands_off.items():
        value = stops.labels.get(label)
        if value is not None and value != free:
            return f"owner: label {label}={value} (another owner holds the node)"
    if stops.storm:
        return f"storm: {stops.storm}"
    if stops.domain_busy:
        return f"cap: {config.per_domain} repair(s) under way in {stops.domain_busy}"
    if step is not Step.RECHECK and stops.started_last_hour >= config.per_hour:
        return f"cap: {config.per_hour} repairs started in the last hour"
    if stops.others:  # last: the cluster is read only when nothing else stops the step
        return f"owner: {stops.others}"
    return ""


def open_repair(
    node: str,
    incident_id: str,
    faults: Sequence[Fault],
    config: RemediationConfig,
    now: float,
    repaired_at: Sequence[float] = (),
    own_ladder: OwnLadder = lambda fault: None,
) -> Repair:
    """A repair for a node just quarantined; ``repaired_at``: when its earlier repairs ended released;
    ``own_ladder``: a policy rule's own ladder (``ladder:``)."""
    ladder = plan_ladder(faults, config.steps, own_ladder)
    repair = Repair(node, incident_id, ladder, gpus_to_reset(faults), now, now)
    times = sum(1 for t in repaired_at if t > now - config.repairs_window_s)
    if times >= config.max_repairs:
        days = config.repairs_window_s / 86400
        return _climb_to_hands(repair, f"repaired {times} times in {days:g} days: a repeat offender", now)
    return repair


def start(repair: Repair, stops: Stops, config: RemediationConfig, now: float) -> Repair:
    """A waiting repair: start its step, go on waiting (said), or, when its workload stayed past
    ``workload_wait_s``, call for hands."""
    if repair.phase is not Phase.WAITING:
        return repair
    why = refusal(stops, repair.step, config)
    if why:
        if why.startswith("workload") and now - repair.since >= config.workload_wait_s:
            waited = f"waited {now - repair.since:.0f} s for its workload to leave ({why})"
            return _climb_to_hands(repair, waited, now)
        return replace(repair, waiting_for=why) if why != repair.waiting_for else repair
    if repair.step is Step.REPLACE:
        return replace(repair, phase=Phase.HANDS, since=now, waiting_for="")
    if repair.step is Step.RECHECK:
        rechecked = replace(repair, phase=Phase.SETTLING, since=now, waiting_for="", attempt=repair.attempt + 1)
        return replace(rechecked, repaired_at=now)
    return replace(repair, phase=Phase.RUNNING, since=now, waiting_for="", attempt=repair.attempt + 1)


def step_done(repair: Repair, ok: bool, busy: bool, detail: str, now: float) -> Repair:
    """What the step's executor said: done (settle, then certify), refused because a process holds
    the GPU (wait for it to leave, then try again), or failed (the next rung)."""
    if repair.phase is not Phase.RUNNING:
        return repair
    if ok:
        done = (*repair.tried, f"{repair.step.said}: done")
        return replace(repair, phase=Phase.SETTLING, since=now, repaired_at=now, tried=done)
    if busy:
        return replace(repair, phase=Phase.WAITING, waiting_for=f"workload: {detail}")
    return climb(repair, f"{repair.step.said}: failed: {detail}", now)


def done_as_of(repair: Repair, finished_at: float) -> Repair:
    """A step the node carried out and said done, as of when it finished there (``finished_at``, the
    node's clock, as its faults' times; 0: not said): a fault the node observed after that came after
    the step (``held_down`` climbs for it), even one that reached the controller before the answer."""
    if repair.phase is not Phase.SETTLING or finished_at <= 0:
        return repair
    return replace(repair, repaired_at=finished_at)


REBOOT_CLOCKS_S = 60.0  # how far behind the controller's clock a node's may be when its boot is compared with the ask


def reboot_done(repair: Repair, connected: bool, connected_at: float, booted_at: float, now: float) -> Repair:
    """A reboot under way is done once the node's agent says Hello after the ask (``connected_at``,
    the controller's clock) from a boot after it (``booted_at``, the node's clock, as its faults'
    times; 0: not said, and the Hello alone is taken). Done as of that boot: a fault the node observed
    after it came after the reboot (``held_down`` climbs for it), even one that reached the controller
    before it saw the agent back. An agent back without a new boot (its connection lost and found
    again) is not the reboot: it waits on, up to the step's timeout."""
    if repair.phase is not Phase.RUNNING or repair.step is not Step.REBOOT:
        return repair
    if not connected or connected_at <= repair.since:
        return repair
    if booted_at and booted_at < repair.since - REBOOT_CLOCKS_S:
        return repair
    return done_as_of(step_done(repair, True, False, "rebooted", now), booted_at)


def step_result(before: Repair, after: Repair) -> str:
    """How a step that was running ended ('' when it had not): done, refused (a process still held
    the GPU: it waits), or failed (failed or timed out: the next rung)."""
    if before.phase is not Phase.RUNNING or after.phase is Phase.RUNNING:
        return ""
    if after.phase is Phase.SETTLING:
        return "done"
    return "refused" if after.phase is Phase.WAITING and after.rung == before.rung else "failed"


def timed_out(repair: Repair, config: RemediationConfig, now: float) -> Repair:
    """A step still under way past its timeout climbs to the next rung."""
    if repair.phase is not Phase.RUNNING or now - repair.since < config.timeout_s(repair.step):
        return repair
    return climb(repair, f"{repair.step.said}: no answer within {config.timeout_s(repair.step):.0f} s", now)


def settled(repair: Repair, config: RemediationConfig, now: float) -> bool:
    """Whether a repair that settles may be certified now."""
    return repair.phase is Phase.SETTLING and now - repair.since >= config.settle_s


def certifying(repair: Repair, now: float) -> Repair:
    return replace(repair, phase=Phase.CERTIFYING, since=now) if repair.phase is Phase.SETTLING else repair


def certified(repair: Repair, passed: bool, detail: str, now: float) -> Repair:
    """Certification's verdict: back in service, or the next rung (a node that failed it never goes back)."""
    if repair.phase is not Phase.CERTIFYING:
        return repair
    if passed:
        return replace(repair, phase=Phase.HOLDING, since=now, tried=(*repair.tried, f"certified: {detail}"))
    return climb(repair, f"certification failed: {detail}", now)


UNJUDGED_TRIES = 3  # certifications in a row that could not judge the node before it counts as failed
_UNJUDGED = "certification could not judge the node"


def not_certified(repair: Repair, detail: str, now: float) -> Repair:
    """Certification measured nothing that judges the node, for a reason that is not the node's (a
    peer's port taken, a GPU busy, an agent away: ``checks.result.NotRun``): it runs again after
    the settling time, up to ``UNJUDGED_TRIES`` in a row; then it counts as failed, said. Never a
    pass, and never the next rung on the first such try (a reboot for a peer's port)."""
    if repair.phase is not Phase.CERTIFYING:
        return repair
    tries = 1 + next(
        (i for i, t in enumerate(reversed(repair.tried)) if not t.startswith(_UNJUDGED)), len(repair.tried)
    )
    if tries >= UNJUDGED_TRIES:
        return climb(repair, f"{_UNJUDGED} {tries} times: {detail}", now)
    said = f"{_UNJUDGED}: {detail}"
    return replace(repair, phase=Phase.SETTLING, since=now, waiting_for=f"certification again: {detail}"[:300],
                   tried=(*repair.tried, said))  # fmt: skip


def held_down(repair: Repair, last_fault_at: float, config: RemediationConfig, now: float) -> Repair:
    """A certified node goes back once quiet for ``hold_down_s``; a fault of its own observed since
    its step was done (``last_fault_at``, when its latest was) climbs the ladder instead: the step did
    not fix it, whether it came while the node settled, was certified or was held down."""
    if repair.phase is not Phase.HOLDING:
        return repair
    if last_fault_at > repair.repaired_at:
        return climb(
            repair, f"a fault again {last_fault_at - repair.repaired_at:.0f} s after the {repair.step.said}", now
        )
    if now - repair.since >= config.hold_down_s:
        return replace(repair, phase=Phase.RELEASED, since=now)
    return repair


def resumed(repair: Repair, now: float) -> Repair:
    """A repair read back after the controller restarted (or another replica took over). A reset whose
    answer was lost with the old process is asked again on the same rung (the refusals apply anew; a
    reset is safe to repeat); a reboot still waits for its node's agent to say hello; a certification
    cut off runs again."""
    if repair.phase is Phase.RUNNING and repair.step.on_agent:
        lost = f"{repair.step.said}: its answer lost with the controller's restart; asked again"
        return replace(repair, phase=Phase.WAITING, since=now, tried=(*repair.tried, lost))
    if repair.phase is Phase.CERTIFYING:
        return replace(repair, phase=Phase.SETTLING)
    return repair


def climb(repair: Repair, why: str, now: float) -> Repair:
    """The next rung, what happened on this one said; at replace, hands."""
    rung = min(repair.rung + 1, len(repair.ladder) - 1)
    moved = replace(repair, rung=rung, phase=Phase.WAITING, since=now, waiting_for="", tried=(*repair.tried, why))
    return replace(moved, phase=Phase.HANDS) if moved.step is Step.REPLACE else moved


def _climb_to_hands(repair: Repair, why: str, now: float) -> Repair:
    return replace(
        repair, rung=len(repair.ladder) - 1, phase=Phase.HANDS, since=now, waiting_for="", tried=(*repair.tried, why)
    )


def hands_summary(repair: Repair) -> str:
    """What a person is told when hands are needed: what was tried, and why a person now."""
    tried = "; ".join(repair.tried) or "nothing could be tried"
    return f"Vigil could not repair {repair.node} without hands. Tried: {tried}"
