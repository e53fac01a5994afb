"""The guardrails' effectful side: applies dry-run and the circuit breaker to each decision, keeps
the breaker's state in the incident store (a restart stays paused), and pages a person once when
the breaker trips. The rules themselves are pure, in ``controller.nodes.guards.rules``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace

import structlog

from controller.metrics import ControllerMetrics
from controller.nodes.actions.runner import ActionRunner
from controller.nodes.guards.domains import (
    DomainAdmission,
    DomainState,
    admit_in_domains,
    domain_summary,
    held_domains,
    hold_domain,
    node_domains,
)
from controller.nodes.guards.rules import (
    Admission,
    BreakerState,
    GuardrailConfig,
    admit_quarantine,
    breaker_summary,
    resumed,
    with_adopted,
)
from controller.store import Records
from controller.vocab.actions import Action, Page, Quarantine, action_kind
from controller.vocab.policy import Severity

log = structlog.get_logger(__name__)

_BREAKER_KEY = "circuit_breaker"
_DOMAINS_KEY = "domain_guard"
DRY_RUN_DID = "DRY RUN: would quarantine the node (taint, cordon, condition); nothing was changed"


class Guard:
    def __init__(
        self,
        config: GuardrailConfig,
        records: Records,
        runner: ActionRunner,
        metrics: ControllerMetrics,
        fleet_size: Callable[[], int],
        clock: Callable[[], float],
        labels: Callable[[str], Mapping[str, str]] = lambda node: {},
    ) -> None:
        self.config = config
        self._records = records
        self._runner = runner
        self._metrics = metrics
        self._fleet_size = fleet_size
        self._clock = clock
        self.breaker = _load(records.get_meta(_BREAKER_KEY))
        self.domains = _load_domains(records.get_meta(_DOMAINS_KEY))
        self._labels = labels  # a node's labels: its failure domains
        self._page_task: asyncio.Task[None] | None = None
        self._page_tasks: set[asyncio.Task[None]] = set()

    @property
    def automation(self) -> str:
        if self.breaker.tripped:
            return f"paused: circuit breaker tripped, {len(self.breaker.held)} quarantine(s) held"
        mode = "dry-run" if self.config.dry_run else "active"
        if self.domains.suspect:
            mode += f"; holding quarantines in suspect domains: {', '.join(self.domains.suspect)}"
        return mode

    @property
    def holding(self) -> bool:
        """Quarantines are held for a person: the breaker tripped, or a domain is suspect."""
        return self.breaker.tripped or bool(self.domains.suspect)

    @property
    def state(self) -> tuple[BreakerState, DomainState]:
        return self.breaker, self.domains

    def apply(self, actions: tuple[Action, ...], now: float) -> tuple[tuple[Action, ...], frozenset[str]]:
        """One decision's actions, and the kinds among them that are held back (not carried out)."""
        quarantine = next((a for a in actions if isinstance(a, Quarantine)), None)
        if quarantine is None:
            return actions, frozenset()
        if self.config.dry_run:
            return tuple(_dry(a) for a in actions), frozenset()
        held_kinds = frozenset(action_kind(a) for a in actions if isinstance(a, (Quarantine, Page)))
        cfg = self.config.domains
        named = node_domains(self._labels(quarantine.node), cfg)
        domains = list(dict.fromkeys([*named, *held_domains(self.domains, quarantine.node)]))
        self.domains, in_domain, domain = admit_in_domains(self.domains, quarantine.node, domains, cfg, now)
        if in_domain is not DomainAdmission.GO:
            if in_domain is DomainAdmission.SUSPECT:
                log.error("domain_suspected", domain=domain, node=quarantine.node)
                self._page_tasks.add(asyncio.get_running_loop().create_task(self._page_domain(domain)))
            log.warning("quarantine_held", node=quarantine.node, incident=quarantine.incident_id, domain=domain)
            return actions, held_kinds  # one page for the domain, not one per node
        self.breaker, admission = admit_quarantine(self.breaker, quarantine.node, self._fleet_size(), self.config, now)
        if admission is Admission.GO:
            return actions, frozenset()
        if admission is Admission.TRIP:
            log.error("circuit_breaker_tripped", node=quarantine.node, fleet=self._fleet_size())
            self._metrics.breaker_trips.inc()
            self._page_task = asyncio.get_running_loop().create_task(self._page())
        log.warning("quarantine_held", node=quarantine.node, incident=quarantine.incident_id)
        # Its page is held too: one page for the breaker, not one per node of a mass failure.
        return actions, held_kinds

    def hold_component(self, component: str, domain: str, nodes: list[str], evidence: str, now: float) -> bool:
        """A fabric component found at fault: its domain turns suspect, the quarantines of the nodes
        behind it are held for a person, and one page names it. Returns whether it was news (a
        domain suspect already is not paged again)."""
        news = domain not in self.domains.suspect
        self.domains = hold_domain(self.domains, domain, nodes)
        if news:
            log.error("component_suspected", component=component, domain=domain, nodes=len(nodes))
            page = Page(
                incident_id=f"domain-{domain}-{int(now)}",
                node="",
                severity=Severity.QUARANTINE,
                summary=f"{component} is slow ({len(nodes)} node(s) behind it): {evidence}",
                remedy=f"check {component} (ports, cables, optics, its counters); then `vigil resume` "
                "(add --apply-held to quarantine the nodes behind it after all)",
                did=f"held the quarantines of the {len(nodes)} node(s) in {domain}; cordoned none",
            )
            self._runner.request(page)
        return news

    @contextmanager
    def saving(self) -> Iterator[None]:
        """Save the guard's state after the block if the block changed it. When the block raises, what it
        decided was not committed either: the guard's state goes back to what it was."""
        before = self.state
        try:
            yield
        except BaseException:
            self.breaker, self.domains = before  # the batch comes again: count it then, not twice
            raise
        if self.state != before:
            self.save()

    def save(self) -> None:
        self._records.set_meta(_BREAKER_KEY, _dump(self.breaker))
        self._records.set_meta(_DOMAINS_KEY, json.dumps({"recent": self.domains.recent, "held": self.domains.held}))

    def count_adopted(self, quarantines: list[tuple[str, float]]) -> None:
        self.breaker = with_adopted(self.breaker, quarantines, self.config, self._clock())
        self.save()

    def resume(self) -> None:
        self.breaker = resumed(self.breaker)
        self.domains = replace(self.domains, held=())
        self.save()

    def cancel(self) -> None:
        if self._page_task is not None:
            self._page_task.cancel()
        for task in self._page_tasks:
            task.cancel()

    async def _page_domain(self, domain: str) -> None:
        await asyncio.sleep(self.config.breaker_page_delay_s)  # gather the rest of the burst
        page = Page(
            incident_id=f"domain-{domain}-{int(self._clock())}",
            node="",
            severity=Severity.QUARANTINE,
            summary=domain_summary(self.domains, domain, self.config.domains),
            remedy=f"check what the nodes of {domain} share (switch, PDU, cooling); then `vigil resume` "
            "(add --apply-held to quarantine the held nodes after all)",
            did=f"held the quarantines past {self.config.domains.max_nodes} in {domain}",
        )
        self._runner.request(page)

    async def _page(self) -> None:
        await asyncio.sleep(self.config.breaker_page_delay_s)  # gather the rest of the burst
        tripped_at = self.breaker.tripped_at or self._clock()
        page = Page(
            incident_id=f"breaker-{int(tripped_at * 1000)}",
            node="",
            severity=Severity.QUARANTINE,
            summary=breaker_summary(self.breaker, self._fleet_size(), self.config),
            remedy="check what the held nodes have in common (driver, switch, rack); "
            "then `vigil resume` (add --apply-held to quarantine them after all)",
            did="paused automation: no node was quarantined past the limit",
        )
        self._runner.request(page)


def _dry(action: Action) -> Action:
    if isinstance(action, Quarantine):
        return replace(action, dry_run=True)
    if isinstance(action, Page):
        return replace(action, did=DRY_RUN_DID)
    return action


def _dump(state: BreakerState) -> str:
    return json.dumps({"tripped_at": state.tripped_at, "recent": state.recent, "held": state.held})


def _load_domains(text: str | None) -> DomainState:
    if not text:
        return DomainState()
    d = json.loads(text)
    return DomainState(tuple((a, b, t) for a, b, t in d["recent"]), tuple((a, b) for a, b in d["held"]))


def _load(text: str | None) -> BreakerState:
    if not text:
        return BreakerState()
    d = json.loads(text)
    return BreakerState(d["tripped_at"], tuple((n, t) for n, t in d["recent"]), tuple(d["held"]))
