"""The action vocabulary: what a decision asks for, and how each action is named and stored. Pure.

The first three actions are bookkeeping in the incident store (open an incident, fold a signal into
one, escalate one); the others are side effects that actuators carry out, at least once and
idempotently by incident id (``EXTERNAL_ACTIONS``), each named within its incident by
``action_kind`` and stored as JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TypeGuard, get_args

from controller.vocab.policy import Severity
from vigil_core.signals import GpuRef, SignalKind


@dataclass(frozen=True, slots=True)
class Incident:
    id: str
    node: str
    gpu: GpuRef
    kind: SignalKind
    code: int
    severity: Severity
    meaning: str
    remedy: str
    first_message: str
    first_seq: int
    first_observed_at: float
    opened_at: float


@dataclass(frozen=True, slots=True)
class OpenIncident:
    incident: Incident
    count: int = 1  # observations the opening signal stands for (a storm folded at the agent)


@dataclass(frozen=True, slots=True)
class FoldIntoIncident:
    incident_id: str
    at: float
    count: int = 1


@dataclass(frozen=True, slots=True)
class EscalateIncident:
    incident_id: str
    severity: Severity
    at: float
    count: int = 1


@dataclass(frozen=True, slots=True)
class ResolveIncident:
    """The fault that opened it is gone, as the driver itself says (XID 154 back to none)."""

    incident_id: str
    at: float


@dataclass(frozen=True, slots=True)
class Quarantine:
    incident_id: str
    node: str
    reason: str
    remedy: str
    observed_at: float = 0.0  # when the agent saw the fault: fault-to-action latency starts here
    dry_run: bool = False  # decided and recorded, but nothing on the node is changed


@dataclass(frozen=True, slots=True)
class Page:
    incident_id: str
    node: str
    severity: Severity
    summary: str
    remedy: str
    observed_at: float = 0.0
    gpu: str = ""  # which GPU, for a person: "GPU 3 (GPU-…, 0000:3b:00.0)"
    did: str = ""  # what Vigil did about it


@dataclass(frozen=True, slots=True)
class PageUpdate:
    """A later word on a paged incident (in Slack: a reply in its thread). One per tag and incident."""

    incident_id: str
    node: str
    tag: str  # QUARANTINED, RESOLVED, HELD, ...
    text: str
    resolve: bool = False
    observed_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Drain:
    """Evict the quarantined node's pods (opt-in; after the quarantine is done)."""

    incident_id: str
    node: str
    observed_at: float = 0.0


ExternalAction = Quarantine | Page | PageUpdate | Drain
Action = OpenIncident | FoldIntoIncident | EscalateIncident | ResolveIncident | Quarantine | Page | PageUpdate | Drain

EXTERNAL_ACTIONS: tuple[type, ...] = get_args(ExternalAction)


def is_external(action: Action) -> TypeGuard[ExternalAction]:
    """An action an actuator carries out (the rest are the incident store's bookkeeping)."""
    return isinstance(action, EXTERNAL_ACTIONS)


def action_kind(action: ExternalAction) -> str:
    """The action's name within its incident: each is carried out once per incident."""
    if isinstance(action, Quarantine):
        return "QUARANTINE"
    if isinstance(action, Page):
        return f"PAGE:{action.severity.value}"
    if isinstance(action, Drain):
        return "DRAIN"
    return f"NOTE:{action.tag}"


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
