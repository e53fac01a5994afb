"""A new leader takes over what an earlier leader left on the cluster: its quarantines (recorded as
incidents here, the nodes QUARANTINED) and their pages."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import structlog

from controller.act.actuators import Actuator, Pager
from controller.nodes.actions.runner import ActionRunner
from controller.nodes.fleet import Fleet, NodeEntry
from controller.nodes.guards.guard import Guard
from controller.store import Store
from controller.vocab.actions import Page, Quarantine
from controller.vocab.node_state import Health, NodeState
from controller.vocab.policy import Severity

log = structlog.get_logger(__name__)


async def adopt_cluster_state(
    actuator: Actuator,
    pager: Pager,
    store: Store,
    fleet: Fleet,
    guard: Guard,
    runner: ActionRunner,
    clock: Callable[[], float],
) -> int:
    """Returns how many quarantines were new to this replica's store."""
    found = await asyncio.to_thread(actuator.adopt)
    now, adopted = clock(), 0
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
    guard.count_adopted([(q.node, q.at) for q in found])
    threads = await asyncio.to_thread(pager.resync)
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
            did=f"quarantined the node ({actuator.quarantine_means}), by the previous leader replica",
        )
        runner.request(page, now)
    log.info("cluster_state_adopted", quarantines_found=len(found), new_here=adopted, paged_incidents=threads)
    return adopted
