"""The nodes the controller knows, in memory: their state, their agents' connections, their open
incidents. The engine owns the ``Fleet`` and changes it; the job monitor and the sweeper see it
through ``FleetView``, which can only read."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from dataclasses import InitVar, dataclass, field
from typing import Protocol

from controller.store import NodeRow
from controller.vocab.node_state import Health, NodeState
from vigil_core.rank_progress import RankRecord


class UnknownNode(Exception):
    pass


NO_JOBS: frozenset[str] = frozenset()  # every node without jobs shares it (each empty frozenset is an object)


# A failure found by the controller itself (a sweep's check, a job's blamed node), decided and acted
# on like an agent's signal: (node, key, reason) -> what became of it. Raises UnknownNode.
ReportFailure = Callable[[str, str, str], str]


class HealthIndex:
    """Which nodes are in which health, and which agents are connected, kept as entries change: the
    once-a-second work (suspects to clear, quarantines to release, gauges) reads the few nodes it
    concerns, not the whole fleet."""

    def __init__(self) -> None:
        self.by_health: dict[Health, set[str]] = {h: set() for h in Health}
        self.connected: set[str] = set()

    def moved(self, node: str, old: Health | None, new: Health) -> None:
        if old is not None:
            self.by_health[old].discard(node)
        self.by_health[new].add(node)


@dataclass(slots=True, eq=False)
class NodeEntry:
    initial_state: InitVar[NodeState]
    spool_id: str
    last_seq: int
    last_heartbeat: float  # when its agent last said anything (a Hello, a heartbeat, a batch)
    gpus: int
    dropped_faults: int = 0  # as the agent last reported it
    spooled: int = 0  # signals waiting in its agent's spool, at its last heartbeat
    address: str = ""  # where the node's peers reach it (pairwise checks); known once its agent connects
    expected_gpus: int = 0  # the most GPUs it has ever reported: fewer is a fault, and blocks its release
    jobs: frozenset[str] = NO_JOBS  # the training jobs its agent sees its processes run
    ranks: tuple[RankRecord, ...] = ()  # their ranks' progress records, as its agent last sent them
    connected_at: float = 0.0  # when its agent last said hello (a rebooted node's agent says it anew)
    disconnected_at: float = 0.0  # when its agent's stream last closed
    idle_heartbeat_s: float = 0.0  # how long its agent may stay quiet with nothing new (its Hello says)
    booted_at: float = 0.0  # when the node booted, on its own clock, as its last Hello said (0: not said)
    recorded_at: int = 0  # the store's commits made once its last batch was recorded (``GroupCommit.made``)
    _state: NodeState = field(init=False)
    _connected: bool = field(init=False, default=False)
    _index: HealthIndex | None = field(init=False, default=None)

    def __post_init__(self, initial_state: NodeState) -> None:
        self._state = initial_state

    @property
    def state(self) -> NodeState:
        return self._state

    @state.setter
    def state(self, new: NodeState) -> None:
        old, self._state = self._state, new
        if self._index is not None and old.health is not new.health:
            self._index.moved(new.node, old.health, new.health)

    @property
    def connected(self) -> bool:
        return self._connected

    @connected.setter
    def connected(self, now_connected: bool) -> None:
        self._connected = now_connected
        if self._index is not None:
            (self._index.connected.add if now_connected else self._index.connected.discard)(self._state.node)


class FleetView(Protocol):
    def health(self, node: str) -> Health | None:
        """The node's health; None for a node the controller has never heard of."""
        ...

    def incident_of(self, node: str) -> str:
        """The node's latest open incident ('' when none)."""
        ...

    def connected(self) -> list[str]:
        """The nodes whose agents are connected now, sorted."""
        ...

    def last_fault_at(self, node: str) -> float:
        """When the node's latest page-worthy fault was observed (0: none the controller remembers)."""
        ...

    def ranks(self, node: str) -> tuple[RankRecord, ...]:
        """The training ranks' progress records its agent last sent (vigil_core.rank_progress)."""
        ...

    def recent_faults(self, node: str) -> list[tuple[str, float]]:
        """The node's remembered incidents, recorded ones too: (key ``gpu|KIND|code``, last seen)."""
        ...

    def is_connected(self, node: str) -> bool: ...

    def address(self, node: str) -> str:
        """Where the node's peers reach it, as its agent last said ('' when it never did)."""
        ...

    def runs_job(self, node: str, job_id: str) -> bool:
        """Whether the node's own agent saw a process of that job there at its last heartbeat."""
        ...


