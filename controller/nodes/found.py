"""A fault the controller found itself, and what became of it: plain data both ways.

A sweep's failed check, a fabric component a sweep blamed, a job's blamed node, a node that came
back with fewer GPUs, an agent whose spool was replaced: each is a ``Found``, handed to the one
entry point (``Engine.found``), which decides it through the policy and the guardrails like an
agent's signal and returns an ``Outcome``. The caller reads the outcome; it never infers it from
the state the decision left behind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from vigil_core.signals import SignalKind


class Source(StrEnum):
    """Who found it: filed with the signal, shown with the incident."""

    SWEEP = "sweep"  # a sweep's check or its pairwise all-reduce
    MFU = "mfu"  # a job's MFU drop, blamed on a node
    HANG = "hang"  # a hung job, blamed on a node with a hardware signal of its own
    INVENTORY = "inventory"  # a node came back with fewer GPUs
    CONTROLLER = "controller"  # the controller's own bookkeeping (a replaced spool)
    SCHEDULER = "scheduler"  # the scheduler's own record: a drain someone else made (Slurm)


@dataclass(frozen=True)
class Found:
    """``node`` is the node at fault, or, with ``behind``, a fabric component (a leaf switch, an
    uplink) and the nodes behind it, held together in its failure domain (``domain``)."""

    node: str
    key: str  # what files it: the sweep's id, the job's drop incident, ...
    reason: str
    source: Source
    kind: SignalKind = SignalKind.CHECK_FAILED
    behind: tuple[str, ...] = ()
    domain: str = ""

    @property
    def is_component(self) -> bool:
        return bool(self.behind)


class Result(StrEnum):
    QUARANTINE_REQUESTED = "quarantine requested"
    HELD_BY_BREAKER = "held by the circuit breaker"
    DRY_RUN = "dry-run: would quarantine"
    NOT_QUARANTINED = "not quarantined"
    HELD_IN_DOMAIN = "held in its failure domain"
    UNKNOWN_NODE = "not quarantined: no agent of that name has ever connected"


@dataclass(frozen=True)
class Outcome:
    result: Result
    incident_id: str = ""
    detail: str = ""  # the node's health when nothing was quarantined; the domain's story for a component

    @property
    def quarantined(self) -> bool:
        """A quarantine is on its way (the actuator carries it out)."""
        return self.result is Result.QUARANTINE_REQUESTED

    def __str__(self) -> str:
        text = self.result.value + (f": {self.detail}" if self.detail else "")
        return text + (f" (incident {self.incident_id})" if self.incident_id else "")


Report = Callable[[Found], Outcome]  # the entry point, as the rooms above the nodes see it
