"""Rarer young collections for a process that carries a large, long-lived fleet (a controller or a
relay with 100,000 agents), so that what an agent's message makes dies young instead of being
counted long-lived.

CPython collects its youngest generation every 700 new container objects and moves what survives
two young collections into the oldest generation; each time that grows by a quarter, a full
collection walks every object the process holds (about 1.8 million in the controller at 100,000
nodes: a second and more on a loaded machine, the event loop and every agent's stream stopped).
What a message makes lives for milliseconds to a second (its decoding, the tasks and futures that
carry it, the store's group commit): at 700 it outlives two young collections, and the full
collections came every minute or two at 100,000 nodes under 500 signals a second, each a late probe.
At ``YOUNG_OBJECTS`` it dies young. Measured with ``bench.scale`` at 100,000 through 8 relays (one
run each, docs/scale-history.md): the controller's collections while connecting 24-40 s → 3.9-4.3 s, none
of them full, and no full collection in two minutes under 500 signals a second; each relay's
18-29 s → 3-7 s. A young collection walks more at a time (the longest pause seen 0.6-2.6 s against
3.3-6.2 s).

Process-wide: a process's entry point calls ``set_young``, never a test that runs a controller or
a relay inside its own process.
"""

from __future__ import annotations

import gc

import structlog

log = structlog.get_logger(__name__)

YOUNG_OBJECTS = 50_000  # new container objects between young collections (CPython's own: 700)


def set_young(objects: int, say: bool = True) -> None:
    """Collect the youngest generation every ``objects`` new container objects (0: CPython's own);
    the older generations' thresholds stay as they are. ``say``: in the process's log (not where its
    stdout is something else's, as a benchmark's simulator process)."""
    if objects <= 0:
        return
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(objects, middle, oldest)
    if say:
        log.info("gc_young_objects", threshold=gc.get_threshold())
