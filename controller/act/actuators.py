"""Actuators carry out the decisions' side effects. Each call is idempotent by incident id: the
action runner may repeat it after a failure, a controller restart or a change of leader.

This module has the interfaces and the pagers that need nothing: the console pager prints the page.
The local actuator (the demo's, no Kubernetes) is in ``controller.act.local_actuator``, the Kubernetes
one in ``controller.act.kube``, the Slack and webhook pagers in ``controller.act.pagers``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TextIO, runtime_checkable

from controller.vocab.actions import Drain, Page, PageUpdate, Quarantine


class PermanentActionError(Exception):
    """The action cannot succeed by trying again (the node does not exist, access is denied)."""


class SelectionError(ValueError):
    """Nodes could not be chosen as asked (a bad label selector, a Job with no pods, no Kubernetes)."""


class NotReadyYet(Exception):
    """The action depends on another still under way (a thread reply before its message): try later."""


@dataclass(frozen=True, slots=True)
class Release:
    released: bool  # False: the node was not quarantined by Vigil, and was left as it is
    detail: str


@dataclass(frozen=True, slots=True)
class FoundQuarantine:
    """A quarantine that Vigil made, as the cluster records it (for a new leader to adopt)."""

    node: str
    incident_id: str
    reason: str
    at: float


@dataclass(frozen=True, slots=True)
class ForeignDrain:
    """A node drained in the scheduler by someone other than Vigil, as the scheduler records it."""

    node: str  # Vigil's name for it
    reason: str  # as written, kept whole
    by: str  # who set it, where the scheduler says
    at: float  # when the reason was set (Unix seconds): a new drain has a new time
    kind: str  # node_problem, user_problem or person (controller.act.slurm.plans.DrainKind)
    state: str  # the scheduler's state, e.g. ALLOCATED+DRAIN


class NodeSelector(Protocol):
    def nodes_matching(self, selector: str) -> list[str]:
        """The nodes a label selector picks; raises SelectionError."""
        ...

    def job_nodes(self, namespace: str, job: str) -> list[str]:
        """The nodes that a Job's pods run on; raises SelectionError."""
        ...


class Actuator(NodeSelector, Protocol):
    # What a quarantine is on this cluster, in a person's words (pages say it: "a taint, ...").
    quarantine_means: str

    def quarantine(self, action: Quarantine) -> str:
        """Take the node out of service; returns a one-line account of what was done."""
        ...

    def release(self, node: str, reason: str) -> Release:
        """Return the node to service, only if Vigil quarantined it."""
        ...

    def drain(self, action: Drain) -> str:
        """Evict the node's workload pods; raises while some cannot be evicted yet (a budget forbids it)."""
        ...

    def adopt(self) -> list[FoundQuarantine]:
        """The quarantines Vigil made that the cluster records (empty where the store is the record)."""
        ...

    def node_labels(self) -> dict[str, dict[str, str]]:
        """Every node's labels (the failure domains come from them): dicts the actuator never changes
        afterwards (the controller keeps them as they are, and compares the next ones with them)."""
        ...

    def close(self) -> None:
        """Let go of what it holds besides calls (a watch's thread); at the controller's shutdown."""
        ...


@dataclass(frozen=True, slots=True)
class Unfinished:
    """A quarantine whose urgent part is done (the node takes no new work) and whose record is not
    (on Kubernetes: the node's condition and the Event). ``finish`` writes the rest, idempotently, and
    returns the account of the whole; a quarantine carried out again after a failure or a restart
    finds its urgent part done and writes only the rest."""

    finish: Callable[[], str]


@runtime_checkable
class UrgentFirst(Protocol):
    """An actuator whose quarantine has an urgent part and a record: the action runner writes every
    quarantine's urgent part before any record, so a burst of a thousand cordons all of its nodes
    first (``controller.nodes.actions.runner``)."""

    def quarantine_urgent_first(self, action: Quarantine) -> str | Unfinished:
        """The urgent part of ``quarantine``: an account when nothing is left to do, else the rest."""
        ...


@runtime_checkable
class WatchedAdoption(Protocol):
    """An actuator that keeps the cluster's nodes by a watch: a new leader adopts from what the watch
    shows (a standby's watch has listed the cluster already) and serves at once; ``adopt``, which
    reads the cluster itself, follows in the background for what the watch had not shown yet."""

    def adopt_watched(self) -> list[FoundQuarantine] | None:
        """``adopt`` from the watch, no request (None until the watch has listed the cluster)."""
        ...


@runtime_checkable
class WatchedLabels(Protocol):
    """An actuator that keeps the nodes' labels by a watch, so a refresh takes only what changed
    instead of comparing every node's (at 100,000 nodes, tens of milliseconds of CPU every refresh,
    holding the interpreter from the event loop)."""

    def label_changes(self) -> tuple[dict[str, dict[str, str]], list[str]] | None:
        """The labels that changed since the last call (nodes that joined among them) and the nodes
        gone; None where the whole must be compared (the first call, and after the watch listed the
        cluster again). One reader: a call takes what it returns."""
        ...


class Pager(Protocol):
    def page(self, action: Page) -> str: ...

    def update(self, action: PageUpdate) -> str: ...

    def resync(self) -> int:
        """Learn which incidents were paged already (a new leader); returns how many were found."""
        ...


class ConsolePager:
    """Writes each page as a block of text, for the demo and for a person watching a terminal."""

    def __init__(self, out: TextIO = sys.stdout) -> None:
        self._out = out

    def page(self, action: Page) -> str:
        lines = [
            f"PAGE [{action.severity.value.upper()}] incident {action.incident_id}",
            f"  node:    {action.node}",
            f"  what:    {action.summary}",
            f"  did:     {action.did or '-'}",
            f"  do:      {action.remedy or 'investigate the node'}",
        ]
        self._write(lines)
        return "paged (console)"

    def update(self, action: PageUpdate) -> str:
        self._write([f"  update [{action.incident_id}] {action.tag}: {action.text}"])
        return "updated (console)"

    def resync(self) -> int:
        return 0

    def _write(self, lines: list[str]) -> None:
        self._out.write("\n".join(lines) + "\n")
        self._out.flush()


class NullPager:
    def page(self, action: Page) -> str:
        return "paging disabled"

    def update(self, action: PageUpdate) -> str:
        return "paging disabled"

    def resync(self) -> int:
        return 0
