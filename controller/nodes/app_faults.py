"""Application faults: XIDs the policy marks as the application's (13, 31, 43, 45) on most nodes of
one training job within a short window are the job's own crash (its code, its data), not that many
bad GPUs. They are recorded on each node, paged once for the job, and make no node SUSPECT.

What is evidence of a crash: an application XID whose rule would page (13, 31: the catalog's
RESTART_APP). The ones a teardown writes (43, 45: a job killed, preempted or finished) are recorded
and claimed by a crash when there is one, but never make one. And a hardware fault (an XID whose
rule quarantines: 48, 79, 95, 119, ...) on one of the job's nodes within the window caused the
crash: the hardware is quarantined and paged on its own, the job's crash is not paged as the job's.

The job monitor keeps ``JobMembership`` (which nodes each job runs on, from its reports); the engine
asks ``AppFaults`` before it decides an application XID. A crash is recognised once more than
``fraction`` of the job's nodes have reported one within ``window_s``.

Nodes of a job that crashed everywhere at once do not report in the same millisecond. So an
application XID that would make a node of a job (of at least ``min_nodes``) SUSPECT is held for
``grace_s``: recorded at once, decided only when no crash of its job claimed it by then (the
engine's watch asks ``due``). The node being in service either way, waiting costs nothing; deciding
first would page a node for its job's crash. What is held, and what stops being held (decided, or
claimed by a crash), is stored in the transaction of the decision that did it (``changes``, the
engine writes them), so a controller restarted within the grace decides what the last one held.
With ``MAX_HELD`` held already, a signal is decided at once: never held and forgotten.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import structlog
from pydantic import Field

from controller.vocab.actions import Page, PageUpdate
from controller.vocab.held import Held
from controller.vocab.node_state import NodeState
from controller.vocab.policy import Policy, Severity
from vigil_core.config_file import ConfigModel
from vigil_core.signals import Signal, SignalKind

log = structlog.get_logger(__name__)

MAX_HELD = 4096  # application XIDs waiting for their job's other nodes at once


class AppFaultConfig(ConfigModel):
    window_s: float = Field(default=60.0, gt=0, description="application XIDs on a job's nodes within this")
    fraction: float = Field(default=0.5, ge=0, lt=1, description="more than this fraction of its nodes: the job's")
    min_nodes: int = Field(default=2, ge=2, description="a job on fewer nodes is judged node by node")
    page_every_s: float = Field(default=600.0, gt=0, description="one page per job crash within this")
    grace_s: float = Field(
        default=2.0, ge=0, le=60, description="a job's node's application XID waits this for the job's other nodes"
    )


def job_crashed(nodes: Sequence[str], last_hit: Mapping[str, float], now: float, config: AppFaultConfig) -> bool:
    """Whether the job's nodes' application XIDs say the job itself crashed. Pure."""
    if len(nodes) < config.min_nodes:
        return False
    hit = sum(1 for n in nodes if last_hit.get(n, float("-inf")) >= now - config.window_s)
    return hit > config.fraction * len(nodes)


class JobMembership:
    """Which nodes each known job runs on: as its reports say (the job monitor writes), else as the
    nodes' agents say (the jobs their processes run, with each Hello and heartbeat: what a job
    without the hook has, and every job right after a controller restart, before it reports again).
    The engine reads."""

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[str, ...]] = {}
        self._seen: dict[str, set[str]] = {}  # job -> the nodes whose agents see it
        self._seen_on: dict[str, frozenset[str]] = {}  # node -> the jobs its agent sees

    def set(self, job_id: str, nodes: Sequence[str]) -> None:
        self._nodes[job_id] = tuple(nodes)

    def forget(self, job_id: str) -> None:
        self._nodes.pop(job_id, None)

    def agent_sees(self, node: str, jobs: frozenset[str]) -> None:
        """What the node's agent says its processes run now."""
        before = self._seen_on.get(node, frozenset())
        if jobs == before:
            return
        for job in before - jobs:
            if (nodes := self._seen.get(job)) is not None:
                nodes.discard(node)
                if not nodes:
                    del self._seen[job]
        for job in jobs - before:
            self._seen.setdefault(job, set()).add(node)
        if jobs:
            self._seen_on[node] = jobs
        else:
            self._seen_on.pop(node, None)

    def jobs_of(self, node: str) -> list[tuple[str, tuple[str, ...]]]:
        reported = [(job, nodes) for job, nodes in sorted(self._nodes.items()) if node in nodes]
        seen = [
            (job, tuple(sorted(self._seen[job])))
            for job in sorted(self._seen_on.get(node, frozenset()))
            if job not in self._nodes
        ]
        return reported + seen


