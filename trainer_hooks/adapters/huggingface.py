"""Vigil in a Hugging Face Transformers ``Trainer`` run: one callback.

    import sys
    import torch
    from transformers import Trainer, TrainingArguments
    from trainer_hooks.adapters.huggingface import VigilTrainerCallback, last_checkpoint

    vigil = VigilTrainerCallback(flops_per_token=6 * n_params, peak_flops=989e12)
    args = TrainingArguments(output_dir="out", include_num_input_tokens_seen="all", **options)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[vigil])
    trainer.train(resume_from_checkpoint=last_checkpoint("out"))   # None on the first start
    if torch.distributed.is_initialized():                         # the Trainer made one
        torch.distributed.destroy_process_group()
    sys.exit(vigil.exit_code)                                      # 75 after a stop: restart me

(``model``, ``data``, ``n_params`` and the Trainer's other ``options`` are the job's own; the suite
runs this snippet as written, on two ranks.) ``last_checkpoint`` is the Trainer's
``get_last_checkpoint`` that answers None where ``output_dir`` does not exist yet: on a first start
a rank may look before another creates it. Launched by ``vigil launch`` or a Kubernetes Job (the
VIGIL_* variables, and torchrun's, which the Trainer reads). At every optimizer step the callback
hands the hook the step's time (from the Trainer's step begin to its end, over every micro-batch)
and the tokens the whole job trained in it: the Trainer counts them when
``include_num_input_tokens_seen`` is on; otherwise give ``tokens_per_step``, or none are reported
(step times still are). When the controller asks for a stop, the callback sets ``should_save`` and
``should_training_stop`` at that step on every rank: the Trainer saves ``checkpoint-<step>`` in
``output_dir`` and ends, and ``exit_code`` says 75. When it asks for a save only (CHECKPOINT_NOW: a
node shows early signs of failing), the callback sets ``should_save`` alone and training goes on.
The time from a step's end to a save's end counts as checkpoint time.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from trainer_hooks.adapters.common import hook_from_env
from trainer_hooks.hook import VigilHook
from trainer_hooks.protocol import CHECKPOINTED_EXIT_CODE


def last_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The newest ``checkpoint-<step>`` in ``output_dir``; None on a first start (no checkpoint, or
    no directory yet: ``get_last_checkpoint`` raises FileNotFoundError then)."""
    path = Path(output_dir)
    try:
        found: str | None = get_last_checkpoint(str(path)) if path.is_dir() else None  # type: ignore[no-untyped-call]
    except FileNotFoundError:  # removed between the two looks
        return None
    return found


class VigilTrainerCallback(TrainerCallback):
    def __init__(
        self,
        hook: VigilHook | None = None,
        *,
        flops_per_token: float = 0.0,
        peak_flops: float = 0.0,
        tokens_per_step: int | None = None,
    ) -> None:
        self.hook = hook_from_env(hook, flops_per_token, peak_flops)
        self.tokens_per_step = tokens_per_step
        self.exit_code = 0
        self._stopping = False
        self._step_began = self._step_ended = 0.0
        self._tokens_seen = 0
        self._loss: float | None = None

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._tokens_seen = state.num_input_tokens_seen
        self.hook.start(state.global_step, state.global_step)  # resumed runs start at their checkpoint's step

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._step_began = time.perf_counter()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        seconds = time.perf_counter() - self._step_began
        if args.include_num_input_tokens_seen != "no":
            tokens, self._tokens_seen = state.num_input_tokens_seen - self._tokens_seen, state.num_input_tokens_seen
        else:
            tokens = self.tokens_per_step or 0
        loss, self._loss = self._loss, None
        if self.hook.step_end(state.global_step, int(tokens), seconds, loss) and not self._stopping:
            self._stopping = True
            control.should_save = True
            control.should_training_stop = True
        elif self.hook.save_due:  # CHECKPOINT_NOW (or the recommended interval): save, train on
            control.should_save = True
        if control.should_save or control.should_evaluate:  # the Trainer's own too: a long one is not a hang
            self.hook.pause("checkpoint" if control.should_save else "evaluation")
        self._step_ended = time.perf_counter()

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs: Any = None, **kw: Any
    ) -> None:
        if isinstance(logs, dict) and isinstance(logs.get("loss"), int | float):
            self._loss = float(logs["loss"])

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if control.should_save:  # the Trainer saves next: still not a hang
            self.hook.pause("checkpoint")
        else:
            self.hook.resume()  # training goes on: a stall from here is not the evaluation's

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        blocked = time.perf_counter() - self._step_ended
        if self._stopping and not self.exit_code:
            self.exit_code = CHECKPOINTED_EXIT_CODE
            self.hook.end(checkpoint_step=state.global_step, checkpoint_s=blocked)
        else:
            self.hook.checkpoint_saved(blocked, state.global_step)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if not self.exit_code:
            self.hook.end()
