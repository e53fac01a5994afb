"""How the incident store writes its records: node states and actions as JSON, and each action's
name within its incident. Pure."""

from __future__ import annotations

import json

from controller.decide import (
    Drain,
    ExternalAction,
    Health,
    IncidentRef,
    NodeState,
    Page,
    PageUpdate,
    Quarantine,
)
from controller.policy import Severity


def action_kind(action: ExternalAction) -> str:
    """The action's name within its incident: each is carried out once per incident."""
    if isinstance(action, Quarantine):
        return "QUARANTINE"
    if isinstance(action, Page):
        return f"PAGE:{action.severity.value}"
    if isinstance(action, Drain):
        return "DRAIN"
    return f"NOTE:{action.tag}"


def state_to_json(state: NodeState) -> str:
    return json.dumps(
        {
            "health": state.health.value,
            "before_unknown": state.health_before_unknown.value,
            "hung": sorted(state.hung_collectors),
            "quarantined_at": state.quarantined_at,
            "recent": state.recent,
            "incidents": [[r.id, r.key, r.severity.value, r.last_at] for r in state.incidents],
        }
    )


def state_from_json(text: str, node: str | None = None) -> NodeState:
    data = json.loads(text)
    return NodeState(
        node=node or "",
        health=Health(data["health"]),
        health_before_unknown=Health(data["before_unknown"]),
        hung_collectors=frozenset(data.get("hung", ())),
        quarantined_at=float(data.get("quarantined_at", 0.0)),
        recent={k: tuple(v) for k, v in data["recent"].items()},
        incidents=tuple(IncidentRef(i, k, Severity(s), t) for i, k, s, t in data["incidents"]),
    )


def action_to_json(action: ExternalAction) -> str:
    fields = {f: getattr(action, f) for f in action.__dataclass_fields__}
    return json.dumps({"kind": action_kind(action), **fields})


def action_from_json(text: str) -> ExternalAction:
    d = json.loads(text)
    kind = d.pop("kind")
    if kind == "QUARANTINE":
        return Quarantine(**d)
    if kind.startswith("NOTE:"):
        return PageUpdate(**d)
    if kind == "DRAIN":
        return Drain(**d)
    return Page(**{**d, "severity": Severity(d["severity"])})