class AppFaults:
    def __init__(self, membership: JobMembership, config: AppFaultConfig | None = None) -> None:
        self.membership = membership
        self.config = config or AppFaultConfig()
        self._last_hit: dict[str, float] = {}  # node -> its latest application XID
        self._paged_at: dict[str, float] = {}  # job -> when its crash was last paged
        self._held: list[Held] = []  # waiting for the job's other nodes
        self._unsaved: tuple[list[Held], list[Held]] = ([], [])  # (held, no longer held) since ``changes``
        self._hardware: dict[str, float] = {}  # node -> its latest hardware XID (one whose rule quarantines)
        self._crash_pages: dict[str, tuple[str, tuple[str, ...], float]] = {}  # job -> (incident, nodes, when)

    def observe(self, node: str, at: float) -> tuple[str, tuple[str, ...]] | None:
        """An application XID on ``node``: the job (and its nodes) whose crash it is part of, if any."""
        self._last_hit[node] = at
        return self._crashed(node, at)

    def _crashed(self, node: str, at: float) -> tuple[str, tuple[str, ...]] | None:
        """A job of ``node``'s whose crash its nodes' application XIDs say it is, as of ``at``."""
        for job, nodes in self.membership.jobs_of(node):
            if job_crashed(nodes, self._last_hit, at, self.config):
                return job, nodes
        return None

    def crash_of(self, signal: Signal, policy: Policy, now: float) -> tuple[str, Page | PageUpdate | None]:
        """The job whose own crash this signal is part of ('' when none), and its page the first time;
        or, for a hardware XID just after a crash was paged as the job's own, the word on that page
        that the hardware likely caused it."""
        if signal.kind is not SignalKind.XID:
            return "", None
        rule, at = policy.rule_for(signal), signal.observed_at or now
        if rule.action is Severity.QUARANTINE:
            self._hardware[signal.node] = at  # it, not the job, caused whatever crash comes with it
            return "", self._correction(signal, rule.meaning or "hardware", now)
        if not rule.application:
            return "", None
        if rule.action is Severity.RECORD:  # a teardown's (43, 45): claimed by a crash, never one itself
            crashed = self._crashed(signal.node, at)  # claimed by a crash recognised already, if any
            return (crashed[0] if crashed else ""), None
        crash = self.observe(signal.node, at)
        if crash is None:
            return "", None
        job, nodes = crash
        claimed = set(self.hit_nodes(nodes, now))
        self._let_go([h for h in self._held if h.signal.node in claimed])  # part of the crash
        if culprits := self.hardware_on(nodes, now):
            log.warning("job_crash_caused_by_hardware", job=job, nodes=list(nodes), hardware=culprits)
            return job, None  # the hardware's own incident pages it; the job is not blamed
        if not self.page_due(job, now):
            return job, None
        log.warning("job_crash_recognised", job=job, nodes=list(nodes))
        page = job_crash_page(job, nodes, self.hit_nodes(nodes, now), now)
        self._crash_pages[job] = (page.incident_id, tuple(nodes), now)
        return job, page

    def _correction(self, signal: Signal, reason: str, now: float) -> PageUpdate | None:
        """A hardware XID on a node of a job whose crash was paged as its own within the window: the
        crash was likely the hardware's; said once on the job's page (the node pages as its own)."""
        for job, (incident, nodes, paged_at) in list(self._crash_pages.items()):
            if now - paged_at > self.config.window_s:
                del self._crash_pages[job]
            elif signal.node in nodes:
                del self._crash_pages[job]
                log.warning("job_crash_was_hardware", job=job, node=signal.node, code=signal.code)
                text = (
                    f"{signal.node} then wrote XID {signal.code} ({reason}): the hardware likely caused this "
                    f"crash, not the job's code; {signal.node} is taken out as its own incident"
                )
                return PageUpdate(incident, "", "HARDWARE", text, observed_at=now)
        return None

    def hardware_on(self, nodes: Sequence[str], now: float) -> list[str]:
        """The job's nodes with a hardware XID within the window: what caused its crash, if any."""
        return [n for n in nodes if self._hardware.get(n, float("-inf")) >= now - self.config.window_s]

    def may_be_crash(self, node: str) -> bool:
        """Whether the node's application XIDs could yet turn out to be its job's crash (and there is
        room to hold them while that is seen)."""
        if self.config.grace_s <= 0 or len(self._held) >= MAX_HELD:
            return False
        return any(len(nodes) >= self.config.min_nodes for _, nodes in self.membership.jobs_of(node))

    def restore(self, held: Sequence[Held]) -> None:
        """What an earlier controller held and did not decide (from the store): decided when due, and
        counted as its node's application XID, so a crash of its job seen now claims it."""
        self._held = [*held, *self._held]
        for h in held:
            at = h.signal.observed_at or h.decide_at - self.config.grace_s
            self._last_hit[h.signal.node] = max(at, self._last_hit.get(h.signal.node, at))

    def restore_hardware(self, states: Iterable[NodeState]) -> None:
        """The hardware XIDs the nodes' remembered incidents hold (their last time): a job crash seen
        just after a restart is still the hardware's when one of its nodes had one within the window."""
        for state in states:
            for ref in state.incidents:
                if ref.severity is Severity.QUARANTINE and f"|{SignalKind.XID.value}|" in ref.key:
                    self._hardware[state.node] = max(ref.last_at, self._hardware.get(state.node, ref.last_at))

    def restore_paged(self, pages: Sequence[tuple[str, float]]) -> None:
        """The job-crash pages an earlier controller asked for (incident, when; from its action log):
        the same crash is not paged again within ``page_every_s`` across a restart."""
        for incident, at in pages:
            if job := job_of_crash_page(incident):
                self._paged_at[job] = max(at, self._paged_at.get(job, at))

    def hold(self, signal: Signal, spool_id: str, now: float) -> None:
        """Decide ``signal`` after the grace, unless a crash of its job claims it first."""
        held = Held(now + self.config.grace_s, spool_id, signal)
        self._held.append(held)
        self._unsaved[0].append(held)

    def due(self, now: float) -> list[Signal]:
        """The held signals whose grace is over, no job crash having claimed them."""
        due = [h for h in self._held if h.decide_at <= now]
        self._let_go(due)
        return [h.signal for h in due]

    def _let_go(self, gone: list[Held]) -> None:
        if gone:
            ids = {id(h) for h in gone}
            self._held = [h for h in self._held if id(h) not in ids]
            self._unsaved[1].extend(gone)

    def changes(self) -> tuple[list[Held], list[Held]]:
        """What was held and what stopped being held since the last call, to store with the decision."""
        changes, self._unsaved = self._unsaved, ([], [])
        return changes

    def page_due(self, job: str, now: float) -> bool:
        """True once per crash of the job (then not again within ``page_every_s``)."""
        if now - self._paged_at.get(job, float("-inf")) < self.config.page_every_s:
            return False
        self._paged_at[job] = now
        return True

    def hit_nodes(self, nodes: Sequence[str], now: float) -> list[str]:
        return [n for n in nodes if self._last_hit.get(n, float("-inf")) >= now - self.config.window_s]


def job_crash_page(job: str, nodes: Sequence[str], hit: Sequence[str], now: float) -> Page:
    """The one page for a job's own crash (about the job, not a node)."""
    summary = (
        f"job {job}: application XIDs (13, 31, 43, 45) on {len(hit)} of its {len(nodes)} nodes at once "
        f"({', '.join(hit)}): the job's own crash, not {len(hit)} bad GPUs"
    )
    did = "recorded on each node; no node marked SUSPECT, nobody quarantined"
    remedy = "look at the job's logs (its code, its data, its last change) before the GPUs"
    return Page(f"{CRASH_PAGE}{job}-{int(now)}", "", Severity.SUSPECT, summary, remedy, now, did=did)


CRASH_PAGE = "app-"  # a job crash page's incident: app-<job>-<when>


def job_of_crash_page(incident: str) -> str:
    """The job a crash page's incident id names ("" for another incident). Pure."""
    if not incident.startswith(CRASH_PAGE):
        return ""
    job, _, when = incident.removeprefix(CRASH_PAGE).rpartition("-")
    return job if when.isdigit() else ""
