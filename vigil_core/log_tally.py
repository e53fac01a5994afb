"""An event said on a line of its own up to ``per_s`` times a second; past that, the rest of the
second counted and said on one line, with a few of their names.

A fleet that connects at once (a controller restart, a relay's stream lost and found) is 100,000
``agent_connected`` lines in a minute: about a sixth of the controller's time while 100,000 agents
connected through relays was spent writing them (``bench.scale``, sampled), and a log that size
tells an operator nothing one line a second would not. One agent reconnecting is still one line.

``Tally`` is the rule (pure: the caller says the time); ``TalliedEvent`` says the lines, the
second's remainder once that second is over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SECOND = 1.0
PER_S = 20  # lines of their own a second, by default


@dataclass(frozen=True, slots=True)
class Unsaid:
    """What a second left unsaid: how many, and the first few names."""

    count: int
    names: tuple[str, ...]


@dataclass
class Tally:
    per_s: int = PER_S
    examples: int = 5
    _start: float | None = None  # the second now counted began
    _said: int = 0
    _unsaid: int = 0
    _names: list[str] = field(default_factory=list)

    def note(self, now: float, name: str) -> tuple[bool, Unsaid | None]:
        """One occurrence at ``now``: whether it gets a line of its own, and what the second before
        it left unsaid, to say first (None: nothing)."""
        left = None
        if self._start is None or now - self._start >= SECOND:
            left = self.take()
            self._start, self._said = now, 0
        if self._said < self.per_s:
            self._said += 1
            return True, left
        self._unsaid += 1
        if len(self._names) < self.examples:
            self._names.append(name)
        return False, left

    def take(self) -> Unsaid | None:
        """What is unsaid so far, taken to be said (None: nothing)."""
        if not self._unsaid:
            return None
        left = Unsaid(self._unsaid, tuple(self._names))
        self._unsaid, self._names = 0, []
        return left


class TalliedEvent:
    """``event`` said through ``say`` (a structlog method: ``log.info``) by ``Tally``'s rule: each
    occurrence as ``event`` with ``node`` and its fields, the rest of a busy second as
    ``<event>_more`` with ``count`` and ``nodes`` (a few), once the second is over."""

    def __init__(
        self, say: Callable[..., Any], event: str, per_s: int = PER_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._say, self.event = say, event
        self._tally = Tally(per_s)
        self._clock = clock
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self, node: str, **fields: Any) -> None:
        own, left = self._tally.note(self._clock(), node)
        if left is not None:  # the second before is over: its remainder now, its timer no longer needed
            self._cancel()
            self._say_unsaid(left)
        if own:
            self._say(self.event, node=node, **fields)
            return
        if self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(SECOND, self.flush)
            except RuntimeError:  # no event loop to wait on: said now rather than never
                self.flush()

    def flush(self) -> None:
        """Say what is unsaid now (the second it belongs to is over, or the process stops)."""
        self._cancel()
        if (left := self._tally.take()) is not None:
            self._say_unsaid(left)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _say_unsaid(self, left: Unsaid) -> None:
        self._say(f"{self.event}_more", count=left.count, nodes=list(left.names))
