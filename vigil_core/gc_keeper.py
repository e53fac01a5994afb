"""Short garbage collections in a process that carries a large, long-lived fleet (a controller or a
relay with 100,000 agents): what survives a full collection is frozen, and thawed again when enough
of it may have become garbage.

CPython's full collection walks every object the process holds, and runs each time the long-lived
objects grew by a quarter: while 100,000 agents connect, each collection walks all of those connected
so far, and stops the event loop (every agent's stream with it) for seconds. Objects that survived a
full collection are the fleet's sessions, which live as long as their agents stay connected; frozen
(``gc.freeze``), the collector leaves them out, so the next full collection walks only what is new.

The price: a frozen object that becomes garbage inside a reference cycle (a session that ended, with
its stream's objects pointing at one another) is not freed until it is thawed. Objects that are not
in a cycle are freed as ever, by their reference counts. So the keeper thaws (``gc.unfreeze``) and
collects everything once when the sessions that ended since the last such collection reach
``thaw_ended`` of those open (a quarter by default: a fleet that reconnects costs one long collection
per quarter of it, as CPython's own rule would), or ``thaw_every_s`` after it in any case, and freezes
what survives again. A fleet that stays connected is never walked whole again.

Neither while sessions end in numbers (more than ``calm_ended`` of those open over ``calm_s``: a
controller restarting, a relay's stream to it lost, agents reconnecting), nor while the collector
finds more than ``calm_garbage`` objects of garbage in cycles over ``calm_s`` (streams refused before
they were sessions end none, but leave their calls' cycles): what lives then may be garbage in
seconds, and frozen it would wait for a thaw; and a walk of everything then would stop the process
while its agents need it most. The collector runs as CPython's own meanwhile, over what is not
frozen; the keeper thaws once it is calm again.

Experimental, off by default (``limits.gc_freeze``, ``vigil relay --gc-freeze``). Measured with
``bench.scale``: freezing after every full collection (the first rule, without the calm) cut the
collector's time while 20,000 agents connected from 8.2-8.8 s to 2.7 s (longest pause 0.9-1.2 s to
0.2 s), and at 100,000 through 8 relays the longest pause from 4.2 s to 0.28 s in the controller;
but a controller restart then thawed in the middle of the reconnection (17 s in the controller,
freeing nothing; 38 s in a relay, freeing 1.6 million objects the storm had left frozen). With the
sessions' calm alone the relays froze the storm's refused streams (3.3 million objects each) and the
restart had not finished after 14 minutes. With the garbage's calm too, a 20,000-agent connection
makes about five objects of cyclic garbage per agent, over ``calm_garbage``, and little is frozen.
docs/design.md says what is left to measure before it is on.

``decide`` is the pure rule; ``keep`` runs it on the event loop once a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import structlog

from vigil_core import gc_pauses

log = structlog.get_logger(__name__)

FULL = 2  # the oldest generation: a full collection


class Move(Enum):
    NOTHING = "nothing"
    FREEZE = "freeze"  # a full collection ran since the last freeze: what survived it is long-lived
    THAW = "thaw"  # enough may have become garbage among what is frozen: collect everything once


@dataclass(frozen=True, slots=True)
class KeeperConfig:
    thaw_ended: float = 0.25  # sessions ended since the last full walk, as a share of those open
    thaw_min_ended: int = 1_000  # below this many ended, never thaw for them (a small fleet's churn)
    thaw_every_s: float = 6 * 3600.0  # and at least this often
    calm_s: float = 30.0  # neither while sessions end faster than this, over this long:
    calm_ended: float = 0.10  # as a share of those open
    calm_min_ended: int = 100  # (a small fleet's churn is calm)
    calm_garbage: int = 20_000  # nor while the collector finds more garbage in cycles than this over calm_s


@dataclass(frozen=True, slots=True)
class Seen:
    """What the keeper reads each time: full collections so far, the sessions open now and ended so
    far (counters of the process), those ended and the garbage in cycles the collector found over the
    last ``calm_s``, and the time."""

    full_collections: int
    open_sessions: int
    ended_sessions: int
    ended_recently: int
    garbage_recently: int
    now: float


@dataclass(frozen=True, slots=True)
class Last:
    """What the keeper did last: the full collections counted at its last freeze, and the ended
    sessions counted and the time at its last walk of everything (a thaw, or its start)."""

    frozen_at_collections: int
    walked_at_ended: int
    walked_at: float


def decide(seen: Seen, last: Last, config: KeeperConfig) -> Move:
    """Thaw when enough may be garbage among the frozen; else freeze after a full collection; neither
    while sessions are ending in numbers (a reconnection storm): what lives then may be dead in
    seconds, and walking everything then stops the process when its agents need it most. Pure."""
    if seen.ended_recently > max(config.calm_min_ended, config.calm_ended * seen.open_sessions):
        return Move.NOTHING
    if seen.garbage_recently > config.calm_garbage:  # cycles made and dropped now: frozen, they would stay
        return Move.NOTHING
    ended = seen.ended_sessions - last.walked_at_ended
    if ended >= max(config.thaw_min_ended, config.thaw_ended * seen.open_sessions):
        return Move.THAW
    if seen.now - last.walked_at >= config.thaw_every_s:
        return Move.THAW
    if seen.full_collections > last.frozen_at_collections:
        return Move.FREEZE
    return Move.NOTHING


def full_collections() -> int:
    """Full collections this process ran so far (``gc_pauses`` counts them)."""
    return gc_pauses.seen().get(FULL, (0, 0.0, 0.0))[0]


async def keep(
    sessions: Callable[[], tuple[int, int]],
    stop: asyncio.Event,
    config: KeeperConfig | None = None,
    every_s: float = 1.0,
) -> None:
    """Until ``stop``: freeze after each full collection, thaw as ``decide`` says. ``sessions``: the
    sessions open now and ended so far. For a process's entry point: freezing is process-wide."""
    config = config or KeeperConfig()
    gc_pauses.install()
    last = Last(full_collections(), sessions()[1], time.monotonic())
    history: deque[tuple[float, int, int]] = deque()  # (when, ended, garbage so far), over the last calm_s
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)
        if stop.is_set():
            return
        open_now, ended, now, garbage = *sessions(), time.monotonic(), gc_pauses.collected()
        history.append((now, ended, garbage))
        while history[0][0] < now - config.calm_s:
            history.popleft()
        seen = Seen(full_collections(), open_now, ended, ended - history[0][1], garbage - history[0][2], now)
        match decide(seen, last, config):
            case Move.FREEZE:
                gc.collect(1)  # the young generations' garbage first (short), so it is not frozen
                gc.freeze()
                last = Last(full_collections(), last.walked_at_ended, last.walked_at)
                log.debug("gc_frozen", frozen=gc.get_freeze_count())
            case Move.THAW:
                began, thawed = time.perf_counter(), gc.get_freeze_count()
                gc.unfreeze()
                freed = gc.collect()
                gc.freeze()
                log.info("gc_thawed", thawed=thawed, freed=freed, frozen=gc.get_freeze_count(),
                         ended_since=ended - last.walked_at_ended, open_sessions=open_now,
                         took_s=round(time.perf_counter() - began, 3))  # fmt: skip
                last = Last(full_collections(), ended, time.monotonic())
            case Move.NOTHING:
                pass
