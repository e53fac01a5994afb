"""Vigil in a PyTorch Lightning run: one callback.

    import sys
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from trainer_hooks.adapters.lightning import VigilCallback

    vigil = VigilCallback(flops_per_token=6 * n_params, peak_flops=989e12)
    checkpoints = ModelCheckpoint(dirpath="ckpt", save_last=True)     # a fixed directory
    trainer = L.Trainer(callbacks=[vigil, checkpoints], **options)
    trainer.fit(model, data, ckpt_path="last")                         # resumes after a stop
    sys.exit(vigil.exit_code)                                          # 75 after a stop: restart me

(``model``, ``data``, ``n_params`` and the Trainer's other ``options`` are the job's own; the suite
runs this snippet as written, on two ranks.) Launched by ``vigil launch`` or a Kubernetes Job (the
VIGIL_* variables; LOCAL_RANK makes Lightning leave process creation to the launcher). At every
optimizer step the callback hands the hook the step's time (the batches' own time, summed over
gradient accumulation: data loading, validation and checkpoint saves between steps are left out) and
the job's tokens (this rank's batch times the world size). When the controller asks for a stop (or
SIGTERM is routed to ``hook.request_stop``), every rank saves ``last.ckpt`` in the ModelCheckpoint's
directory at the same step, the run ends, and ``exit_code`` says 75. When it asks for a save only
(CHECKPOINT_NOW), every rank saves ``last.ckpt`` there at the same step and training goes on. The
loss is read once per reporting window (reading it waits for the GPU).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from trainer_hooks.adapters.common import count_tokens, hook_from_env
from trainer_hooks.hook import VigilHook
from trainer_hooks.protocol import CHECKPOINTED_EXIT_CODE


class VigilCallback(Callback):
    def __init__(
        self,
        hook: VigilHook | None = None,
        *,
        flops_per_token: float = 0.0,
        peak_flops: float = 0.0,
        tokens: Callable[[Any], int] = count_tokens,
    ) -> None:
        self.hook = hook_from_env(hook, flops_per_token, peak_flops)
        self.tokens = tokens
        self.exit_code = 0
        self.stop_checkpoint = ""  # where the stop's checkpoint went
        self._step = 0  # the optimizer step last handed to the hook
        self._busy_s = 0.0  # this step's batches so far
        self._step_tokens = 0
        self._batch_began = 0.0
        self._saved_at: float | None = None  # a ModelCheckpoint save began (on_save_checkpoint)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._step = trainer.global_step
        self.hook.start(trainer.global_step, trainer.global_step if trainer.ckpt_path else 0)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, idx: int) -> None:
        if self._saved_at is not None:  # the save since the last batch has finished by now
            self.hook.checkpoint_saved(time.perf_counter() - self._saved_at, trainer.global_step)
            self._saved_at = None
        self._batch_began = time.perf_counter()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        self._busy_s += time.perf_counter() - self._batch_began
        self._step_tokens += self.tokens(batch) * trainer.world_size
        if trainer.global_step == self._step:
            return  # gradient accumulation: the optimizer step is not done yet
        self._step = trainer.global_step
        loss = _loss(outputs) if self._step % self.hook.config.window_steps == 0 else None
        stop = self.hook.step_end(self._step, self._step_tokens, self._busy_s, loss)
        self._busy_s, self._step_tokens = 0.0, 0
        if stop:
            self._stop(trainer)
        elif self.hook.save_due:  # CHECKPOINT_NOW (or the recommended interval): save, train on
            self._save_now(trainer)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, ckpt: dict[str, Any]) -> None:
        if not self.exit_code:
            self._saved_at = time.perf_counter()
            self.hook.pause("checkpoint")  # a long save is not a hang; the next step's end ends the pause

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.hook.pause("evaluation")  # neither is a long validation loop

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.hook.resume()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.exit_code:
            self.hook.end()

    def _save_now(self, trainer: pl.Trainer) -> None:
        """Every rank gets here at the same step: save ``last.ckpt`` where a restart looks for it."""
        path = os.path.join(_checkpoint_dir(trainer), ModelCheckpoint.CHECKPOINT_NAME_LAST + ".ckpt")
        began = time.perf_counter()
        trainer.save_checkpoint(path)
        self._saved_at = None  # timed here: not again by on_save_checkpoint's
        self.hook.checkpoint_saved(time.perf_counter() - began, trainer.global_step)

    def _stop(self, trainer: pl.Trainer) -> None:
        """Every rank gets here at the same step: save (a collective in Lightning), tell Vigil, stop."""
        self.exit_code = CHECKPOINTED_EXIT_CODE
        self.stop_checkpoint = os.path.join(_checkpoint_dir(trainer), ModelCheckpoint.CHECKPOINT_NAME_LAST + ".ckpt")
        began = time.perf_counter()
        trainer.save_checkpoint(self.stop_checkpoint)
        self.hook.end(checkpoint_step=trainer.global_step, checkpoint_s=time.perf_counter() - began)
        trainer.should_stop = True


def _checkpoint_dir(trainer: pl.Trainer) -> str:
    """The first ModelCheckpoint's directory (where ``ckpt_path="last"`` looks), else the default."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            return str(callback.dirpath)
    return os.path.join(trainer.default_root_dir, "checkpoints")


def _loss(outputs: Any) -> float | None:
    value = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    return float(value.detach()) if isinstance(value, torch.Tensor) else None
