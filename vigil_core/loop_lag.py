"""How late an event loop runs what is due on it: what every task on it waits besides its own work.

A tick every ``INTERVAL_S``; how much later than due it ran is observed. A relay's bounds on its
agents (a first Hello, a Hello again: ``first_message_s``) run on its loop, so beside them the lag
says whether a late agent was late or the relay was (its collector, its CPU).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

INTERVAL_S = 0.1
BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


async def watch(observe: Callable[[float], None], interval_s: float = INTERVAL_S) -> None:
    """Observe each tick's lateness, in seconds, until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        observe(max(0.0, loop.time() - due))
