"""The hook's own gloo group ends with the run: at ``end()`` on every rank its threads stop (within
seconds: the group's last holder may be its own last work), where before they ran on while the hook
held the group, into the interpreter's exit (where a gloo thread can abort a rank that finished
cleanly). Two real gloo ranks, in processes of their own.

The hook's threads are those made after ``start()``: a gloo thread takes its name only once it
runs, so on loaded cores counting by name alone could miss one of the job's own threads before the
hook started and count it after, as if the hook's were still there."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the hook needs torch (make test installs the CPU build)")

import torch.distributed as dist  # noqa: E402

from tests.helpers import free_port  # noqa: E402
from trainer_hooks.hook import HookConfig, VigilHook  # noqa: E402

pytestmark = pytest.mark.timeout(150)


def tasks() -> dict[int, Path]:
    """This process's threads, by id."""
    return {int(task.name): task for task in Path("/proc/self/task").iterdir() if (task / "comm").exists()}


def gloo_tasks(among: dict[int, Path]) -> dict[int, Path]:
    """Those of ``among`` that run a gloo process group's work (a thread takes that name once it
    runs: one just made may not have it yet)."""
    named = {}
    for tid, task in among.items():
        with contextlib.suppress(OSError):  # ended meanwhile
            if (task / "comm").read_text().strip() == "pt_gloo_runloop":
                named[tid] = task
    return named


def where_they_wait(gloo: dict[int, Path]) -> list[str]:
    """Each gloo thread's kernel state and wait channel, for a failure's message (a thread on a futex
    waits for a lock or the GIL; one running is still at its work)."""
    seen = []
    for tid, task in gloo.items():
        with contextlib.suppress(OSError):
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = (task / "wchan").read_text().strip() if (task / "wchan").exists() else "?"
            seen.append(f"{tid}:{state}:{wchan}")
    return seen


def wait_for(condition: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def rank_main(rank: int, port: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    dist.barrier()  # the job's own group at work: its threads made (named or not yet)
    before = set(tasks())
    hook = VigilHook(HookConfig(node=f"node-{rank}"))
    hook.start(0)

    def hooks_gloo() -> dict[int, Path]:
        """The gloo threads made since the hook started: its group's, never the job's."""
        return gloo_tasks({tid: task for tid, task in tasks().items() if tid not in before})

    # On CI's two loaded cores a thread just made may wait seconds for its turn to take its name.
    wait_for(lambda: bool(hooks_gloo()), 30)
    during = len(hooks_gloo())
    for step in range(1, 4):
        hook.step_end(step, 64, 0.01)
    hook.end()
    # The group's last holder may be its own work, let go a moment later.
    wait_for(lambda: not hooks_gloo(), 30)
    left = hooks_gloo()
    after, waiting = len(left), where_they_wait(left)
    dist.destroy_process_group()
    out.put((rank, during, after, hook.rank_nodes, waiting))


def test_the_hooks_group_stops_its_threads_at_the_runs_end() -> None:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    port = free_port()
    ranks = [context.Process(target=rank_main, args=(rank, port, out)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    results = sorted(out.get(timeout=120) for _ in ranks)
    for process in ranks:
        process.join(30)
        assert process.exitcode == 0
    for rank, during, after, nodes, waiting in results:
        assert nodes == ["node-0", "node-1"], rank  # the hook's group worked
        assert during > 0, f"rank {rank}: the hook made no group of its own"
        assert after == 0, (
            f"rank {rank}: {after} of the hook's {during} gloo threads still run 30 s after end() "
            f"(as tid:state:wait channel: {waiting})"
        )
