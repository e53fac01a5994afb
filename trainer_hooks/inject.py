"""Fault injection for the tests, the demo and the benchmarks: a rank that stops stepping, for good.

- ``sleep``: in the job's own code (an application hang);
- ``collective``: waits for a tensor no rank sends, so the others wait in their next collective and
  every rank is in one, as on a broken link;
- ``read``: blocked reading a FIFO nobody writes, as a data loader on a dead mount (the read is in C:
  no Python frame of its own);
- ``host``: the process stops itself (SIGSTOP), as a frozen host: it answers nothing.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Literal

HangHow = Literal["sleep", "collective", "read", "host"]


def stop_here(how: HangHow, rank: int, world: int, workdir: Path) -> None:
    """This rank stops stepping, the way ``how`` says; never returns."""
    if how == "collective":
        import torch  # here: the rest of this module (and the job's config, which names HangHow) needs no torch
        import torch.distributed as dist

        dist.recv(torch.zeros(1), src=(rank + 1) % world)
    elif how == "read":
        fifo = workdir / f"stuck-rank{rank}.fifo"
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo)
        with open(os.open(fifo, os.O_RDWR), "rb") as f:  # O_RDWR: opening does not wait for a writer
            f.read(1)
    elif how == "host":
        os.kill(os.getpid(), signal.SIGSTOP)
    while True:
        time.sleep(1)
