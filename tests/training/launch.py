"""Start the bundled job as N processes on this machine, the way torchrun or a Kubernetes Job would
(``vigil.launch.torchrun_env``), without Vigil's launcher: one "node", no controller. Tests signal
the processes themselves and read each one's exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import free_port
from trainer_hooks.moe_job.metrics_log import events, losses
from vigil.launch import torchrun_env


def launch(world: int, out: Path, *args: str) -> list[subprocess.Popen[bytes]]:
    port = str(free_port())
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in range(world):
        env = {**os.environ, **torchrun_env(rank, rank, world, world, 0, port), "OMP_NUM_THREADS": "1"}
        command = [sys.executable, "-m", "trainer_hooks.moe_job.train", "--out", str(out), *args]
        with open(out / f"rank{rank}.log", "ab") as log:  # the child keeps its own descriptor
            procs.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def run(world: int, out: Path, *args: str, timeout: float = 240) -> list[int]:
    procs = launch(world, out, *args)
    return [p.wait(timeout) for p in procs]


__all__ = ["events", "launch", "losses", "run"]  # events and losses: the job's own readers, for the tests
