"""Actuators carry out the decisions' side effects. Each call is idempotent by incident id: the
action runner may repeat it after a failure or a controller restart.

This module has the local ones: the local actuator records the quarantine in the incident store
(the demo's cluster has no Kubernetes), and the console pager prints the page.
"""

from __future__ import annotations

import sys
import time
from typing import Protocol, TextIO

from controller.decide import Page, Quarantine
from controller.store import Store


class Actuator(Protocol):
    def quarantine(self, action: Quarantine) -> str:
        """Take the node out of service; returns a one-line account of what was done."""
        ...


class Pager(Protocol):
    def page(self, action: Page) -> str: ...


class LocalActuator:
    def __init__(self, store: Store) -> None:
        self._store = store

    def quarantine(self, action: Quarantine) -> str:
        done = self._store.record_quarantine(action.node, action.incident_id, action.reason, time.time())
        return "quarantined (local)" if done else "already quarantined (local)"


class ConsolePager:
    """Writes each page as a block of text, for the demo and for a person watching a terminal."""

    def __init__(self, out: TextIO = sys.stdout) -> None:
        self._out = out

    def page(self, action: Page) -> str:
        lines = [
            f"PAGE [{action.severity.value.upper()}] incident {action.incident_id}",
            f"  node:    {action.node}",
            f"  what:    {action.summary}",
            f"  do:      {action.remedy or 'investigate the node'}",
        ]
        self._out.write("\n".join(lines) + "\n")
        self._out.flush()
        return "paged (console)"


class NullPager:
    def page(self, action: Page) -> str:
        return "paging disabled"
