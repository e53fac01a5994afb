"""The hook's own gloo group ends with the run: at ``end()`` on every rank its threads stop (within
seconds: the group's last holder may be its own last work), where before they ran on while the hook
held the group, into the interpreter's exit (where a gloo thread can abort a rank that finished
cleanly). Two real gloo ranks, in processes of their own."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the hook needs torch (make test installs the CPU build)")

import torch.distributed as dist  # noqa: E402

from tests.helpers import free_port  # noqa: E402
from trainer_hooks.hook import HookConfig, VigilHook  # noqa: E402

pytestmark = pytest.mark.timeout(150)


def gloo_tasks() -> list[Path]:
    """This process's threads that run a gloo process group's work."""
    tasks = [task for task in Path("/proc/self/task").iterdir() if (task / "comm").exists()]
    return [task for task in tasks if (task / "comm").read_text().strip() == "pt_gloo_runloop"]


def gloo_threads() -> int:
    return len(gloo_tasks())


def where_they_wait() -> list[str]:
    """Each gloo thread's kernel state and wait channel, for a failure's message (a thread on a futex
    waits for a lock or the GIL; one running is still at its work)."""
    seen = []
    for task in gloo_tasks():
        state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        wchan = (task / "wchan").read_text().strip() if (task / "wchan").exists() else "?"
        seen.append(f"{task.name}:{state}:{wchan}")
    return seen


def rank_main(rank: int, port: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    dist.barrier()  # the job's own group at work: its threads started
    alone = gloo_threads()
    hook = VigilHook(HookConfig(node=f"node-{rank}"))
    hook.start(0)
    during = gloo_threads()
    for step in range(1, 4):
        hook.step_end(step, 64, 0.01)
    hook.end()
    # The group's last holder may be its own work, let go a moment later; on CI's two loaded cores a
    # thread may also wait its turn for seconds.
    deadline = time.monotonic() + 30
    while (after := gloo_threads()) > alone and time.monotonic() < deadline:
        time.sleep(0.05)
    waiting = where_they_wait()
    dist.destroy_process_group()
    out.put((rank, alone, during, after, hook.rank_nodes, waiting))


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
    for rank, alone, during, after, nodes, waiting in results:
        assert nodes == ["node-0", "node-1"], rank  # the hook's group worked
        assert during > alone, f"rank {rank}: the hook made no group of its own"
        assert after == alone, (
            f"rank {rank}: {after - alone} of the hook's gloo threads still run 30 s after end() "
            f"(gloo threads as tid:state:wait channel: {waiting})"
        )
