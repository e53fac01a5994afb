"""What checkpointing costs the bundled MoE job: the blocking part of an asynchronous save beside a
synchronous save of the same state, and the time to restart from a checkpoint.

    python -m bench.checkpoint [--preset small] [--ranks 2] [--repeats 3]

Saves: ``--ranks`` processes (gloo) build the preset's model under FSDP2 with AdamW state (one
training step on short sequences), then alternate a synchronous save and an asynchronous one, each
followed by a training step. For the asynchronous save the training loop gives up the call itself
plus the wait for the background copy before the optimizer step; the write itself overlaps
training. Restart: the job (``python -m trainer_hooks.moe_job.train``) is started on a committed
checkpoint; process start → resumed (model built, checkpoint loaded) and → its first step done.
Figures are printed and appended to bench/results/checkpoint.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.record import append_result, header
from tests.helpers import free_port
from tests.training.launch import events, launch
from trainer_hooks.moe_job.checkpoint import Checkpointer, TrainState
from trainer_hooks.moe_job.config import PRESETS
from trainer_hooks.moe_job.flops import total_params
from trainer_hooks.moe_job.model import MoETransformer, loss_fn
from trainer_hooks.moe_job.parallel import shard

SHORT_SEQ = 32  # the steps between saves only need to touch every parameter


def _saves(rank: int, world: int, port: int, preset: str, repeats: int, root: str, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = PRESETS[preset]
    torch.manual_seed(0)
    model = shard(MoETransformer(cfg), bf16=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    state = TrainState(model, optimizer)
    checkpointer = Checkpointer(Path(root), rank, keep=2)
    batch = torch.randint(0, cfg.vocab_size, (1, SHORT_SEQ + 1))

    def train_step() -> float:
        """Forward and backward (overlapping a save in flight), then the wait, then the update."""
        loss_fn(model, batch)[1].backward()  # type: ignore[no-untyped-call]
        waited = checkpointer.before_update()
        optimizer.step()
        optimizer.zero_grad()
        state.step += 1
        return waited

    train_step()
    results: dict[str, list[float]] = {"sync_s": [], "async_call_s": [], "async_wait_s": [], "async_total_s": []}
    for _ in range(repeats):
        results["sync_s"].append(checkpointer.save(state, asynchronous=False))
        train_step()
        started = time.perf_counter()
        results["async_call_s"].append(checkpointer.save(state, asynchronous=True))
        results["async_wait_s"].append(train_step())
        checkpointer.wait()
        results["async_total_s"].append(time.perf_counter() - started)
        train_step()
    dist.barrier()
    if rank == 0:
        queue.put(results)
    dist.destroy_process_group()


def measure_saves(preset: str, ranks: int, repeats: int, root: Path) -> dict[str, Any]:
    queue = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(  # type: ignore[attr-defined]
        _saves, args=(ranks, free_port(), preset, repeats, str(root), queue), nprocs=ranks, start_method="spawn"
    )
    raw = queue.get()
    blocked = [c + w for c, w in zip(raw["async_call_s"], raw["async_wait_s"], strict=True)]
    sync_median, async_median = statistics.median(raw["sync_s"]), statistics.median(blocked)
    return {
        "raw_rank0": {k: [round(v, 4) for v in vs] for k, vs in raw.items()},
        "sync_blocking_s": round(sync_median, 4),
        "async_blocking_s": round(async_median, 4),
        "async_over_sync": round(async_median / sync_median, 3),
    }


def measure_restart(preset: str, ranks: int, out: Path) -> dict[str, float]:
    """Train 2 steps (committed checkpoint at step 2), then time a restart to its first step."""
    args = ("--preset", preset, "--global-batch", str(ranks), "--synthetic-tokens", "300000")
    first = launch(ranks, out, *args, "--steps", "2", "--checkpoint-every", "1")
    assert [p.wait(900) for p in first] == [0] * ranks, (out / "rank0.log").read_text()[-2000:]
    started = time.time()
    again = launch(ranks, out, *args, "--steps", "3")
    assert [p.wait(900) for p in again] == [0] * ranks, (out / "rank0.log").read_text()[-2000:]
    start = events(out, "start")[-1]
    (step,) = [e for e in events(out, "step") if e["at"] > started]
    return {
        "to_resumed_s": round(start["at"] - started, 2),
        "to_first_step_s": round(step["at"] - started, 2),
        "first_step_s": step["step_s"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vigil-bench-") as tmp:
        saves = measure_saves(args.preset, args.ranks, args.repeats, Path(tmp) / "saves")
        presets = dict.fromkeys(("debug", args.preset))
        restart = {p: measure_restart(p, args.ranks, Path(tmp) / f"restart-{p}") for p in presets}
    record = {
        **header("checkpoint", torch=torch.__version__),
        "preset": args.preset,
        "params": total_params(PRESETS[args.preset]),
        "ranks": args.ranks,
        "saves": saves,
        "restart": restart,
    }
    print(json.dumps(record, indent=2))
    print(
        f"{args.preset} ({record['params'] / 1e6:.0f} M params + AdamW, {args.ranks} ranks): synchronous save "
        f"blocks {saves['sync_blocking_s']:.3f} s, asynchronous {saves['async_blocking_s']:.3f} s "
        f"= {saves['async_over_sync']:.1%} of it"
    )
    for preset, r in restart.items():
        print(
            f"restart {preset}: resumed {r['to_resumed_s']:.1f} s after start, "
            f"first step done {r['to_first_step_s']:.1f} s"
        )
    append_result("checkpoint", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
