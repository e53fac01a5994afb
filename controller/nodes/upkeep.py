"""The node route's periodic work: silent nodes to UNKNOWN, held decisions, quiet suspects,
automatic releases, fold reports, gauges, the nodes' labels and retention. Each step runs on its
own: one that raises (the database away) is logged, counted and tried again after its backoff,
while the others go on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from controller.act.actuators import Actuator, WatchedLabels
from controller.metrics import ControllerMetrics
from controller.nodes.actions.fold_reports import FoldReports
from controller.nodes.by_hand import ByHand
from controller.nodes.decide import silence_deadline, silenced, suspicion_lapsed
from controller.nodes.engine import Engine
from controller.nodes.fleet import Fleet
from controller.nodes.guards.guard import Guard
from controller.nodes.recovery.release_checks import ReleaseChecks
from controller.store import Store
from controller.vocab.node_state import Health
from controller.vocab.policy import Policy
from vigil_core.log_tally import TalliedEvent
from vigil_core.supervise import Tasks
from vigil_core.waiting import wait_event

log = structlog.get_logger(__name__)

# Nodes whose silence is looked at in one go, at most (about 10 µs each here): a new leader's 100,000,
# all due at once, held its event loop for seconds while the fleet said Hello again.
SILENCE_BATCH = 2_000

Labels = dict[str, dict[str, str]]  # node -> its labels (its failure domains), as the cluster has them


class Upkeep:
    def __init__(
        self,
        engine: Engine,
        store: Store,
        policy: Policy,
        fleet: Fleet,
        guard: Guard,
        by_hand: ByHand,
        releases: ReleaseChecks,
        folds: FoldReports,
        actuator: Actuator,
        labels: Labels,
        metrics: ControllerMetrics,
        tasks: Tasks,
        retention_s: float | None = None,
        clock: Callable[[], float] = time.time,
        held_since: Callable[[float], float] = lambda _: 0.0,
    ) -> None:
        self._engine = engine
        self._store = store
        self._policy = policy
        self._fleet = fleet
        self._guard = guard
        self._by_hand = by_hand
        self._releases = releases
        self._folds = folds
        self._actuator = actuator
        self.labels = labels  # the guard reads them; refreshed here in place
        self._metrics = metrics
        self.tasks = tasks
        self.retention_s = retention_s  # None: keep everything
        self._clock = clock
        self._held_since = held_since  # the controller's own lateness since a time is not a node's silence
        # A line per node up to 20 a second: a relay's whole fleet silent at once is 25,000 nodes, and
        # the rest of each busy second one line with their count and a few names (the fleet's state says each).
        self._said_unknown = TalliedEvent(log.warning, "node_unknown")

    def flush_lines(self) -> None:
        """Say the tallied lines' remainder now (the process stops)."""
        self._said_unknown.flush()

    def check_silence(self, limit: int | None = SILENCE_BATCH) -> list[str]:
        """Mark nodes UNKNOWN whose agents went silent; returns their names. Only the nodes whose
        deadline came are looked at (``Fleet.due``), not the whole fleet, and ``limit`` of them at
        most (None: all): a new leader's whole fleet is due at once, and the rest waits for the next
        call (``watch`` calls again at once, letting the event loop run between)."""
        now, changed = self._clock(), []
        for name in self._fleet.due(now, limit):
            entry = self._fleet.nodes.get(name)
            if entry is None:
                continue
            deadline = silence_deadline(
                entry.last_heartbeat,
                entry.connected,
                entry.disconnected_at,
                entry.idle_heartbeat_s,
                self._policy,
                self._held_since,
            )
            if deadline > now:
                self._fleet.watch_silence(name, deadline)
                continue
            new_state = silenced(entry.state)
            if new_state is not entry.state:
                entry.state = new_state  # shown at once, even while the database cannot record it
                changed.append(new_state)
                self._said_unknown(name, silent_s=round(now - entry.last_heartbeat, 1))
        if changed:
            self._store.nodes.save(changed)
        return [s.node for s in changed]

    def clear_quiet_suspects(self) -> list[str]:
        """SUSPECT nodes quiet for the policy's ``suspect_clear_s`` are HEALTHY again, their incidents
        resolved (and said in their threads); returns their names."""
        now = self._clock()
        suspects = self._fleet.in_health(Health.SUSPECT)
        held = self._held_since
        lapsed = [n for n in suspects if suspicion_lapsed(self._fleet.entry(n).state, now, self._policy, held)]
        for node in lapsed:
            quiet_s = self._policy.suspect_clear_s
            self._by_hand.resolve_node(node, f"Resolved: {node} quiet for {quiet_s:.0f} s, back to HEALTHY", now)
            log.info("suspicion_lapsed", node=node, quiet_s=quiet_s)
        return lapsed

    def update_gauges(self) -> None:
        metrics = self._metrics
        for health in Health:
            metrics.nodes.labels(health.value).set(self._fleet.count(health))
        metrics.connected_agents.set(self._fleet.connected_count())
        metrics.automation_paused.set(1 if self._guard.breaker.tripped else 0)

    async def refresh_database_size(self) -> bool:
        """The database's size for its gauge, read off the event loop (on PostgreSQL it is a query:
        read every second on the loop, it held every message behind a round trip, and a database away
        stopped every other gauge with it). A failed read keeps the last size and is a failed step
        (logged, counted, retried after its backoff); False then."""
        return await self.tasks.run_step_in_thread(
            "database_size", lambda: self._metrics.database_bytes.set(self._store.db.size_bytes())
        )

    async def refresh_labels(self) -> None:
        """The nodes' labels (their failure domains), read from the cluster and compared with the last
        ones off the event loop; only what changed is applied on it (at 100,000 nodes, a copy of every
        node's labels every 30 s was tens of milliseconds of the loop and 100,000 new long-lived
        objects for the garbage collector; where the actuator watches them, only what its watch saw
        change is read: comparing all 100,000 in the thread still held the interpreter from the loop
        for tens of milliseconds)."""
        try:
            changed, gone = await asyncio.to_thread(self._labels_changed)
        except Exception as exc:  # the API server is away: keep the last ones, say so
            log.warning("node_labels_unavailable", error=repr(exc)[:300])
            return
        for node in gone:
            self.labels.pop(node, None)
        self.labels.update(changed)

    def _labels_changed(self) -> tuple[Labels, list[str]]:
        """In a thread: what the actuator's watch says changed (``WatchedLabels``), or its labels now
        against the ones held (read only here; only ``refresh_labels`` writes them, after this returns)."""
        held = self.labels
        if isinstance(self._actuator, WatchedLabels) and (changes := self._actuator.label_changes()) is not None:
            changed, gone = changes
            return {node: found for node, found in changed.items() if held.get(node) != found}, gone
        now = self._actuator.node_labels()
        changed = {node: found for node, found in now.items() if (old := held.get(node)) is not found and old != found}
        return changed, [node for node in held if node not in now]

    def apply_retention(self) -> dict[str, int]:
        """Delete what finished longer than ``retention_s`` ago; returns what went."""
        if self.retention_s is None:
            return {}
        gone = self._store.prune(self._clock() - self.retention_s)
        if gone:
            log.info("retention_applied", retention_days=round(self.retention_s / 86400, 2), **gone)
        return gone

    async def watch(
        self,
        stop: asyncio.Event,
        every_s: float = 1.0,
        labels_every_s: float = 30.0,
        retention_every_s: float = 600.0,
        size_every_s: float = 30.0,
    ) -> None:
        last_labels = last_retention = last_size = float("-inf")
        steps: list[tuple[str, Callable[[], object]]] = [
            ("silence", self.check_silence),
            ("held_decisions", self._engine.decide_held),
            ("quiet_suspects", self.clear_quiet_suspects),
            ("releases", self._releases.ask),
            ("fold_reports", self._folds.report),
            ("gauges", self.update_gauges),
        ]
        while not stop.is_set():
            if time.monotonic() - last_labels >= labels_every_s:
                await self.refresh_labels()
                last_labels = time.monotonic()
            if time.monotonic() - last_size >= size_every_s and await self.refresh_database_size():
                last_size = time.monotonic()
            # Retention deletes up to thousands of rows in a durable transaction: in a thread, so that
            # no message waits on the loop behind it (nor behind the writes it waits for first).
            if time.monotonic() - last_retention >= retention_every_s and await self.tasks.run_step_in_thread(
                "retention", self.apply_retention
            ):
                last_retention = time.monotonic()
            for name, step in steps:
                self.tasks.run_step(name, step)
            # The rest of a fleet due at once (a new leader looks at each node it loaded), a batch
            # at a time, the loop free between: its returning agents' Hellos wait behind no pass.
            while self._fleet.has_due(self._clock()) and not stop.is_set():
                await asyncio.sleep(0)
                if not self.tasks.run_step("silence", self.check_silence):
                    break
            await wait_event(stop, every_s)

    def problems(self) -> list[str]:
        """What keeps this controller from doing its work now (readiness, ``vigil status``)."""
        found = [f"task {name} failing: {error}" for name, error in self.tasks.down().items()]
        if problem := self._store.health.problem:
            found.insert(0, problem)
        return found
