"""The blast-radius guard per failure domain. Pure.

Nodes that share a rack, a leaf switch or a power feed fail together when the shared part fails,
and then cordoning them one by one treats the symptom N times. Each node's domains come from its
labels (``labels``: the label keys that name a domain, e.g. ``vigil.dev/rack``). When more than
``max_nodes`` nodes of one domain would be quarantined within ``window_s``, the one past the limit
and every later one in that domain are held (recorded, not carried out), one page names the domain
as a suspected shared component, and a person decides (``vigil resume``, as for the breaker).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from pydantic import Field

from controller.nodes.guards.window import GroupWindow
from vigil_core.config_file import ConfigModel

DEFAULT_DOMAIN_LABELS = ("vigil.dev/rack", "vigil.dev/leaf-switch", "topology.kubernetes.io/rack")


class DomainGuardConfig(ConfigModel):
    labels: tuple[str, ...] = Field(default=DEFAULT_DOMAIN_LABELS, description="node label keys naming a domain")
    max_nodes: int = Field(default=2, ge=1, description="quarantines in one domain within the window")
    window_s: float = Field(default=600.0, gt=0)


class DomainAdmission(StrEnum):
    GO = "GO"
    SUSPECT = "SUSPECT"  # this quarantine made the domain suspect: hold it, page once
    HOLD = "HOLD"  # the domain is suspect already: hold it


@dataclass(frozen=True, slots=True)
class DomainState:
    recent: GroupWindow = field(default_factory=GroupWindow)  # (domain, node) quarantined in the window: when, latest
    held: tuple[tuple[str, str], ...] = ()  # (domain, node) held since the domain became suspect

    @property
    def suspect(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(d for d, _ in self.held))


def node_domains(labels: Mapping[str, str], config: DomainGuardConfig) -> list[str]:
    """The domains a node is in, as ``label=value``."""
    return [f"{key}={labels[key]}" for key in config.labels if labels.get(key)]


def admit_in_domains(
    state: DomainState, node: str, domains: Sequence[str], config: DomainGuardConfig, now: float
) -> tuple[DomainState, DomainAdmission, str]:
    """Whether a quarantine of ``node`` may go ahead; the domain that stops it ('' when none)."""
    recent = state.recent.after(now - config.window_s)
    suspect = state.suspect
    for domain in domains:
        if domain in suspect:
            held = state.held if (domain, node) in state.held else (*state.held, (domain, node))
            return replace(state, recent=recent, held=held), DomainAdmission.HOLD, domain
        if (domain, node) not in recent and recent.count(domain) >= config.max_nodes:
            return replace(state, recent=recent, held=(*state.held, (domain, node))), DomainAdmission.SUSPECT, domain
    for domain in domains:
        recent = recent.seen(domain, node, now)
    return replace(state, recent=recent), DomainAdmission.GO, ""


def hold_domain(state: DomainState, domain: str, nodes: Sequence[str]) -> DomainState:
    """A shared component found at fault (a sweep blamed a leaf switch, say): its domain is suspect
    at once, and the quarantines of the nodes behind it are held for a person."""
    held = [*state.held, *((domain, n) for n in nodes if (domain, n) not in state.held)]
    return replace(state, held=tuple(held))


def held_domains(state: DomainState, node: str) -> list[str]:
    """The domains a node is held in by name (a component found at fault), whatever its labels."""
    return [d for d, n in state.held if n == node]


def domain_summary(state: DomainState, domain: str, config: DomainGuardConfig) -> str:
    quarantined = sorted(n for n, _ in state.recent.members(domain))
    held = [n for d, n in state.held if d == domain]
    minutes = config.window_s / 60
    return (
        f"shared component suspected in {domain}: {len(quarantined) + len(held)} of its nodes went bad within "
        f"{minutes:g} min (quarantined: {', '.join(quarantined) or 'none'}; held: {', '.join(held)})"
    )
