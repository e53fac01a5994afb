"""A new leader takes over what an earlier leader left on the cluster: its quarantines (recorded as
incidents here, the nodes QUARANTINED) and their pages.

Where the actuator watches the cluster's nodes (Kubernetes), a standby's watch has listed them
before it leads: the new leader adopts from the watch and serves at once, then reads the cluster
itself in the background (``Adopter.check``: a list of every Node, 1.2 s for 100,000 here after a
kill, several seconds while a fleet reconnects) and adopts what the watch was behind on, saying so.
Elsewhere (Slurm) it reads the cluster before it serves."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace

import structlog

from controller.act.actuators import Actuator, FoundQuarantine, Pager, WatchedAdoption
from controller.nodes.actions.runner import ActionRunner
from controller.nodes.fleet import Fleet, NodeEntry
from controller.nodes.guards.guard import Guard
from controller.store import Store
from controller.vocab.actions import Page, Quarantine
from controller.vocab.node_state import Health, NodeState
from controller.vocab.policy import Severity

log = structlog.get_logger(__name__)


@dataclass
class Adoption:
    """What a new leader adopts, and how. ``watched``: the nodes adopted from the actuator's watch,
    which the cluster itself is read after (``check``); None when it was read from the cluster."""

    new_here: int  # quarantines that were new to this replica's store
    watched: set[str] | None


@dataclass
class Adopter:
    actuator: Actuator
    pager: Pager
    store: Store
    fleet: Fleet
    guard: Guard
    runner: ActionRunner
    clock: Callable[[], float]

    async def at_leadership(self) -> Adoption:
        """Adopt the earlier leader's quarantines: from the actuator's watch where it has listed the
        cluster (a standby's has; no request, so the new leader serves at once), else from the cluster."""
        found = self.actuator.adopt_watched() if isinstance(self.actuator, WatchedAdoption) else None
        watched = None if found is None else {q.node for q in found}
        if found is None:
            found = await asyncio.to_thread(self.actuator.adopt)
        adopted = self._take_over(found)
        threads = await asyncio.to_thread(self.pager.resync)
        log.info(
            "cluster_state_adopted",
            quarantines_found=len(found),
            new_here=adopted,
            paged_incidents=threads,
            read_from="the node watch" if watched is not None else "the cluster",
        )
        return Adoption(adopted, watched)

    async def check(self, watched: set[str]) -> int:
        """After an adoption from the watch: read the cluster itself and adopt what the watch had not
        shown yet (the earlier leader's last writes, where the watch was behind). Returns how many."""
        cluster = await asyncio.to_thread(self.actuator.adopt)
        found = [q for q in cluster if q.node not in watched]
        if found:
            log.warning(
                "quarantines_adopted_late",
                nodes=[q.node for q in found][:20],
                count=len(found),
                why="the node watch had not shown them when this replica began to lead",
            )
            self._take_over(found)
        log.info("cluster_state_checked", quarantines_found=len(cluster), adopted_late=len(found))
        return len(found)

    def _take_over(self, found: list[FoundQuarantine]) -> int:
        """Record each as an open incident and the node QUARANTINED, count them in the guard, and ask
        for the quarantine and its page again; returns how many were new to this store."""
        store, fleet, runner = self.store, self.fleet, self.runner
        now, adopted = self.clock(), 0
        for q in found:
            adopted += store.incidents.adopt(q.node, q.incident_id, q.reason, q.at, now)
            fleet.open_incident.setdefault(q.node, q.incident_id)
            entry = fleet.nodes.get(q.node)
            if entry is None:
                entry = fleet.add(q.node, NodeEntry(NodeState(node=q.node), "", 0, now, 0))
                store.nodes.register(entry.state, "", 0, 0, now)
            if entry.state.health is not Health.QUARANTINED:
                entry.state = replace(entry.state, health=Health.QUARANTINED, quarantined_at=q.at or now)
                store.nodes.save([entry.state])
        self.guard.count_adopted([(q.node, q.at) for q in found])
        for q in found:
            # The previous leader may have died half-way: after the cordon, before the condition, the
            # Event or the page. Ask for both again; the actuator finishes only what is missing, and the
            # pager knows (Slack: the channel's history; webhook: idempotency key) what already went out.
            runner.request(Quarantine(q.incident_id, q.node, q.reason, ""), now)
            page = Page(
                q.incident_id,
                q.node,
                Severity.QUARANTINE,
                q.reason,
                "see the incident's signals; the node stays quarantined until released",
                observed_at=0.0,
                did=f"quarantined the node ({self.actuator.quarantine_means}), by the previous leader replica",
            )
            runner.request(page, now)
        return adopted
