"""A relay's Hellos to the controller, and the turns it gives the rest (pure: the caller says the time).

An agent waits for the answer to its Hello 10 s at first (``agent.link.hello_patience_s``), then
gives up, cancels its stream and reconnects, which costs the controller more. When a whole fleet
says Hello at once (a rollout, a controller restart) the controller answers a few thousand a
second, and a relay that passed every Hello on at once would leave most of them waiting past that
patience: measured at 100,000 nodes, 10-13 s on average, and agents that give up took three to
seven times as long to connect as agents that wait on.

So a relay keeps only as many Hellos waiting for the controller as it answers in ``wait_s`` (at
the rate it has been answering them here, never fewer than ``min_waiting``), and answers every
other Hello of an agent that can say Hello again on its stream (``Hello.resumable``) itself, with a
``HelloAgain`` at a turn: the turns are handed out one after another at that rate, in the order the
Hellos came, so that an agent comes back about when there is room for it. An agent that is given a
turn has had its Hello answered (its patience starts again with the next one). A Hello that comes
back at its turn and still finds no room is given the next free turn, like any other.

The rate is measured only over seconds in which Hellos had to be turned away (the controller was
kept busy: what it answered is what it can answer); a quieter second can only raise it.
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST_RATE_PER_S = 400.0  # the rate assumed until one is measured (a fifth of a busy controller's at 100,000 nodes)
MIN_RATE_PER_S = 20.0
RATE_SPAN_S = 1.0  # the rate is measured over spans at least this long
MAX_TURN_S = 120.0  # no turn further off than this: the agent's next Hello is on the relay's own loop


@dataclass
class HelloTurns:
    wait_s: float = 2.5  # what a Hello sent on should wait for its answer (the agent's patience: 10 s)
    min_waiting: int = 50
    rate_per_s: float = FIRST_RATE_PER_S  # the controller's answers a second here, as measured
    waiting: int = 0  # Hellos sent on, not yet answered
    next_turn_at: float = 0.0  # the next free turn
    _span_start: float | None = None
    _span_answers: int = 0
    _span_full: bool = False  # a Hello was turned away during the span

    @property
    def room(self) -> int:
        """How many Hellos may wait for the controller at once now."""
        return max(self.min_waiting, int(self.rate_per_s * self.wait_s))

    def admit(self, now: float, returning: bool = False) -> bool:
        """Whether a Hello goes on to the controller now (then counted as waiting). A Hello that is
        not ``returning`` at a turn given also waits while turns given before it are still to come
        (it comes after them, not before)."""
        queued = not returning and self.next_turn_at > now
        if self.waiting < self.room and not queued:
            self.waiting += 1
            return True
        self._span_full = True
        return False

    def send_anyway(self) -> None:
        """A Hello that goes on whatever the room (an agent that cannot be given a turn)."""
        self.waiting += 1

    def turn_s(self, now: float) -> float:
        """The next free turn, in seconds from ``now``: each turn given takes the next one."""
        at = max(self.next_turn_at, now)
        self.next_turn_at = at + 1.0 / self.rate_per_s
        return min(at - now, MAX_TURN_S)

    def answered(self, now: float) -> None:
        """The controller took a waiting Hello (an Ack; a refusal is ``dropped``)."""
        self.waiting = max(0, self.waiting - 1)
        self._span_answers += 1
        self._measure(now)

    def dropped(self) -> None:
        """A waiting Hello was refused, or will not be answered (its stream ended first, or the
        controller was lost): its room is free, and it says nothing of the rate."""
        self.waiting = max(0, self.waiting - 1)

    def lost(self) -> None:
        """The controller was lost (said by each session it ended): the seconds without it are not
        counted as seconds it answered nothing."""
        self._span_start, self._span_answers, self._span_full = None, 0, False

    def _measure(self, now: float) -> None:
        if self._span_start is None:
            self._span_start = now
            return
        span = now - self._span_start
        if span < RATE_SPAN_S:
            return
        seen = self._span_answers / span
        if self._span_full:  # the controller was kept busy: this is what it answers
            self.rate_per_s = max(MIN_RATE_PER_S, 0.5 * self.rate_per_s + 0.5 * seen)
        else:  # fewer Hellos than it could answer: a lower bound
            self.rate_per_s = max(self.rate_per_s, seen)
        self._span_start, self._span_answers, self._span_full = now, 0, False


@dataclass(frozen=True, slots=True)
class Turn:
    """A Hello the relay answered itself: the agent says it again in ``ms`` milliseconds."""

    ms: int
