"""A small GPT-2 trained with the Hugging Face ``Trainer`` and Vigil's callback: the adapter's
example and its test's workload. CPU and gloo; under ``vigil launch`` (or torchrun).

    vigil launch --job-id gpt --nodes node-a,node-b --controller 127.0.0.1:7070 -- \\
        python -m trainer_hooks.examples.hf_lm --out runs/gpt --steps 200

After a stop it exits 75; started again, it resumes from the newest ``checkpoint-<step>`` in OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from trainer_hooks.adapters.huggingface import VigilTrainerCallback, last_checkpoint
from trainer_hooks.hook import HookConfigError

CONFIG = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)


class RandomTokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, count: int) -> None:
        self.tokens = torch.randint(0, CONFIG.vocab_size, (count, CONFIG.n_positions),
                                    generator=torch.Generator().manual_seed(0))  # fmt: skip

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


class Paced(TrainerCallback):
    """Each step pauses ``pause_s`` after it, as a larger model's step would take longer (the tests: a job
    on a fast machine still runs long enough to hear Vigil's commands)."""

    def __init__(self, pause_s: float) -> None:
        self.pause_s = pause_s

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        time.sleep(self.pause_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_hooks.examples.hf_lm", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    parser.add_argument("--step-pause-s", type=float, default=0.0, help="a pause after each step")
    args = parser.parse_args(argv)
    model = GPT2LMHeadModel(CONFIG)
    try:
        vigil = VigilTrainerCallback(flops_per_token=6.0 * model.num_parameters())
    except HookConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    training = TrainingArguments(
        output_dir=str(args.out), max_steps=args.steps, per_device_train_batch_size=args.batch, learning_rate=3e-3,
        save_strategy="steps", save_steps=20, logging_steps=5, report_to="none", use_cpu=True,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", 1)) > 1 else None,
        include_num_input_tokens_seen="all", disable_tqdm=True, seed=0, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=RandomTokens(4096),
        callbacks=[vigil, *([Paced(args.step_pause_s)] if args.step_pause_s > 0 else [])],
    )
    resume = last_checkpoint(args.out)
    trainer.train(resume_from_checkpoint=resume)
    if trainer.is_world_process_zero():
        print(json.dumps({"event": "train_ended", "step": trainer.state.global_step, "exit_code": vigil.exit_code,
                          "world_size": training.world_size, "resumed_from": resume or ""}), flush=True)  # fmt: skip
    if dist.is_initialized():  # the Trainer leaves the group up: no rank leaves while another still needs it
        dist.barrier()
        dist.destroy_process_group()
    return vigil.exit_code


if __name__ == "__main__":
    sys.exit(main())
