"""A framework's own saves and evaluations say so to the hook (``pause``): a long one is not a hang.
The callbacks' methods are called as the frameworks call them, with the frameworks' own objects."""

from __future__ import annotations

from typing import Any

import pytest

from trainer_hooks.hook import HookConfig, VigilHook


def hook() -> VigilHook:
    h = VigilHook(HookConfig(job_id="lm", node="node-a"))
    h.start(0)
    return h


def test_the_hugging_face_trainers_own_save_and_evaluation_are_said(tmp_path: Any) -> None:
    transformers = pytest.importorskip("transformers", reason="the adapter needs transformers (make test has it)")
    from trainer_hooks.adapters.huggingface import VigilTrainerCallback

    callback = VigilTrainerCallback(hook())
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[])
    state = transformers.TrainerState(global_step=1)
    plain, saving, evaluating = (transformers.TrainerControl() for _ in range(3))
    saving.should_save, evaluating.should_evaluate = True, True
    said = []
    for step, control in enumerate((plain, saving, evaluating), start=1):
        state.global_step = step
        callback.on_step_begin(args, state, control)
        callback.on_step_end(args, state, control)
        said.append(callback.hook.saying)
    assert said == ["", "checkpoint", "evaluation"]
    callback.on_evaluate(args, state, evaluating)  # done: training goes on, a stall now is not the evaluation's
    assert callback.hook.saying == ""
    both = transformers.TrainerControl(should_evaluate=True, should_save=True)
    callback.on_evaluate(args, state, both)  # the Trainer saves next
    assert callback.hook.saying == "checkpoint"
    callback.on_save(args, state, both)  # the save done ends the pause
    assert callback.hook.saying == ""


def test_lightnings_checkpoint_and_validation_are_said() -> None:
    pytest.importorskip("lightning", reason="the adapter needs lightning (make test has it)")
    from trainer_hooks.adapters.lightning import VigilCallback

    callback = VigilCallback(hook())
    trainer, module = None, None  # these hooks read neither
    callback.on_validation_start(trainer, module)  # type: ignore[arg-type]
    assert callback.hook.saying == "evaluation"
    callback.on_validation_end(trainer, module)  # type: ignore[arg-type]
    assert callback.hook.saying == ""
    callback.on_save_checkpoint(trainer, module, {})  # type: ignore[arg-type]
    assert callback.hook.saying == "checkpoint"
    callback.hook.step_end(1, 100, 0.1)
    assert callback.hook.saying == ""
    callback.on_save_checkpoint(trainer, module, {})  # type: ignore[arg-type]
    callback.hook.checkpoint_saved(0.5, 1)  # the save done ends the pause, before any next step
    assert callback.hook.saying == ""
