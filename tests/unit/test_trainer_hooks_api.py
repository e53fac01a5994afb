"""The training side's public API: importable from ``trainer_hooks``, and loaded only when used."""

from __future__ import annotations

import subprocess
import sys

import pytest

import trainer_hooks


def test_the_public_names_are_the_modules_own() -> None:
    from trainer_hooks.hook import HookConfig, VigilHook
    from trainer_hooks.protocol import CHECKPOINTED_EXIT_CODE

    assert trainer_hooks.VigilHook is VigilHook and trainer_hooks.HookConfig is HookConfig
    assert trainer_hooks.CHECKPOINTED_EXIT_CODE == CHECKPOINTED_EXIT_CODE == 75
    assert "VigilTrainerCallback" in dir(trainer_hooks) and "VigilTrainerCallback" in trainer_hooks.__all__
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        trainer_hooks.Nope  # noqa: B018


def test_importing_the_package_loads_nothing_heavy() -> None:
    probe = "import sys, trainer_hooks; print(sorted(m for m in ('torch', 'grpc', 'lightning') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