class Fleet:
    def __init__(self, rows: dict[str, NodeRow], open_incidents: dict[str, str], now: float) -> None:
        self.index = HealthIndex()
        self.nodes: dict[str, NodeEntry] = {}
        # When to look at a node's silence again: (when, node); about one entry per node, looked at
        # once per timeout (``due``), so the cost grows with the nodes going quiet, not with the fleet.
        self._deadlines: list[tuple[float, str]] = []
        # Heartbeats are not persisted as they come (20,000 nodes beat 4,000 times a second): after a
        # start every known node gets a full heartbeat timeout to reconnect before it counts as silent.
        for name, row in rows.items():
            entry = NodeEntry(row.state, row.spool_id, row.last_seq, now, row.gpus)
            entry.expected_gpus, entry.disconnected_at = max(row.expected_gpus, row.gpus), now
            self.add(name, entry)
        # The latest open incident of each node, for status views (kept here, not read per request).
        self.open_incident: dict[str, str] = dict(open_incidents)

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[str]:
        return iter(self.nodes)

    def names(self) -> list[str]:
        return list(self.nodes)

    def entries(self) -> Iterable[tuple[str, NodeEntry]]:
        return self.nodes.items()

    def in_health(self, health: Health) -> list[str]:
        """The nodes in ``health`` now (a copy: the caller may change their states)."""
        return list(self.index.by_health[health])

    def count(self, health: Health) -> int:
        return len(self.index.by_health[health])

    def connected_count(self) -> int:
        return len(self.index.connected)

    def entry(self, node: str) -> NodeEntry:
        entry = self.nodes.get(node)
        if entry is None:
            raise UnknownNode(node)
        return entry

    def add(self, node: str, entry: NodeEntry) -> NodeEntry:
        self.nodes[node] = entry
        entry._index = self.index
        self.index.moved(node, None, entry.state.health)
        if entry.connected:
            self.index.connected.add(node)
        self.watch_silence(node, entry.last_heartbeat)
        return entry

    def watch_silence(self, node: str, at: float) -> None:
        """Look at the node's silence again at ``at`` (a disconnection, a new node)."""
        heapq.heappush(self._deadlines, (at, node))

    def due(self, now: float, limit: int | None = None) -> list[str]:
        """The nodes whose silence is due to be looked at now, ``limit`` at most (the soonest due
        first); each comes again only when re-armed."""
        found: list[str] = []
        while self._deadlines and self._deadlines[0][0] <= now and (limit is None or len(found) < limit):
            found.append(heapq.heappop(self._deadlines)[1])
        return found

    def has_due(self, now: float) -> bool:
        """Whether a node's silence is due to be looked at now."""
        return bool(self._deadlines) and self._deadlines[0][0] <= now

    # FleetView --------------------------------------------------------------------------------

    def health(self, node: str) -> Health | None:
        entry = self.nodes.get(node)
        return None if entry is None else entry.state.health

    def incident_of(self, node: str) -> str:
        return self.open_incident.get(node, "")

    def connected(self) -> list[str]:
        return sorted(self.index.connected)

    def is_connected(self, node: str) -> bool:
        entry = self.nodes.get(node)
        return entry is not None and entry.connected

    def last_fault_at(self, node: str) -> float:
        entry = self.nodes.get(node)
        return entry.state.last_fault_at if entry is not None else 0.0

    def ranks(self, node: str) -> tuple[RankRecord, ...]:
        entry = self.nodes.get(node)
        return () if entry is None else entry.ranks

    def recent_faults(self, node: str) -> list[tuple[str, float]]:
        entry = self.nodes.get(node)
        return [] if entry is None else [(r.key, r.last_at) for r in entry.state.incidents]

    def address(self, node: str) -> str:
        entry = self.nodes.get(node)
        return "" if entry is None else entry.address

    def runs_job(self, node: str, job_id: str) -> bool:
        entry = self.nodes.get(node)
        return entry is not None and job_id in entry.jobs
