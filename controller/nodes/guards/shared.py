"""Shared causes: one fault on much of the fleet at once is one fleet incident, not N pages. Pure.

A driver roll-out that makes every node write the same new XID, a facility power event that
throttles every GPU, a firmware push or a replayed kernel log: the same fault (its rule: ``xid-79``,
``throttle``) on many nodes within a short window says the cause is shared, not the nodes'. When the
nodes with one rule's fault within ``window_s`` reach ``min_nodes``, or ``share`` of the fleet if
that is more, they become one **fleet incident**: its quarantines and pages are held (recorded, not
carried out), one page names the count and what the nodes have in common, and every later node with
that fault joins it, until a person decides (``vigil resume``, with ``--apply-held`` to act on the
nodes after all).

A burst is decided as a whole: each quarantine and page waits ``settle_s`` before it is carried out
(the guard's ``settle``), and a fleet incident that opens meanwhile holds the ones still waiting, so
which nodes are cordoned does not depend on which line arrived first. Nothing waits where no fleet
incident could open (``settles``: the guard off, or its threshold past the fleet's size).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from pydantic import Field

from controller.nodes.guards.window import GroupWindow
from vigil_core.config_file import ConfigModel


class SharedCauseConfig(ConfigModel):
    enabled: bool = Field(default=True, description="group one fault on much of the fleet into one fleet incident")
    min_nodes: int = Field(default=3, ge=2, description="nodes with the same fault within the window...")
    share: float = Field(default=0.1, gt=0, le=1, description="...or this share of the fleet, if more")
    window_s: float = Field(default=60.0, gt=0)
    settle_s: float = Field(
        default=0.03, ge=0, le=5, description="each quarantine and page waits this long, so a burst is decided whole"
    )


class SharedAdmission(StrEnum):
    GO = "GO"
    OPEN = "OPEN"  # this fault made the fleet incident: hold it, page once
    JOIN = "JOIN"  # its fleet incident is open already: hold it


@dataclass(frozen=True, slots=True)
class FleetIncident:
    rule: str  # the fault every node has: "xid-79", "throttle"
    opened_at: float
    first_at: float  # the first node's fault within the window before it opened
    nodes: tuple[str, ...]  # every node with the fault, in the order it came

    @property
    def id(self) -> str:
        return f"fleet-{self.rule}-{int(self.opened_at * 1000)}"


@dataclass(frozen=True, slots=True)
class SharedState:
    recent: GroupWindow = field(default_factory=GroupWindow)  # (rule, node) acted on in the window: when, first
    open: tuple[FleetIncident, ...] = ()

    def incident(self, rule: str) -> FleetIncident | None:
        return next((i for i in self.open if i.rule == rule), None)

    def holds(self, rule: str, node: str) -> FleetIncident | None:
        """The open fleet incident that holds this node's fault of this rule, if any."""
        found = self.incident(rule)
        return found if found is not None and node in found.nodes else None


def shared_threshold(fleet_size: int, config: SharedCauseConfig) -> int:
    """How many nodes with one fault within the window make it a shared cause."""
    return max(config.min_nodes, math.ceil(config.share * fleet_size))


def settles(fleet_size: int, config: SharedCauseConfig) -> bool:
    """Whether a fault's quarantine and page wait out ``settle_s`` first: only where a fleet incident
    could open, the guard on and its threshold within the fleet as it is. With the guard off, or more
    nodes needed than there are, the wait would hold every quarantine for nothing."""
    return config.enabled and config.settle_s > 0 and shared_threshold(fleet_size, config) <= fleet_size


def admit_shared(
    state: SharedState, rule: str, node: str, fleet_size: int, config: SharedCauseConfig, now: float
) -> tuple[SharedState, SharedAdmission]:
    """Whether one node's fault of ``rule`` may be acted on alone, or belongs to a fleet incident."""
    recent = state.recent.after(now - config.window_s)
    if (incident := state.incident(rule)) is not None:
        if node not in incident.nodes:
            incident = replace(incident, nodes=(*incident.nodes, node))
        return replace(state, recent=recent, open=_put(state.open, incident)), SharedAdmission.JOIN
    known = (rule, node) in recent
    if not config.enabled or recent.count(rule) + (not known) < shared_threshold(fleet_size, config):
        return replace(state, recent=recent.seen(rule, node, now, first=True)), SharedAdmission.GO
    seen = recent.members(rule)  # the nodes with this fault in the window, in order
    nodes = [*(n for n, _ in seen), *(() if known else (node,))]
    first = min((t for _, t in seen), default=now)
    incident = FleetIncident(rule=rule, opened_at=now, first_at=first, nodes=tuple(nodes))
    return replace(state, recent=recent, open=(*state.open, incident)), SharedAdmission.OPEN


def _put(incidents: tuple[FleetIncident, ...], incident: FleetIncident) -> tuple[FleetIncident, ...]:
    return tuple(incident if i.rule == incident.rule else i for i in incidents)


def closed(state: SharedState) -> SharedState:
    """A person decided (``vigil resume``): the fleet incidents close; the window starts afresh."""
    return SharedState()


def common_factors(nodes: Sequence[str], labels: Mapping[str, Mapping[str, str]], fleet: Sequence[str]) -> list[str]:
    """What the incident's nodes have in common, from their labels (a driver version, a rack, a
    switch): each ``key=value`` all of them share, those the rest of the fleet does not share first."""
    if not nodes:
        return []
    first = labels.get(nodes[0], {})
    shared = {k: v for k, v in first.items() if all(labels.get(n, {}).get(k) == v for n in nodes[1:])}
    rest = [n for n in fleet if n not in set(nodes)]
    only = [k for k, v in shared.items() if rest and any(labels.get(n, {}).get(k) != v for n in rest)]
    everywhere = [k for k in shared if k not in only]
    first_said = [f"{k}={shared[k]} (only these nodes)" for k in sorted(only)]
    return first_said + [f"{k}={shared[k]}" for k in sorted(everywhere)]


def fleet_summary(incident: FleetIncident, fleet_size: int, factors: Sequence[str], acted: Sequence[str]) -> str:
    """The page's one paragraph: what, how many, over how long, what the nodes share."""
    span = incident.opened_at - incident.first_at
    held = [n for n in incident.nodes if n not in set(acted)]
    text = (
        f"shared cause suspected: {incident.rule} on {len(incident.nodes)} of {fleet_size} nodes within {span:.1f} s "
        f"(held: {_names(held)}"
    )
    text += f"; acted on before it was seen as shared: {_names(acted)})" if acted else ")"
    text += f". In common: {'; '.join(factors[:8])}" if factors else ". No label they share names a common factor"
    return text


def _names(nodes: Sequence[str]) -> str:
    return (", ".join(nodes[:30]) + (f" and {len(nodes) - 30} more" if len(nodes) > 30 else "")) or "none"
