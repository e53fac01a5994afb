"""Actuators carry out the decisions' side effects. Each call is idempotent by incident id: the
action runner may repeat it after a failure, a controller restart or a change of leader.

This module has the interfaces and the local ones: the local actuator records the quarantine in the
incident store (the demo's cluster has no Kubernetes), and the console pager prints the page. The
Kubernetes actuator is in ``controller.kube``, the Slack and webhook pagers in ``controller.pagers``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Protocol, TextIO

from controller.actions import Drain, Page, PageUpdate, Quarantine
from controller.store import Store


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


class Actuator(Protocol):
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

    def nodes_matching(self, selector: str) -> list[str]:
        """The nodes a label selector picks; raises SelectionError."""
        ...

    def job_nodes(self, namespace: str, job: str) -> list[str]:
        """The nodes that a Job's pods run on; raises SelectionError."""
        ...


class Pager(Protocol):
    def page(self, action: Page) -> str: ...

    def update(self, action: PageUpdate) -> str: ...

    def resync(self) -> int:
        """Learn which incidents were paged already (a new leader); returns how many were found."""
        ...


_NEED_KUBE = "needs the kubernetes actuator (this controller runs the local one: no labels, no pods)"


class LocalActuator:
    def __init__(self, store: Store) -> None:
        self._store = store

    def quarantine(self, action: Quarantine) -> str:
        done = self._store.record_quarantine(action.node, action.incident_id, action.reason, time.time())
        return "quarantined (local)" if done else "already quarantined (local)"

    def release(self, node: str, reason: str) -> Release:
        owner = self._store.release_quarantine(node)
        if owner is None:
            return Release(False, "not quarantined by Vigil: left as it is")
        return Release(True, f"released (local; was incident {owner})")

    def adopt(self) -> list[FoundQuarantine]:
        return []

    def drain(self, action: Drain) -> str:
        return "nothing to drain (local actuator: no pods)"

    def nodes_matching(self, selector: str) -> list[str]:
        raise SelectionError(f"label selectors {_NEED_KUBE}")

    def job_nodes(self, namespace: str, job: str) -> list[str]:
        raise SelectionError(f"choosing a Job's nodes {_NEED_KUBE}")


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
