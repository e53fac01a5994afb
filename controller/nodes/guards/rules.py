"""Guardrails between a decision and its action: dry-run, the circuit breaker and the rate limit. Pure.

The circuit breaker guards against the worst thing automation can do on a GPU cluster: cordon a
large part of it for a cause that is not the nodes' (a bad driver roll-out, a switch, a broken
exporter). At most ``max_nodes`` nodes, or ``max_fraction`` of the fleet if that is fewer, are
quarantined within ``window_s``. The quarantine that would pass the limit trips the breaker: from
then on every quarantine is held (recorded, not carried out) and a person is paged with the list,
until someone resumes automation. Tripped state survives a restart (the engine persists it).

The rate limit is a token bucket over quarantines (each is a few API writes), so a burst is spread
out instead of landing on the API server at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum

from pydantic import Field

from controller.nodes.guards.domains import DomainGuardConfig
from controller.nodes.guards.shared import SharedCauseConfig
from controller.nodes.guards.window import Window
from vigil_core.config_file import ConfigModel


class GuardrailConfig(ConfigModel):
    dry_run: bool = Field(default=False, description="decide and page ('would quarantine'), change nothing")
    breaker_max_nodes: int = Field(default=20, ge=1, description="quarantines allowed within the window")
    breaker_max_fraction: float = Field(default=0.05, gt=0, le=1, description="...or this share of the fleet, if fewer")
    breaker_window_s: float = Field(default=600.0, gt=0)
    breaker_page_delay_s: float = Field(
        default=2.0, ge=0, description="after tripping, wait this long to gather the held nodes into one page"
    )
    quarantines_per_s: float = Field(default=100.0, gt=0, description="rate limit on quarantines (token bucket)")
    quarantine_burst: int = Field(default=200, ge=1)
    domains: DomainGuardConfig = Field(default_factory=DomainGuardConfig)
    shared: SharedCauseConfig = Field(default_factory=SharedCauseConfig)


class Admission(StrEnum):
    GO = "GO"
    TRIP = "TRIP"  # this quarantine tripped the breaker: hold it and page a person
    HOLD = "HOLD"  # the breaker is open: hold it


@dataclass(frozen=True, slots=True)
class BreakerState:
    tripped_at: float | None = None
    recent: Window[str] = field(default_factory=Window)  # each node quarantined inside the window: when, latest
    held: tuple[str, ...] = ()  # nodes held since it tripped, in order

    @property
    def tripped(self) -> bool:
        return self.tripped_at is not None


def breaker_limit(fleet_size: int, config: GuardrailConfig) -> int:
    """How many quarantines the window allows for a fleet of this size (never less than one)."""
    return max(1, min(config.breaker_max_nodes, math.floor(config.breaker_max_fraction * fleet_size)))


def admit_quarantine(
    state: BreakerState, node: str, fleet_size: int, config: GuardrailConfig, now: float
) -> tuple[BreakerState, Admission]:
    recent = state.recent.after(now - config.breaker_window_s)
    if state.tripped:
        held = state.held if node in state.held else (*state.held, node)
        return replace(state, recent=recent, held=held), Admission.HOLD
    if node not in recent and len(recent) >= breaker_limit(fleet_size, config):
        return BreakerState(tripped_at=now, recent=recent, held=(node,)), Admission.TRIP
    return replace(state, recent=recent.seen(node, now)), Admission.GO


def with_adopted(
    state: BreakerState, quarantines: list[tuple[str, float]], config: GuardrailConfig, now: float
) -> BreakerState:
    """A new leader counts the quarantines it found on the cluster (made by the previous leader within
    the window) against the same limit, so a failover does not grant a fresh allowance."""
    found = [(n, t) for n, t in quarantines if t > now - config.breaker_window_s and n not in state.recent]
    return replace(state, recent=Window.of([*state.recent.entries(), *found]))


def resumed(state: BreakerState) -> BreakerState:
    """A person resumed automation: the window starts afresh (they have seen what tripped it)."""
    return BreakerState()


def breaker_summary(state: BreakerState, fleet_size: int, config: GuardrailConfig) -> str:
    limit = breaker_limit(fleet_size, config)
    return (
        f"circuit breaker tripped: more than {limit} node(s) of {fleet_size} to quarantine within "
        f"{config.breaker_window_s:.0f} s. Automation is paused; {len(state.held)} quarantine(s) held: "
        f"{', '.join(state.held[:50])}{' …' if len(state.held) > 50 else ''}"
    )


@dataclass(slots=True)
class TokenBucket:
    """``rate`` tokens a second up to ``burst``. ``reserve`` takes one and says how long to wait for it.

    Reservations may run into debt, so concurrent callers queue fairly instead of all retrying.
    """

    rate: float
    burst: int
    tokens: float = field(init=False)
    updated: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.tokens = float(self.burst)

    def reserve(self, now: float) -> float:
        self._refill(now)
        self.tokens -= 1.0
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate

    def take(self, now: float) -> bool:
        """Take a token if one is there (never into debt); False: over the rate."""
        self._refill(now)
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True

    def _refill(self, now: float) -> None:
        if self.updated is not None:
            self.tokens = min(float(self.burst), self.tokens + max(0.0, now - self.updated) * self.rate)
        self.updated = now


@dataclass(slots=True)
class RateLimiter:
    """A token bucket per key (a node, a job): ``allow`` takes one of the key's tokens, or says no.
    ``max_keys``: past this many keys, all are forgotten (keys the clients choose never grow
    without end); None: keep them all."""

    rate: float
    burst: int
    max_keys: int | None = None
    buckets: dict[str, TokenBucket] = field(default_factory=dict)

    def allow(self, key: str, now: float) -> bool:
        if self.max_keys is not None and len(self.buckets) > self.max_keys:
            self.buckets.clear()
        if (bucket := self.buckets.get(key)) is None:  # a bucket made only for a new key, not on every call
            bucket = self.buckets[key] = TokenBucket(self.rate, self.burst)
        return bucket.take(now)
