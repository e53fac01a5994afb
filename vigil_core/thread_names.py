"""Each thread's own name in the kernel too, so that ``top -H``, ``ps -L``, ``py-spy`` and
``/proc/<pid>/task/*/comm`` say which of a controller's or a relay's threads takes the CPU (the
database's writer, the node watch, an action's Kubernetes call, a metrics scrape) instead of the
interpreter's name for all of them. CPython before 3.14 leaves every thread it starts with its
process's name.

Process-wide: a process's entry point calls ``mirror``, never a test that runs a controller or a relay
inside its own process. Threads started before the call, and threads that gRPC's core starts
(named by it already), are left as they are.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

COMM_BYTES = 15  # the kernel keeps this much of a thread's name


def name_this_thread(name: str, proc: Path = Path("/proc")) -> None:
    """Give the calling thread ``name`` (its first 15 bytes) in the kernel; nothing where there is no
    procfs to write it to."""
    with contextlib.suppress(OSError):
        (proc / "self" / "task" / str(threading.get_native_id()) / "comm").write_bytes(name.encode()[:COMM_BYTES])


def _first_call(frame: FrameType, event: str, arg: Any) -> None:
    sys.setprofile(None)  # once, at the thread's first Python call: no cost after it
    name_this_thread(threading.current_thread().name)


def mirror() -> None:
    """From now on, each thread the threading module starts takes its Python name in the kernel."""
    threading.setprofile(_first_call)
