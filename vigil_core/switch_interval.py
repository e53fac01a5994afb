"""How long a thread runs Python before another that waits may take the interpreter, in a process
whose event loop does nearly all its work (the controller).

CPython hands the interpreter on every 5 ms (``sys.setswitchinterval``) when another thread waits
for it: in the controller those are the store's writer, the actions' threads (a cordon's PATCH)
and the Kubernetes watch, each holding it a moment and then waiting on a socket. On two cores
shared with 100,000 simulated agents, four relays and PostgreSQL, the controller's tail is its event
loop waiting for a CPU (docs/design.md, "Scale: one controller, 100,000 nodes"), and fewer
hand-overs measured tighter: ``bench.scale`` at 100,000 nodes through 4 relays, PostgreSQL, 240
probes under 500 record-only signals a second, interleaved, the controller's part of fault → cordon
P99 51.3, 56.9, 55.7 and 59.7 ms at 20 ms against 51.1-135.6 ms in six runs at CPython's 5 ms and
109.0 and 109.2 ms at 1 ms (fault → cordon P99 76.7-105.1 ms against 81.6-281.0 ms). At 2,000
nodes on SQLite under 800 signals a second, eleven pairs in both orders, about 1.5 ms apart at P99
(44.8 ms mean at 20 ms, 42.9 at 5), within the host's spread. Why each
hand-over costs that much is not measured; a waiting thread still takes the interpreter as soon as
the loop waits for something itself (it sleeps in ``select`` most of each second).

Process-wide: a process's entry point calls ``set_interval``, never a test that runs a controller
inside its own process.
"""

from __future__ import annotations

import sys

import structlog

log = structlog.get_logger(__name__)

INTERVAL_MS = 20.0  # CPython's own: 5


def set_interval(ms: float) -> None:
    """Hand the interpreter on every ``ms`` milliseconds at most (0: CPython's own)."""
    if ms <= 0:
        return
    sys.setswitchinterval(ms / 1000)
    log.info("switch_interval_set", ms=ms)
