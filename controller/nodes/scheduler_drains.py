"""Drains made in the scheduler by someone else become signals on their nodes.

A health check (NHC, aznhc), a person, or Slurm itself ("Not responding", "Kill task failed") may
drain a node Vigil never heard a fault from. Each such drain is reported once, through the same
entry point as every fault the controller finds (``Engine.found``), as a ``SCHEDULER_DRAIN`` signal
whose message keeps the reason whole with who set it and whose problem it says it is: the fleet's
story stays complete, and the policy (``record`` by default) decides what it means. Vigil never
lifts such a drain (the actuator resumes only its own).

A drain is new when its node was not drained at the last reading, or was drained with a reason set
at another time. What was reported is kept in the store, so a restarted or new leader does not
report it again. A drain on a node no agent ever connected from is tried again at the next reading.
"""

from __future__ import annotations

import asyncio
import json
from typing import Protocol, runtime_checkable

import structlog

from controller.act.actuators import ForeignDrain
from controller.nodes.found import Found, Report, Result, Source
from controller.store.records import Records
from vigil_core.signals import SignalKind
from vigil_core.waiting import wait_event

log = structlog.get_logger(__name__)

SEEN_KEY = "scheduler_drains_reported"


@runtime_checkable
class DrainSource(Protocol):
    def foreign_drains(self) -> list[ForeignDrain]: ...


def new_drains(drains: list[ForeignDrain], reported: dict[str, float]) -> list[ForeignDrain]:
    """The drains not reported yet. Pure."""
    return [d for d in drains if reported.get(d.node) != d.at]


def still_drained(reported: dict[str, float], drains: list[ForeignDrain]) -> dict[str, float]:
    """What stays worth remembering: the reported drains that are still in place. Pure."""
    now = {d.node: d.at for d in drains}
    return {node: at for node, at in reported.items() if now.get(node) == at}


def describe(drain: ForeignDrain) -> str:
    by = f" by {drain.by}" if drain.by else ""
    return f"drained in Slurm{by}: {drain.reason or 'no reason given'!r} ({drain.kind}); the node is {drain.state}"


class SchedulerDrains:
    def __init__(self, source: DrainSource, report: Report, records: Records, every_s: float) -> None:
        self._source = source
        self._report = report
        self._records = records
        self.every_s = every_s
        self._reported: dict[str, float] = _load(records.get_meta(SEEN_KEY))
        self.up = True  # the last reading worked (vigil_controller_scheduler_drains_up)
        self.waiting: dict[str, float] = {}  # drains on nodes no agent has said hello from, not filed yet

    async def watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                drains = await asyncio.to_thread(self._source.foreign_drains)
            except Exception as exc:  # slurmctld away: say so, read again next time
                self.up = False
                log.warning("scheduler_drains_unread", error=str(exc)[:300])
            else:
                self.up = True
                self.take(drains)
            await wait_event(stop, self.every_s)

    def take(self, drains: list[ForeignDrain]) -> int:
        """Report the new drains; returns how many were filed."""
        reported = still_drained(self._reported, drains)
        filed, waiting = 0, {}
        for drain in new_drains(drains, reported):
            outcome = self._report(
                Found(
                    drain.node, f"drain-{int(drain.at)}", describe(drain), Source.SCHEDULER, SignalKind.SCHEDULER_DRAIN
                )
            )
            if outcome.result is Result.UNKNOWN_NODE:  # no agent has said hello from it yet: next reading
                if self.waiting.get(drain.node) != drain.at:  # said once a drain, not at every reading
                    log.warning("scheduler_drain_waits_for_agent", node=drain.node, reason=drain.reason, by=drain.by)
                waiting[drain.node] = drain.at
                continue
            reported[drain.node] = drain.at
            filed += 1
            log.info("scheduler_drain_seen", node=drain.node, reason=drain.reason, by=drain.by, kind=drain.kind)
        self.waiting = waiting
        if reported != self._reported:
            self._reported = reported
            self._records.set_meta(SEEN_KEY, json.dumps(reported, sort_keys=True))
        return filed


def _load(text: str | None) -> dict[str, float]:
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}
