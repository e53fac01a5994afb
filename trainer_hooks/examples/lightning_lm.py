"""A small language model trained with PyTorch Lightning and Vigil's callback: the adapter's example
and its test's workload. CPU and gloo; under ``vigil launch`` (or torchrun) with any world size.

    vigil launch --job-id lm --nodes node-a,node-b --controller 127.0.0.1:7070 -- \\
        python -m trainer_hooks.examples.lightning_lm --out runs/lm --steps 200

After a stop it exits 75; started again, it resumes from ``last.ckpt`` in ``OUT/checkpoints``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from trainer_hooks.adapters.lightning import VigilCallback
from trainer_hooks.hook import HookConfigError

VOCAB, SEQ, WIDTH = 64, 32, 64


class TinyLM(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.mix = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(), torch.nn.Linear(WIDTH, VOCAB))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        (tokens,) = batch
        logits = self.mix(self.embed(tokens[:, :-1]))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


class Paced(pl.Callback):
    """Each step pauses ``pause_s`` after it, as a larger model's step would take longer (the tests: a job
    on a fast machine still runs long enough to hear Vigil's commands)."""

    def __init__(self, pause_s: float) -> None:
        self.pause_s = pause_s

    def on_train_batch_end(self, *args: Any) -> None:
        time.sleep(self.pause_s)


def flops_per_token() -> float:
    return 6.0 * sum(p.numel() for p in TinyLM().parameters())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_hooks.examples.lightning_lm", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    parser.add_argument("--step-pause-s", type=float, default=0.0, help="a pause after each step")
    args = parser.parse_args(argv)
    world, local = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    try:
        vigil = VigilCallback(flops_per_token=flops_per_token())
    except HookConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    pl.seed_everything(0, verbose=False)
    data = TensorDataset(torch.randint(0, VOCAB, (4096, SEQ), generator=torch.Generator().manual_seed(0)))
    checkpoints = ModelCheckpoint(dirpath=args.out / "checkpoints", every_n_train_steps=20, save_last=True)
    paced = [Paced(args.step_pause_s)] if args.step_pause_s > 0 else []
    trainer = pl.Trainer(
        accelerator="cpu", devices=local, num_nodes=world // local, strategy="ddp" if world > 1 else "auto",
        max_steps=args.steps, callbacks=[vigil, checkpoints, *paced], logger=False, enable_progress_bar=False,
        enable_model_summary=False, use_distributed_sampler=True,
    )  # fmt: skip
    trainer.fit(TinyLM(), DataLoader(data, batch_size=args.batch, shuffle=True), ckpt_path="last")
    if trainer.global_rank == 0:
        print(json.dumps({"event": "fit_ended", "step": trainer.global_step, "exit_code": vigil.exit_code,
                          "world_size": world, "stop_checkpoint": vigil.stop_checkpoint}), flush=True)  # fmt: skip
    return vigil.exit_code


if __name__ == "__main__":
    sys.exit(main())
