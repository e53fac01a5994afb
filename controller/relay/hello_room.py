"""A relay's room for Hellos at the controller, and the agents waiting their turn for it (pure:
the caller says the time).

An agent waits for the answer to its Hello 10 s at first (``agent.link.hello_patience_s``), then
gives up, cancels its stream and reconnects, which costs the controller and the relay more. When a
whole fleet says Hello at once (a rollout, a controller restart) the controller answers a few
thousand a second, and a relay that passed every Hello on at once left most of them waiting past
that patience (measured at 100,000 nodes: 10-13 s on average at the relays).

So a relay keeps only so many Hellos at the controller at once, its room, and sizes the room by
how long the Hellos there wait for their answer: over each span of a second or more, a mean wait
past ``wait_s`` shrinks the room in proportion, and a span in which agents were queued with the
answers coming sooner grows it by a quarter (never under ``min_waiting``). An agent that can say
Hello again on its stream (``Hello.resumable``) whose Hello finds no room is queued: told to wait
(``HelloAgain{wait}``: an answer, so its patience is not running), or, where the relay keeps its
Hello, told nothing (its call not said taken, its patience has not begun); each time a Hello at
the controller is answered, or given up, the next agent in the queue is called (``HelloAgain{}``,
or its kept Hello passed on), its place kept for it until its Hello comes. No rate decides when an
agent comes back: a place coming free does, so the controller is kept as busy as the room allows.

A fault waits behind no fleet: an agent whose Hello says it has faults waiting
(``Hello.urgent_waiting``), or that says so while queued (``hurry``), is called before every agent
queued without one, in the order they said so.

A first version sized the room by the rate the controller took Hellos while agents were queued;
but the time a called agent takes to say its Hello is part of that rate, so on a loaded machine the
measured rate fell, the room with it, and the rate again (100,000 agents that wait on connected in
87.5 s through it, 57.0-57.4 s with every Hello passed on at once). The wait at the controller is
what the agent's patience is spent on, and what the room now answers to.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

WAIT_S = 2.5  # what a Hello passed on should wait for its answer (the agent's patience: 10 s)
MIN_WAITING = 50  # never room for fewer Hellos at once than this
FIRST_ROOM = 1000.0  # until sized by the waits (at 100,000 nodes a busy controller takes about 1,750 a second)
MAX_ROOM = 100_000.0
SPAN_S = 1.0  # the room is sized over spans at least this long
GROWTH = 1.25  # per span in which agents were queued and the Hellos waited less than wait_s

Key = TypeVar("Key", bound=Hashable)


@dataclass
class HelloRoom(Generic[Key]):
    wait_s: float = WAIT_S
    min_waiting: int = MIN_WAITING
    room: float = FIRST_ROOM  # Hellos at the controller at once, at most
    waiting: int = 0  # Hellos passed on, not answered yet
    _called: set[Key] = field(default_factory=set)  # agents called: a place kept for each until its Hello
    _queue: deque[Key] = field(default_factory=deque)  # agents told to wait, in the order they came
    _urgent: deque[Key] = field(default_factory=deque)  # those with faults waiting: called first
    _hurried: set[Key] = field(default_factory=set)  # the queued ones among them
    _queued: set[Key] = field(default_factory=set)  # the same, for finding one (one that left is skipped)
    _span_start: float | None = None
    _span_answers: int = 0
    _span_waited_s: float = 0.0
    _span_busy: bool = False  # an agent was queued during the span

    @property
    def size(self) -> int:
        """How many Hellos may be at the controller at once now (places kept for those called among them)."""
        return max(self.min_waiting, int(self.room))

    @property
    def queued(self) -> int:
        return len(self._queued)

    @property
    def queued_urgent(self) -> int:
        """Queued agents with faults waiting."""
        return len(self._hurried)

    def _free(self) -> int:
        return self.size - self.waiting - len(self._called)

    def say(self, key: Key, urgent: bool = False) -> bool:
        """An agent's Hello (``urgent``: with faults waiting): True when it goes on to the controller
        now (its place kept if it was called, else a free one, with no agent queued before it, urgent
        ones before an urgent one); False when it is queued (told to wait)."""
        ahead = self._urgent if urgent else (self._urgent or self._queue)
        if key not in self._called and (ahead or self._free() <= 0):
            self._enqueue(key, urgent)
            self._span_busy = True
            return False
        self._called.discard(key)
        self.waiting += 1
        return True

    def queue(self, key: Key, urgent: bool = False) -> list[Key]:
        """An agent that must say Hello again (its controller lost and reached again) takes its place
        in the queue (``urgent``: with those that have faults waiting); the agents to call now (it among
        them when there is room)."""
        self.line_up(key, urgent)
        return self._call()

    def line_up(self, key: Key, urgent: bool = False) -> None:
        """As ``queue``, calling nobody yet (``call``): a whole fleet asked again at once lines up first,
        so that the places free go to those with faults waiting, not to whoever came first."""
        if key not in self._called:
            self._enqueue(key, urgent)

    def call(self) -> list[Key]:
        """The agents to call now, as places are free."""
        return self._call()

    def hurry(self, key: Key) -> list[Key]:
        """A queued agent has faults waiting now: it goes on to the urgent agents' end of the queue
        (nothing for one not queued). The agents to call now."""
        self._hurry(key)
        return self._call()

    def _hurry(self, key: Key) -> None:
        if key in self._queued and key not in self._hurried:
            self._urgent.append(key)  # its place in the other lane is skipped once it is called
            self._hurried.add(key)

    def _enqueue(self, key: Key, urgent: bool) -> None:
        if key not in self._queued:  # once, however often it says Hello while queued
            self._queued.add(key)
            self._queue.append(key)
        if urgent:
            self._hurry(key)

    def send_anyway(self) -> None:
        """A Hello that goes on whatever the room (an agent that cannot be told to wait)."""
        self.waiting += 1

    def answered(self, now: float, waited_s: float) -> list[Key]:
        """A Hello at the controller was answered after ``waited_s``. The agents to call now."""
        self.waiting = max(0, self.waiting - 1)
        self._span_answers += 1
        self._span_waited_s += waited_s
        self._measure(now)
        return self._call()

    def dropped(self) -> list[Key]:
        """A Hello at the controller will not be answered (its stream ended first): its place is
        free. The agents to call now."""
        self.waiting = max(0, self.waiting - 1)
        return self._call()

    def left(self, key: Key) -> list[Key]:
        """An agent's call ended (queued, called or neither): its place, if kept, is free. The
        agents to call now."""
        self._queued.discard(key)
        self._hurried.discard(key)
        self._called.discard(key)
        return self._call()

    def lost(self) -> None:
        """The controller was lost: the time without it is not time it answered nothing."""
        self._span_start, self._span_answers, self._span_waited_s, self._span_busy = None, 0, 0.0, False

    def _call(self) -> list[Key]:
        calling: list[Key] = []
        while (lane := self._urgent or self._queue) and self._free() > 0:
            key = lane.popleft()
            if key in self._queued:  # else it left while queued, or was called from the other lane
                self._queued.discard(key)
                self._hurried.discard(key)
                self._called.add(key)
                calling.append(key)
        return calling

    def _measure(self, now: float) -> None:
        if self._span_start is None:
            self._span_start, self._span_answers, self._span_waited_s = now, 0, 0.0
            return
        if now - self._span_start < SPAN_S:
            return
        mean_s = self._span_waited_s / self._span_answers
        busy = self._span_busy or bool(self._queue)
        if mean_s > self.wait_s:  # past what it should wait: a room as much smaller (not under half at once)
            self.room = max(float(self.min_waiting), self.room * max(0.5, self.wait_s / mean_s))
        elif busy:  # agents waited for room the controller could have taken
            self.room = min(MAX_ROOM, self.room * GROWTH)
        self._span_start, self._span_answers, self._span_waited_s, self._span_busy = now, 0, 0.0, False


@dataclass(frozen=True, slots=True)
class Place:
    """What the relay says to an agent's call about its Hello's place: queued (told to wait) or
    called (to say Hello now, its place kept)."""

    called: bool
