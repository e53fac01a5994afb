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
queued without one, in the order they said so, and the room has two lanes of its size each: the
urgent lane's places only ever go to such agents (and when it is full they take the other lane's
first). A room of one lane let a fault's Hello wait for a place among the fleet's: with the room
shrunk to its least by the fleet's slow answers, 100 agents with faults waiting through 4 relays
queued 3.3-5.8 s at P50 (up to 9.7 s) while 100,000 connected from nothing on PostgreSQL. With a
whole fleet's faults waiting (an XID storm) there are at most twice the room's Hellos at the
controller, never more.

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
    room: float = FIRST_ROOM  # Hellos at the controller at once, at most, in each lane
    _waiting: list[int] = field(default_factory=lambda: [0, 0])  # Hellos passed on, not answered yet: calm, urgent
    _urgent_at: set[Key] = field(default_factory=set)  # whose Hello at the controller took the urgent lane's place
    _called: dict[Key, bool] = field(default_factory=dict)  # agents called: a place kept for each (urgent lane's?)
    _called_n: list[int] = field(default_factory=lambda: [0, 0])  # how many, per lane: calm, urgent
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
        """How many Hellos may be at the controller at once now in each lane (places kept for those
        called among them)."""
        return max(self.min_waiting, int(self.room))

    @property
    def waiting(self) -> int:
        """Hellos passed on and not answered yet, both lanes."""
        return self._waiting[0] + self._waiting[1]

    @property
    def waiting_urgent(self) -> int:
        """Those of them in the urgent lane's places."""
        return self._waiting[1]

    @property
    def queued(self) -> int:
        return len(self._queued)

    @property
    def queued_urgent(self) -> int:
        """Queued agents with faults waiting."""
        return len(self._hurried)

    def _free(self, urgent: bool) -> int:
        return self.size - self._waiting[urgent] - self._called_n[urgent]

    def _ahead(self, lane: deque[Key]) -> bool:
        """Whether an agent is queued in ``lane`` (those that left, or were called from the other
        lane, dropped from its head)."""
        while lane and lane[0] not in self._queued:
            lane.popleft()
        return bool(lane)

    def _uncall(self, key: Key) -> bool | None:
        """``key``'s kept place given up (taken, or its agent gone): which lane's it was, None if none."""
        lane = self._called.pop(key, None)
        if lane is not None:
            self._called_n[lane] -= 1
        return lane

    def say(self, key: Key, urgent: bool = False) -> bool:
        """An agent's Hello (``urgent``: with faults waiting): True when it goes on to the controller
        now (its place kept if it was called, else a free one, with no agent queued before it, urgent
        ones before an urgent one); False when it is queued (told to wait). An urgent Hello takes a
        place in the urgent lane, or, with none free there, in the other: the fleet's Hellos never
        fill the places a fault's Hello goes on in."""
        if (kept := self._uncall(key)) is not None:
            self._pass_on(key, kept)
            return True
        if urgent and not self._ahead(self._urgent):
            for lane in (True, False):
                if self._free(lane) > 0:
                    self._pass_on(key, lane)
                    return True
        elif not urgent and not (self._ahead(self._urgent) or self._ahead(self._queue)) and self._free(False) > 0:
            self._pass_on(key, False)
            return True
        self._enqueue(key, urgent)
        self._span_busy = True
        return False

    def _pass_on(self, key: Key, urgent_lane: bool) -> None:
        self._waiting[urgent_lane] += 1
        if urgent_lane:
            self._urgent_at.add(key)

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
        self._waiting[False] += 1

    def answered(self, key: Key, now: float, waited_s: float) -> list[Key]:
        """``key``'s Hello at the controller was answered after ``waited_s``. The agents to call now."""
        self._over(key)
        self._span_answers += 1
        self._span_waited_s += waited_s
        self._measure(now)
        return self._call()

    def dropped(self, key: Key) -> list[Key]:
        """``key``'s Hello at the controller will not be answered (its stream ended first): its place
        is free. The agents to call now."""
        self._over(key)
        return self._call()

    def _over(self, key: Key) -> None:
        lane = key in self._urgent_at
        self._urgent_at.discard(key)
        self._waiting[lane] = max(0, self._waiting[lane] - 1)

    def left(self, key: Key) -> list[Key]:
        """An agent's call ended (queued, called or neither): its place, if kept, is free. The
        agents to call now."""
        self._queued.discard(key)
        self._hurried.discard(key)
        self._uncall(key)
        return self._call()

    def lost(self) -> None:
        """The controller was lost: the time without it is not time it answered nothing."""
        self._span_start, self._span_answers, self._span_waited_s, self._span_busy = None, 0, 0.0, False

    def _call(self) -> list[Key]:
        """The queued agents called to the places free: the urgent lane's to those with faults
        waiting, then the other's to them first and then to the rest, each in turn."""
        calling: list[Key] = []
        for urgent_lane in (True, False):
            free = self._free(urgent_lane)
            while free > 0 and (lane := self._urgent if urgent_lane else (self._urgent or self._queue)):
                key = lane.popleft()
                if key in self._queued:  # else it left while queued, or was called from the other lane
                    self._queued.discard(key)
                    self._hurried.discard(key)
                    self._called[key] = urgent_lane
                    self._called_n[urgent_lane] += 1
                    calling.append(key)
                    free -= 1
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
