"""Quarantines' urgent parts before their records.

A Kubernetes quarantine is a cordon (what the scheduler acts on) and a record (the node's condition,
an Event). In a burst the controller's CPU is what paces the writes, so a record written between two
cordons puts off the next node's cordon. The action runner therefore holds a quarantine's record
until no quarantine's urgent part waits or runs and none has begun for ``quiet_s`` (a burst arrives
in waves, as its signals are decided), or ``longest_s`` at most: put off, never left out. A
quarantine that no other followed writes its record at once: a lone fault's record is not delayed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

QUIET_S = 1.0
LONGEST_S = 10.0


class UrgentLane:
    def __init__(
        self, quiet_s: float = QUIET_S, longest_s: float = LONGEST_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.quiet_s, self.longest_s, self.clock = quiet_s, longest_s, clock
        self._begun = 0  # urgent parts begun, ever: a ticket is the count when its own began
        self._running = 0  # urgent parts begun and not ended (waiting for the rate limit, or under way)
        self._last_begun_at = 0.0
        self._none_running = asyncio.Event()
        self._none_running.set()

    def begin(self) -> int:
        """An urgent part begins; returns its ticket."""
        self._begun += 1
        self._running += 1
        self._last_begun_at = self.clock()
        self._none_running.clear()
        return self._begun

    def end(self) -> None:
        self._running -= 1
        if not self._running:
            self._none_running.set()

    def may_record(self, ticket: int) -> bool:
        """Whether the record of the urgent part ``ticket`` (ended) may be written now."""
        if self._running:
            return False
        return self._begun == ticket or self.clock() - self._last_begun_at >= self.quiet_s

    async def after_urgent(self, ticket: int) -> None:
        """Wait until the record of the urgent part ``ticket`` may be written, ``longest_s`` at most."""
        deadline = self.clock() + self.longest_s
        while not self.may_record(ticket) and (left := deadline - self.clock()) > 0:
            if self._running:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._none_running.wait(), left)
            else:
                await asyncio.sleep(min(left, self._last_begun_at + self.quiet_s - self.clock()))
