"""How late an event loop runs what is due on it: what every task on it waits besides its own work,
and a clock that leaves that lateness out, for the bounds a server holds its peers to.

A tick every ``INTERVAL_S``; how much later than due it ran is observed and added up. A server's
bounds on a peer (an agent's first Hello, its Hello again: ``first_message_s``) run on its loop: kept
on the loop's clock, a loop held by its own garbage collector or starved of CPU would find the peer
late when it was itself, and end a stream whose message had long arrived (turning an overload into
reconnections, which add to it). Kept on ``Lateness.own_time`` (the loop's clock less the lateness
observed, and less the lateness of a tick due and not yet run), such a bound counts only the time
the server was there to read: a peer is late only by time it had. A loop not watched keeps its plain
clock (``own_time`` is then ``loop.time()``).

Judgments made on a tick from wall-clock times (a node silent since its last heartbeat, a job hung
since its last step) ask ``late_since(t)``: how long the loop has been held since that time, what
was waiting to be read meanwhile. The late ticks of the last ``HORIZON_S`` are kept for it, with when
they ran (a tick later than ``KEPT_LATE_S``; the lateness before the horizon is not excused).
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

INTERVAL_S = 0.1
# A tick overdue this long: the loop is stuck in one step, not late (the longest garbage collection
# seen with 100,000 agents connecting on 2 cores held a loop about 4 s). What ``/livez`` says.
STUCK_S = 120.0
BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
KEPT_LATE_S = 0.01  # a tick later than this is kept for late_since (an idle loop's are well under it)
HORIZON_S = 3600.0  # how far back late_since can see (a hung job's pause limit)

T = TypeVar("T")

log = structlog.get_logger(__name__)


class Lateness:
    """One loop's lateness so far, once ``watch`` runs on it."""

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self.total_s = 0.0  # the ticks' lateness, added up
        self._due: float | None = None  # the tick now awaited
        self._wall = wall
        # The late ticks of the last HORIZON_S: when each ran (wall clock), and the lateness kept up to it.
        self._ran: list[float] = []
        self._kept: list[float] = []

    async def watch(self, observe: Callable[[float], None] = lambda _: None, interval_s: float = INTERVAL_S) -> None:
        """Tick until cancelled; each tick's lateness, in seconds, is added and observed."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._due = due = loop.time() + interval_s
                await asyncio.sleep(interval_s)
                lag = max(0.0, loop.time() - due)
                self.total_s += lag
                self._due = None
                if lag > KEPT_LATE_S:
                    self._keep(lag)
                observe(lag)
        finally:
            self._due = None

    def _keep(self, lag: float) -> None:
        now = self._wall()
        self._ran.append(now)
        self._kept.append((self._kept[-1] if self._kept else 0.0) + lag)
        if self._ran[0] < now - 2 * HORIZON_S:  # now and then, not every tick
            gone = bisect.bisect_left(self._ran, now - HORIZON_S)
            del self._ran[:gone], self._kept[:gone]

    def late_since(self, t: float) -> float:
        """How long the loop has been held since wall-clock time ``t``: the late ticks that ran after
        it (a tick ``lag`` late at ``ran`` held the loop from ``ran - lag``), and a tick due and not
        yet run. 0 for a loop not watched."""
        now, held = self._wall(), 0.0
        if self._due is not None and (pending := self._overdue(asyncio.get_running_loop().time())) > 0:
            held += min(pending, max(0.0, now - t))
        first = bisect.bisect_right(self._ran, t)
        if first < len(self._ran):
            before = self._kept[first - 1] if first else 0.0
            lag = self._kept[first] - before
            held += min(lag, self._ran[first] - t) + (self._kept[-1] - self._kept[first])
        return held

    def held_now_s(self) -> float:
        """How long the tick now due has been overdue (0: none is, or the loop is not watched); read
        from any thread (the liveness probe's): a loop stuck in one step reads ever longer. The
        loop's clock is ``time.monotonic`` (asyncio's own)."""
        return self._overdue(time.monotonic())

    def own_time(self) -> float:
        """The running loop's clock less its lateness: it stands still while the loop runs late."""
        now = asyncio.get_running_loop().time()
        return now - self.total_s - self._overdue(now)

    def _overdue(self, now: float) -> float:
        """How long the tick due has been overdue at ``now`` (the loop's clock): 0 when none is."""
        due = self._due
        return max(0.0, now - due) if due is not None else 0.0


def stuck(lateness: Lateness, bound_s: float = STUCK_S) -> list[str]:
    """The liveness probe's word on a loop (``vigil_core.http_status``'s ``/livez``): one step has
    held it past ``bound_s``, so nothing on it runs (no signal sent or acted on, no Hello answered)
    while the process looks alive; restarted, it comes back (an agent's spool, a controller's store
    and its Lease keep what it held). Empty when it runs."""
    held = lateness.held_now_s()
    if held <= bound_s:
        return []
    log.error("event_loop_stuck", held_s=round(held), bound_s=bound_s)  # each probe's 503, until restarted
    return [f"the event loop has not run for {held:.0f} s (one step stuck in it; the bound is {bound_s:g} s)"]


def loop_time() -> float:
    """The running loop's plain clock: the own time of a loop nobody watches."""
    return asyncio.get_running_loop().time()


async def watch(observe: Callable[[float], None], interval_s: float = INTERVAL_S) -> None:
    """Observe each tick's lateness, in seconds, until cancelled."""
    await Lateness().watch(observe, interval_s)


async def within(awaitable: Awaitable[T], bound_s: float, clock: Callable[[], float]) -> T:
    """The awaitable's result, if it comes before ``bound_s`` has passed on ``clock`` (a loop's
    ``own_time``); else TimeoutError, the awaitable cancelled. Waited on the loop's clock in steps,
    each as long as what is left of the bound on ``clock``."""
    task = asyncio.ensure_future(awaitable)
    start = clock()
    try:
        while not task.done() and (left := bound_s - (clock() - start)) > 0:
            await asyncio.wait((task,), timeout=left)
        if task.done():  # come in time, or with the bound's end: taken either way
            return task.result()
        raise TimeoutError
    finally:
        if not task.done():
            task.cancel()
