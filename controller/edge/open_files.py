"""Room for every agent's connection: the process's open-file limit.

Each connected agent holds one TCP connection, so one file descriptor, in the controller. Under a
soft limit of 1,024 (systemd's default for a service, many shells') the controller stops accepting
connections past about a thousand agents, and gRPC says so only in its own log ("Too many open
files") while the rest of the fleet cannot connect. At start the controller raises its soft limit
to the hard one, and says aloud (a log error and a gauge) when even that is below what
``limits.max_nodes`` agents need.
"""

from __future__ import annotations

import resource

SPARE = 1024  # descriptors the controller needs besides its agents (database, HTTP, the API server)


def needed(max_nodes: int) -> int:
    return max_nodes + SPARE


def raised_to(soft: int, hard: int, want: int) -> int:
    """The soft limit to set: ``want`` where the hard limit allows it, else the hard limit; never
    lower than it is. Pure."""
    infinite = resource.RLIM_INFINITY
    if soft == infinite or soft >= want:
        return soft
    return want if hard == infinite else max(soft, min(hard, want))


def raise_open_files(want: int) -> tuple[int, int]:
    """Raise the soft limit toward ``want``; returns (the soft limit now, the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = raised_to(soft, hard, want)
    if target != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # kept as it was: the caller compares what it has with what it needs
    return soft, hard
