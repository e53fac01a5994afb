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

pytestmark = pytest.mark.timeout(120)


def gloo_threads() -> int:
    """This process's threads that run a gloo process group's work."""
    tasks = Path("/proc/self/task")
    return sum((task / "comm").read_text().strip() == "pt_gloo_runloop" for task in tasks.iterdir())


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
    deadline = time.monotonic() + 10  # the group's last holder may be its own work, let go a moment later
    while (after := gloo_threads()) > alone and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.destroy_process_group()
    out.put((rank, alone, during, after, hook.rank_nodes))


def test_the_hooks_group_stops_its_threads_at_the_runs_end() -> None:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    port = free_port()
    ranks = [context.Process(target=rank_main, args=(rank, port, out)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    results = sorted(out.get(timeout=90) for _ in ranks)
    for process in ranks:
        process.join(30)
        assert process.exitcode == 0
    for rank, alone, during, after, nodes in results:
        assert nodes == ["node-0", "node-1"], rank  # the hook's group worked
        assert during > alone, f"rank {rank}: the hook made no group of its own"
        assert after == alone, f"rank {rank}: {after - alone} of the hook's gloo threads still run after end()"
