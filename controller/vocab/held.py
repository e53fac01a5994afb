"""A signal whose decision waits: an application XID held for its job's other nodes
(``controller.nodes.app_faults``), stored until it is decided (``controller.store.incidents``)."""

from __future__ import annotations

from dataclasses import dataclass

from vigil_core.signals import Signal


@dataclass(frozen=True, slots=True)
class Held:
    """Decided at ``decide_at`` unless claimed first; filed under ``spool_id`` (its agent's spool)."""

    decide_at: float
    spool_id: str
    signal: Signal
