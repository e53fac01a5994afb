"""Vigil inside a training job: the callback a training loop calls, adapters for popular trainers,
and the bundled Mixture-of-Experts job.

What a training script or an adapter author needs is importable from here, loaded on first use
(``import trainer_hooks`` itself loads neither torch nor grpc nor a framework):

- ``VigilHook``, ``HookConfig``, ``HookConfigError``: the callback (``trainer_hooks.hook``; its
  docstring shows the five calls a loop makes);
- ``CHECKPOINTED_EXIT_CODE``: what a job exits with after Vigil's checkpoint-and-restart (75);
- ``hook_from_env``, ``count_tokens``: what the adapters share (``trainer_hooks.adapters.common``);
- ``VigilCallback`` (Lightning) and ``VigilTrainerCallback`` (Hugging Face ``Trainer``): the
  adapters, with the ``adapters`` extra installed.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "VigilHook": "trainer_hooks.hook",
    "HookConfig": "trainer_hooks.hook",
    "HookConfigError": "trainer_hooks.hook",
    "CHECKPOINTED_EXIT_CODE": "trainer_hooks.protocol",
    "hook_from_env": "trainer_hooks.adapters.common",
    "count_tokens": "trainer_hooks.adapters.common",
    "VigilCallback": "trainer_hooks.adapters.lightning",
    "VigilTrainerCallback": "trainer_hooks.adapters.huggingface",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'trainer_hooks' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, found directly
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
