"""The guardrails' effectful side: applies dry-run and the circuit breaker to each decision, keeps
the breaker's state in the incident store (a restart stays paused), and pages a person once when
the breaker trips. The rules themselves are pure, in ``controller.nodes.guards.rules``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Any

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
from controller.nodes.guards.owed import OwedPage, dump_owed, load_owed, owe, paid
from controller.nodes.guards.rules import (
    Admission,
    BreakerState,
    GuardrailConfig,
    admit_quarantine,
    breaker_summary,
    resumed,
    with_adopted,
)
from controller.nodes.guards.shared import (
    FleetIncident,
    SharedAdmission,
    SharedState,
    admit_shared,
    closed,
    common_factors,
    fleet_summary,
    settles,
)
from controller.nodes.guards.window import GroupWindow, Window
from controller.store import Later, Records, Tx
from controller.vocab.actions import Action, Page, Quarantine, action_kind
from controller.vocab.policy import Severity

log = structlog.get_logger(__name__)

GuardState = tuple[BreakerState, DomainState, SharedState, tuple[OwedPage, ...]]

_BREAKER_KEY = "circuit_breaker"
_DOMAINS_KEY = "domain_guard"
_SHARED_KEY = "shared_cause"
_OWED_KEY = "guard_pages_owed"
_SETTLED_AFTER_S = 60.0  # a settling entry this old is forgotten (its actions have long run)


def dry_run_did(quarantine_means: str) -> str:
    """What a dry run's page says it did (``quarantine_means``: the actuator's words, "a drain in Slurm")."""
    return f"DRY RUN: would quarantine the node ({quarantine_means}); nothing was changed"


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
        fleet_nodes: Callable[[], Sequence[str]] = lambda: (),
        flush_soon: Callable[[], None] | None = None,
        quarantine_means: str = "a taint, a cordon and a node condition",
        paged: Callable[[str], bool] = lambda incident_id: False,
    ) -> None:
        self.config = config
        self._quarantine_means = quarantine_means  # the actuator's words, for a dry run's page
        self._records = records
        self._runner = runner
        self._metrics = metrics
        self._fleet_size = fleet_size
        self._clock = clock
        self.breaker = _load(records.get_meta(_BREAKER_KEY))
        self.domains = _load_domains(records.get_meta(_DOMAINS_KEY))
        self.shared = _load_shared(records.get_meta(_SHARED_KEY))
        self.owed = load_owed(records.get_meta(_OWED_KEY))  # pages gathering their burst (``resume_owed``)
        self._paged = paged  # whether a page with this incident id was recorded
        self._labels = labels  # a node's labels: its failure domains
        self._fleet_nodes = fleet_nodes
        self._settling: dict[str, tuple[str, str, float]] = {}  # incident -> (rule, node, monotonic when decided)
        self._went: dict[str, set[str]] = {}  # rule -> nodes whose actions were carried out after settling
        self._page_tasks: set[asyncio.Task[None]] = set()
        # What changed is written in the transaction of the decision that changed it (``write_with``):
        # a controller killed between the two would leave a held action beside an active breaker.
        # A change with no decision to go with (a component held) is written on its own, at once.
        self._flush_soon = flush_soon  # None: such a write is durable at once (no group commit)
        self._before: GuardState | None = None  # inside ``saving``

    @property
    def automation(self) -> str:
        if self.breaker.tripped:
            return f"paused: circuit breaker tripped, {len(self.breaker.held)} quarantine(s) held"
        mode = "dry-run" if self.config.dry_run else "active"
        for incident in self.shared.open:
            mode += f"; holding {incident.rule} on {len(incident.nodes)} node(s) as one fleet incident ({incident.id})"
        if self.domains.suspect:
            mode += f"; holding quarantines in suspect domains: {', '.join(self.domains.suspect)}"
        return mode

    @property
    def holding(self) -> bool:
        """Quarantines are held for a person: the breaker tripped, a domain is suspect, a fleet incident is open."""
        return self.breaker.tripped or bool(self.domains.suspect) or bool(self.shared.open)

    @property
    def state(self) -> GuardState:
        return self.breaker, self.domains, self.shared, self.owed

    def apply(
        self, actions: tuple[Action, ...], now: float, rule: str = ""
    ) -> tuple[tuple[Action, ...], frozenset[str]]:
        """One decision's actions, and the kinds among them that are held back (not carried out).
        ``rule``: the fault's rule (``xid-79``) where one fault on many nodes may be a shared cause."""
        acting = [a for a in actions if isinstance(a, (Quarantine, Page))]
        held_kinds = frozenset(action_kind(a) for a in acting)
        if rule and acting and self._shared(acting, rule, now):
            return actions, held_kinds
        quarantine = next((a for a in actions if isinstance(a, Quarantine)), None)
        if quarantine is None:
            return actions, frozenset()
        if self.config.dry_run:
            return tuple(_dry(a, self._quarantine_means) for a in actions), frozenset()
        cfg = self.config.domains
        named = node_domains(self._labels(quarantine.node), cfg)
        domains = list(dict.fromkeys([*named, *held_domains(self.domains, quarantine.node)]))
        self.domains, in_domain, domain = admit_in_domains(self.domains, quarantine.node, domains, cfg, now)
        if in_domain is not DomainAdmission.GO:
            if in_domain is DomainAdmission.SUSPECT:
                log.error("domain_suspected", domain=domain, node=quarantine.node)
                self._owe(f"domain:{domain}", f"domain-{domain}-{int(now)}", Severity.QUARANTINE, now)
            log.warning("quarantine_held", node=quarantine.node, incident=quarantine.incident_id, domain=domain)
            return actions, held_kinds  # one page for the domain, not one per node
        self.breaker, admission = admit_quarantine(self.breaker, quarantine.node, self._fleet_size(), self.config, now)
        if admission is Admission.GO:
            return actions, frozenset()
        if admission is Admission.TRIP:
            log.error("circuit_breaker_tripped", node=quarantine.node, fleet=self._fleet_size())
            self._metrics.breaker_trips.inc()
            self._owe("breaker", f"breaker-{int(now * 1000)}", Severity.QUARANTINE, now)
        log.warning("quarantine_held", node=quarantine.node, incident=quarantine.incident_id)
        # Its page is held too: one page for the breaker, not one per node of a mass failure.
        return actions, held_kinds

    def _shared(self, acting: list[Quarantine | Page], rule: str, now: float) -> bool:
        """Whether this fault belongs to a fleet incident (held); if not, its actions settle first
        where one could open (``settles``)."""
        node, incident_id = acting[0].node, acting[0].incident_id
        fleet_size = self._fleet_size()
        self.shared, admission = admit_shared(self.shared, rule, node, fleet_size, self.config.shared, now)
        if admission is SharedAdmission.GO and not settles(fleet_size, self.config.shared):
            self._went.setdefault(rule, set()).add(node)  # carried out at once: no fleet incident could open
            return False
        if admission is SharedAdmission.GO:  # carried out once settled, unless a fleet incident opens meanwhile
            tick = time.monotonic()
            if len(self._settling) > 1000:
                self._forget_settled(tick)
            self._settling.pop(incident_id, None)  # oldest first: one decided again goes last
            self._settling[incident_id] = (rule, node, tick)
            return False
        if admission is SharedAdmission.OPEN:
            opened = self.shared.incident(rule)
            assert opened is not None
            log.error("fleet_incident_opened", rule=rule, incident=opened.id, nodes=len(opened.nodes))
            self._metrics.fleet_incidents.inc()
            severity = Severity.QUARANTINE if any(isinstance(a, Quarantine) for a in acting) else acting[0].severity  # type: ignore[union-attr]
            self._owe(f"fleet:{rule}", opened.id, severity, now)
        log.warning("quarantine_held", node=node, incident=incident_id, fleet_incident=rule)
        return True

    def _forget_settled(self, tick: float) -> None:
        """The settling entries decided long ago go, oldest first: only those are read (a burst
        past a thousand no longer passes over every entry on each decision)."""
        while self._settling:
            oldest = next(iter(self._settling))
            if self._settling[oldest][2] > tick - _SETTLED_AFTER_S:
                return
            del self._settling[oldest]

    async def settle(self, action: Quarantine | Page) -> str | None:
        """Called by the runner before it carries out a quarantine or page: wait out the settling
        window, then say why to hold it ('' or None: carry it out). A fleet incident that opened
        meanwhile holds the faults of its burst that were still settling."""
        settling = self._settling.get(action.incident_id)
        if settling is None:
            return None
        rule, node, at = settling
        await asyncio.sleep(max(0.0, at + self.config.shared.settle_s - time.monotonic()))
        incident = self.shared.holds(rule, node)
        if incident is None:
            self._went.setdefault(rule, set()).add(node)
            return None
        return _held_in(incident)

    def holds_resumed(self, action: Quarantine | Page, rule: str) -> str | None:
        """Why to hold an action an earlier controller decided and left PENDING (it may have been
        settling when that one stopped): its fault's fleet incident holds it. None: carry it out."""
        incident = self.shared.holds(rule, action.node)
        return None if incident is None else _held_in(incident)

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
                did=f"held the quarantines of the {len(nodes)} node(s) in {domain}; took none out of service",
            )
            self._runner.request(page)
        return news

    @contextmanager
    def saving(self) -> Iterator[None]:
        """Save the guard's state after the block if the block changed it and did not store it with
        its decision (``write_with``). When the block raises, what it decided was not committed
        either: the guard's state goes back to what it was."""
        before = self._before = self.state
        try:
            yield
            unsaved = self._changed(self._before)
        except BaseException:
            self.breaker, self.domains, self.shared, self.owed = before  # the batch comes again: count it then
            raise
        finally:
            self._before = None
        if unsaved:
            self._records.set_metas(unsaved, durable=self._flush_soon is None)
            if self._flush_soon is not None:
                self._flush_soon()

    def write_with(self, db: Tx) -> None:
        """Within ``saving``, in the decision's (write-behind) transaction: what the decision changed,
        stored with it. Each part is encoded by the store's writer, and only the last of a group's
        writes of it: a burst of a thousand decisions, each adding to windows of up to a thousand
        entries, no longer encodes a million entries on the event loop."""
        if self._before is not None and (changed := self._changed_parts(self._before)):
            Records.put_metas(db, {key: Later(partial(dump, now)) for key, dump, now in changed})
            self._before = self.state  # stored: what changes after this is written after the block

    def _changed_parts(self, before: GuardState) -> list[tuple[str, Callable[[Any], str], Any]]:
        """Each part of the state that is not what it was: its key, its encoder, its (immutable) value."""
        parts = zip(_KEYS, _DUMPS, self.state, before, strict=True)
        return [(key, dump, now) for key, dump, now, then in parts if now is not then]

    def _changed(self, before: GuardState) -> dict[str, str]:
        """The stored form of each part of the state that is not what it was."""
        return {key: dump(now) for key, dump, now in self._changed_parts(before)}

    def save(self) -> None:
        self._records.set_metas({key: dump(now) for key, dump, now in zip(_KEYS, _DUMPS, self.state, strict=True)})

    def count_adopted(self, quarantines: list[tuple[str, float]]) -> None:
        self.breaker = with_adopted(self.breaker, quarantines, self.config, self._clock())
        self.save()

    def resume(self) -> None:
        self.breaker = resumed(self.breaker)
        self.domains = replace(self.domains, held=())
        self.shared = closed(self.shared)
        self.owed = ()  # what they would have said, the person has seen
        self._went.clear()
        self.save()

    def cancel(self) -> None:
        for task in self._page_tasks:
            task.cancel()

    # The pages owed for what is held --------------------------------------------------------------

    def resume_owed(self) -> None:
        """At start: send the pages an earlier controller owed and did not send (it stopped while
        gathering their burst); forget those it did send."""
        sent = [o.id for o in self.owed if self._paged(o.id)]
        if sent:
            with self.saving():
                for page_id in sent:
                    self.owed = paid(self.owed, page_id)
        for o in self.owed:
            log.warning("owed_page_resumed", page=o.id, about=o.about)
            self._send_when_due(o)

    def _owe(self, about: str, page_id: str, severity: Severity, now: float) -> None:
        """Owe one page about what is now held, sent once the rest of the burst is gathered. Stored
        with the decision that made it owed (the caller is inside ``saving``)."""
        owed = OwedPage(page_id, about, severity, now + self.config.breaker_page_delay_s)
        self.owed = owe(self.owed, owed)
        self._send_when_due(owed)

    def _send_when_due(self, owed: OwedPage) -> None:
        task = asyncio.get_running_loop().create_task(self._send(owed))
        self._runner.tasks.watch("guard-page", task)  # a page that died (the store failing) is said and counted
        self._page_tasks.add(task)
        task.add_done_callback(self._page_tasks.discard)

    async def _send(self, owed: OwedPage) -> None:
        await asyncio.sleep(max(0.0, owed.due_at - self._clock()))  # gather the rest of the burst
        page = self._page_for(owed)
        if page is not None:  # None: no longer held (a person resumed meanwhile)
            self._runner.request(page)  # recorded before it is forgotten here: never lost, at worst looked up
        with self.saving():
            self.owed = paid(self.owed, owed.id)

    def _page_for(self, owed: OwedPage) -> Page | None:
        match owed.kind:
            case "breaker":
                return self._breaker_page(owed) if self.breaker.tripped else None
            case "fleet":
                incident = self.shared.incident(owed.subject)
                return self._fleet_page(owed, incident) if incident is not None else None
            case "domain":
                return self._domain_page(owed, owed.subject) if owed.subject in self.domains.suspect else None
        return None

    def _domain_page(self, owed: OwedPage, domain: str) -> Page:
        return Page(
            incident_id=owed.id,
            node="",
            severity=owed.severity,
            summary=domain_summary(self.domains, domain, self.config.domains),
            remedy=f"check what the nodes of {domain} share (switch, PDU, cooling); then `vigil resume` "
            "(add --apply-held to quarantine the held nodes after all)",
            did=f"held the quarantines past {self.config.domains.max_nodes} in {domain}",
        )

    def _fleet_page(self, owed: OwedPage, incident: FleetIncident) -> Page:
        labels = {n: self._labels(n) for n in (*incident.nodes, *self._fleet_nodes())}
        factors = common_factors(incident.nodes, labels, list(self._fleet_nodes()))
        went = self._went.get(incident.rule, set())
        acted = [n for n in incident.nodes if n in went]
        return Page(
            incident_id=owed.id,
            node="",
            severity=owed.severity,
            summary=fleet_summary(incident, self._fleet_size(), factors, acted),
            remedy="find what changed on these nodes at once (a driver or firmware roll-out, power, cooling, "
            "a replayed log); then `vigil resume` (add --apply-held to act on each node after all)",
            did=f"held the actions on {len(incident.nodes) - len(acted)} node(s); one fleet incident, not a page each",
        )

    def _breaker_page(self, owed: OwedPage) -> Page:
        return Page(
            incident_id=owed.id,
            node="",
            severity=owed.severity,
            summary=breaker_summary(self.breaker, self._fleet_size(), self.config),
            remedy="check what the held nodes have in common (driver, switch, rack); "
            "then `vigil resume` (add --apply-held to quarantine them after all)",
            did="paused automation: no node was quarantined past the limit",
        )


