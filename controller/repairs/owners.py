"""Who else holds a node, for the repairs waiting on it: read from the cluster off the event loop,
one reading at a time per node, while the repair waits ("the node is being read from the cluster").

A reading serves the first tick after the one that asked for it, however late that tick runs. It
is judged by ticks, not by its age on a clock: a bound of a few seconds on its age found every
reading stale when the repairs' tick ran late (a loaded controller: a tick a second, each later
than the bound after the reading came back), asked again, and the repair waited for as long as the
load lasted. The step reads the cluster once more right before it acts (``steps.Steps``): this
reading only says whether to start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from controller.repairs.steps import NodeOwners
from vigil_core.supervise import Tasks

BEING_READ = "the node is being read from the cluster"


def fresh(read_at: float | None, last_tick: float) -> bool:
    """Whether a reading taken at ``read_at`` may serve the tick running now: taken since the tick
    before it began (``last_tick``). Pure."""
    return read_at is not None and read_at >= last_tick


class OwnerReadings:
    def __init__(self, owners: NodeOwners, tasks: Tasks, clock: Callable[[], float]) -> None:
        self._owners = owners
        self._tasks = tasks
        self._clock = clock
        self._seen: dict[str, tuple[float, str]] = {}  # node -> (when read, who else holds it)
        self._reading: set[str] = set()
        self._last_tick = float("-inf")  # when the tick before this one began

    def tick(self, now: float) -> None:
        """A tick of the repairs begins at ``now``: readings taken before the last one are stale."""
        self._seen = {n: s for n, s in self._seen.items() if fresh(s[0], self._last_tick)}
        self._last_tick = now

    def held_by_others(self, node: str) -> str:
        """Who else holds the node ('' when nobody) as read since the last tick; otherwise a reading
        is asked for (one at a time), and meanwhile ``BEING_READ``."""
        if (seen := self._seen.get(node)) is not None:  # the stale ones went at this tick's start
            return seen[1]
        if node not in self._reading:
            self._reading.add(node)
            self._tasks.watch("repair-owner", asyncio.get_running_loop().create_task(self._read(node)))
        return BEING_READ

    async def _read(self, node: str) -> None:
        try:
            found = await asyncio.to_thread(self._owners.held_by_others, node)
        except Exception as exc:  # the API server away: the repair waits, and says why
            found = f"cannot read the node: {exc!r}"[:200]
        finally:
            self._reading.discard(node)
        self._seen[node] = (self._clock(), found)
