"""The hook's saves without a stop, on one rank (no process group, no controller): a CHECKPOINT_NOW
command and the auto interval turn ``save_due`` on at a step boundary; the save acknowledges."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch", reason="the hook needs torch (make test installs the CPU build)")

from protos.vigil.v1 import trainer_pb2  # noqa: E402
from trainer_hooks.hook import HookConfig, VigilHook  # noqa: E402


def test_a_checkpoint_now_is_due_at_the_next_step_and_acknowledged_once_saved() -> None:
    hook = VigilHook(HookConfig())
    hook.start(0)
    assert not hook.step_end(1, 100, 0.01) and not hook.save_due
    hook._received(trainer_pb2.JobCommand(checkpoint_now=trainer_pb2.CheckpointNow(id="j-save-1", reason="n2")))
    assert not hook.step_end(2, 100, 0.01)  # a save, never a stop
    assert hook.save_due
    hook.checkpoint_saved(0.5, committed_step=0, saved_step=2)
    assert not hook.save_due and [(a.id, a.checkpoint_step) for a in hook._acks] == [("j-save-1", 2)]
    hook._received(trainer_pb2.JobCommand(checkpoint_now=trainer_pb2.CheckpointNow(id="j-save-1", reason="n2")))
    assert not hook.step_end(3, 100, 0.01) and not hook.save_due  # the same request again: done already


def test_auto_checkpoint_saves_on_its_own_when_no_controller_advises() -> None:
    hook = VigilHook(HookConfig(auto_checkpoint=True, auto_fallback_s=0.05))
    hook.start(0)
    hook.step_end(1, 100, 0.01)
    assert not hook.save_due and hook.recommended_checkpoint_s == 0.0
    time.sleep(0.06)
    hook.step_end(2, 100, 0.01)
    assert hook.save_due
    hook.checkpoint_saved(0.1, committed_step=2)
    assert not hook.save_due and hook._acks == []  # nobody asked: nothing to acknowledge
    assert not VigilHook(HookConfig()).save_due  # without auto_checkpoint, never on its own