def _held_in(incident: FleetIncident) -> str:
    return f"held: one of {len(incident.nodes)} nodes with {incident.rule} at once, a fleet incident ({incident.id})"


def _dry(action: Action, quarantine_means: str) -> Action:
    if isinstance(action, Quarantine):
        return replace(action, dry_run=True)
    if isinstance(action, Page):
        return replace(action, did=dry_run_did(quarantine_means))
    return action


def _dump(state: BreakerState) -> str:
    return json.dumps({"tripped_at": state.tripped_at, "recent": state.recent.entries(), "held": state.held})


def _dump_domains(state: DomainState) -> str:
    return json.dumps({"recent": state.recent.entries(), "held": state.held})


def _dump_shared(state: SharedState) -> str:
    incidents = [[i.rule, i.opened_at, i.first_at, list(i.nodes)] for i in state.open]
    return json.dumps({"recent": state.recent.entries(), "open": incidents})


def _load_shared(text: str | None) -> SharedState:
    if not text:
        return SharedState()
    d = json.loads(text)
    recent = GroupWindow.of(((r, n, t) for r, n, t in d["recent"]), first=True)
    return SharedState(recent, tuple(FleetIncident(r, o, f, tuple(ns)) for r, o, f, ns in d["open"]))


def _load_domains(text: str | None) -> DomainState:
    if not text:
        return DomainState()
    d = json.loads(text)
    return DomainState(GroupWindow.of((a, b, t) for a, b, t in d["recent"]), tuple((a, b) for a, b in d["held"]))


def _load(text: str | None) -> BreakerState:
    if not text:
        return BreakerState()
    d = json.loads(text)
    return BreakerState(d["tripped_at"], Window.of((n, t) for n, t in d["recent"]), tuple(d["held"]))


_KEYS = (_BREAKER_KEY, _DOMAINS_KEY, _SHARED_KEY, _OWED_KEY)  # in the order of ``Guard.state``
_DUMPS: tuple[Callable[[Any], str], ...] = (_dump, _dump_domains, _dump_shared, dump_owed)
