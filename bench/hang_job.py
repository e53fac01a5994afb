"""A tiny training job for ``bench.hang_where``: each step sleeps ``BENCH_STEP_S`` (±20 %) as its
compute, all-reduces a tensor as its training collective, and calls Vigil's hook. Run under
``vigil launch`` (the ranks' variables and the hook's come from it). After ``BENCH_HANG_AFTER_S``
seconds the rank ``BENCH_HANG_RANK`` stops the way ``BENCH_HANG_HOW`` says (``trainer_hooks.inject``),
first writing the wall-clock time to ``BENCH_HANG_MARK``."""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from trainer_hooks.hook import HookConfig, VigilHook
from trainer_hooks.inject import HangHow, stop_here
from trainer_hooks.protocol import CHECKPOINTED_EXIT_CODE


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    hook = VigilHook(HookConfig.from_env(window_steps=5))
    hook.start(0)
    env = os.environ
    how: HangHow | str = env.get("BENCH_HANG_HOW", "")
    hang_rank, hang_after_s = int(env.get("BENCH_HANG_RANK", "-1")), float(env.get("BENCH_HANG_AFTER_S", "inf"))
    step_s, rng = float(env.get("BENCH_STEP_S", "1.0")), random.Random(rank)
    started, step, loss = time.monotonic(), 0, torch.ones(1)
    while True:
        due = rank == hang_rank and time.monotonic() - started >= hang_after_s
        if due and how in ("sleep", "collective", "read", "host"):
            Path(env["BENCH_HANG_MARK"]).write_text(f"{time.time()}")
            stop_here(how, rank, world, Path(env["BENCH_HANG_MARK"]).parent)
        seconds = step_s * rng.uniform(0.8, 1.2)
        time.sleep(seconds)
        dist.all_reduce(loss)
        step += 1
        if hook.step_end(step, 1000, seconds):
            hook.end()
            return CHECKPOINTED_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
