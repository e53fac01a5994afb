"""How fast agents may say Hello: a fleet coming back at once is given turns, not a stampede. Pure.

After a controller restart or a failover every agent reconnects within a second or two. Past what the
controller can answer, their streams fail and each agent backs off on its own (full jitter, up to
10 s), so 100,000 agents keep trying about 20,000 times a second: the retries themselves become
the load, and the fleet takes minutes to come back. Instead the gateway admits Hellos at a steady
rate (with a burst for the usual few), and gives each agent it turns away a turn of its own: its
``RESOURCE_EXHAUSTED`` carries ``vigil-retry-after-ms``, the time of a slot reserved for it, the
slots one rate interval apart. An agent that comes back at its turn is admitted without waiting
again; one that never comes back leaves its slot unused. So a fleet of N comes back in about N /
rate seconds, in about two tries each.
"""

from __future__ import annotations

import math
from collections import deque

EARLY_S = 0.005  # how early a turn may be taken
SLOT_KEPT_S = 30.0  # a turn not taken within this long after its time is given up


def turn_ms(wait_s: float) -> int:
    """A turn as said on the wire (``vigil-retry-after-ms``): whole milliseconds, rounded up, never 0
    (which says no turn at all: an agent would back off on its own instead)."""
    return max(1, math.ceil(wait_s * 1000))


class HelloPacing:
    def __init__(self, per_s: float, burst: int) -> None:
        self._interval = 1.0 / per_s
        self._window = burst * self._interval  # how far ahead of now the schedule may run (a burst's worth)
        self._early = min(EARLY_S, self._interval / 2)  # how early a turn may be taken: never a whole turn
        self._next = 0.0  # when the schedule is free again (the virtual clock of a GCRA)
        self._turns: dict[str, float] = {}  # node -> when its reserved turn comes
        self._expiry: deque[tuple[float, str]] = deque()  # (turn, node), in the order they were given

    @property
    def waiting(self) -> int:
        """Agents given a turn they have not taken yet."""
        return len(self._turns)

    def ask(self, node: str, now: float) -> float:
        """0: admit this Hello now; else how many seconds from now the node's turn comes (reserved)."""
        self._forget(now)
        turn = self._turns.get(node)
        if turn is not None:
            if now + self._early >= turn:  # its turn (or a hair before: the turn is said in whole ms)
                del self._turns[node]
                return 0.0
            return turn - now  # early: the same turn, not a new one
        if self._next - now <= self._window - self._interval:  # at most ``burst`` at once
            self._next = max(self._next, now) + self._interval
            return 0.0
        self._next += self._interval
        turn = self._next - self._window
        self._turns[node] = turn
        self._expiry.append((turn, node))
        return turn - now

    def _forget(self, now: float) -> None:
        """Turns long past, never taken (the agent gone, or admitted by another controller)."""
        while self._expiry and self._expiry[0][0] < now - SLOT_KEPT_S:
            turn, node = self._expiry.popleft()
            if self._turns.get(node) == turn:
                del self._turns[node]
