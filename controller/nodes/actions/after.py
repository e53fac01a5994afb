"""The action runner's follow-up: a quarantine carried out confirms the node's state (stored with
the action's outcome, in its transaction), and what follows it
(``controller.nodes.recovery.rules.after_quarantine``, pure) goes back to the runner."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import structlog

from controller.nodes.actions.runner import Followed
from controller.nodes.fleet import Fleet
from controller.nodes.recovery.rules import RecoveryConfig, after_quarantine
from controller.store import NodeTable, PendingAction
from controller.vocab.actions import PageUpdate, Quarantine

log = structlog.get_logger(__name__)


class AfterAction:
    def __init__(
        self,
        fleet: Fleet,
        recovery: RecoveryConfig,
        drain: bool = False,
        clock: Callable[[], float] = time.time,
        paged: Callable[[str], bool] = lambda incident_id: True,
    ) -> None:
        self._paged = paged  # an incident not paged (its repair pages if hands are needed) gets no thread notes
        self._fleet = fleet
        self._recovery = recovery
        self._drain = drain  # drain the node's pods after its quarantine (kubernetes.drain)
        self._clock = clock

    def __call__(self, pending: PendingAction, detail: str) -> Followed:
        """The node's state now (stored with the action's outcome) and what to ask for next."""
        action = pending.action
        if not isinstance(action, Quarantine) or action.dry_run:
            return Followed()
        entry = self._fleet.nodes.get(action.node)
        if entry is None:
            return Followed()
        state, follow = after_quarantine(entry.state, action, detail, self._clock(), self._recovery, self._drain)
        write = None
        if state is not entry.state:
            entry.state = state
            write = partial(NodeTable.put_states, states=[state])
        if any(isinstance(a, PageUpdate) and a.tag == "REPEAT" for a in follow):
            log.error("repeat_offender", node=action.node, quarantines=len(state.quarantine_history))
        if not self._paged(action.incident_id):
            follow = tuple(a for a in follow if not isinstance(a, PageUpdate))
        return Followed(follow, write)
