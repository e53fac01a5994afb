"""A node's health as the controller keeps it: its state, what the decision function remembers of
its recent signals and incidents, and how that is stored (JSON). Pure."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum

from controller.vocab.policy import Severity


class Health(StrEnum):
    HEALTHY = "HEALTHY"
    SUSPECT = "SUSPECT"
    UNHEALTHY = "UNHEALTHY"
    QUARANTINED = "QUARANTINED"
    UNKNOWN = "UNKNOWN"


@dataclass(frozen=True, slots=True)
class IncidentRef:
    """What the decision function remembers of an incident, for folding."""

    id: str
    key: str
    severity: Severity
    last_at: float


@dataclass(frozen=True, slots=True)
class NodeState:
    node: str
    health: Health = Health.HEALTHY
    health_before_unknown: Health = Health.HEALTHY
    hung_collectors: frozenset[str] = frozenset()  # the agent's collectors that are stuck now
    quarantined_at: float = 0.0  # when the actuator took it out of service (the hold-down counts from here)
    recent: dict[str, tuple[float, ...]] = field(default_factory=dict)  # key -> observation times
    incidents: tuple[IncidentRef, ...] = ()
    quarantine_history: tuple[float, ...] = ()  # when it was taken out of service, latest last (kept across releases)

    @property
    def last_fault_at(self) -> float:
        """When its latest page-worthy fault was observed (0: none it remembers)."""
        return max((r.last_at for r in self.incidents if r.severity is not Severity.RECORD), default=0.0)


def state_to_json(state: NodeState) -> str:
    return json.dumps(
        {
            "health": state.health.value,
            "before_unknown": state.health_before_unknown.value,
            "hung": sorted(state.hung_collectors),
            "quarantined_at": state.quarantined_at,
            "recent": state.recent,
            "incidents": [[r.id, r.key, r.severity.value, r.last_at] for r in state.incidents],
            "quarantines": list(state.quarantine_history),
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
        quarantine_history=tuple(float(t) for t in data.get("quarantines", ())),
    )
