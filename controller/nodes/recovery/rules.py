"""When a quarantined node goes back into service on its own. Pure.

Only after a hold-down (a node that faulted often faults again soon after a reboot) and only when
the node's own health check, run by its agent after the hold-down, passes. Vigil releases only
nodes it quarantined itself (the actuator checks the ownership it recorded on the node); a node a
person cordoned stays as the person left it.
"""

from __future__ import annotations

from pydantic import Field

from controller.nodes.decide import quarantine_confirmed
from controller.vocab.actions import Drain, ExternalAction, PageUpdate, Quarantine
from controller.vocab.node_state import Health, NodeState
from vigil_core.config_file import ConfigModel


class RecoveryConfig(ConfigModel):
    auto_release: bool = Field(default=True, description="release quarantined nodes whose checks pass")
    hold_down_s: float = Field(default=1800.0, ge=0, description="time out of service before any check")
    check: str = Field(default="gpu_health", description="the agent check that must pass")
    check_every_s: float = Field(default=300.0, gt=0, description="how often to re-check a node that failed")
    check_deadline_s: float = Field(default=60.0, gt=0)
    max_quarantines: int = Field(
        default=3, ge=1, le=32, description="quarantined this often within repeat_window_s: no automatic release"
    )
    repeat_window_s: float = Field(default=7 * 86400.0, gt=0)
    undo_window_s: float = Field(
        default=3600.0, gt=0, description="a person's release this soon after a quarantine counts against its rule"
    )


def repeat_offender(state: NodeState, config: RecoveryConfig, now: float) -> int:
    """How often the node was quarantined within the window when that is ``max_quarantines`` or more
    (a candidate for replacement: no automatic release); else 0."""
    times = sum(1 for t in state.quarantine_history if t > now - config.repeat_window_s)
    return times if times >= config.max_quarantines else 0


def repeat_offender_note(times: int, config: RecoveryConfig) -> str:
    days = config.repeat_window_s / 86400
    return (
        f"Repeat offender: quarantined {times} times in {days:g} days; it will not be released automatically: "
        "a candidate for replacement"
    )


def after_quarantine(
    state: NodeState, action: Quarantine, detail: str, now: float, config: RecoveryConfig, drain: bool
) -> tuple[NodeState, tuple[ExternalAction, ...]]:
    """What follows a quarantine the actuator carried out: the node's state (QUARANTINED, with the
    time, when it was still UNHEALTHY) and the actions to ask for (a repeat offender's note, the
    drain where configured, the thread's "done" with the latency since the agent saw the fault)."""
    follow: list[ExternalAction] = []
    if state.health is Health.UNHEALTHY:
        state = quarantine_confirmed(state, now)
        if times := repeat_offender(state, config, now):
            follow.append(PageUpdate(action.incident_id, action.node, "REPEAT", repeat_offender_note(times, config)))
    if drain:
        follow.append(Drain(action.incident_id, action.node))
    latency = f" {now - action.observed_at:.2f} s after the agent saw the fault" if action.observed_at > 0 else ""
    follow.append(PageUpdate(action.incident_id, action.node, "QUARANTINED", f"Done{latency}: {detail}"))
    return state, tuple(follow)


def release_check_due(state: NodeState, last_check_at: float | None, config: RecoveryConfig, now: float) -> bool:
    """Whether to ask the node's agent for its release check now."""
    if not config.auto_release or state.health is not Health.QUARANTINED or state.quarantined_at <= 0:
        return False
    if repeat_offender(state, config, now):
        return False  # a person decides: repair or replace
    if now - state.quarantined_at < config.hold_down_s:
        return False
    return last_check_at is None or now - last_check_at >= config.check_every_s


def check_releases(
    state: NodeState, verdict: str, started_at: float, config: RecoveryConfig, gpus: int = 0, expected_gpus: int = 0
) -> bool:
    """A check result releases the node only if it passed, ran after the hold-down, the node is still
    out, and it has all the GPUs it ever had (a node back with 7 of 8 is not healthy, whatever its
    7 GPUs say)."""
    return (
        state.health is Health.QUARANTINED
        and gpus >= expected_gpus
        and verdict == "OK"
        and started_at >= state.quarantined_at + config.hold_down_s
    )
