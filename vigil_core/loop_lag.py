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
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

INTERVAL_S = 0.1
BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

T = TypeVar("T")


class Lateness:
    """One loop's lateness so far, once ``watch`` runs on it."""

    def __init__(self) -> None:
        self.total_s = 0.0  # the ticks' lateness, added up
        self._due: float | None = None  # the tick now awaited

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
                observe(lag)
        finally:
            self._due = None

    def own_time(self) -> float:
        """The running loop's clock less its lateness: it stands still while the loop runs late."""
        now = asyncio.get_running_loop().time()
        pending = max(0.0, now - self._due) if self._due is not None else 0.0  # a tick due, not yet run
        return now - self.total_s - pending


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
