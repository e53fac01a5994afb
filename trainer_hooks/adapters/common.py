"""What the framework adapters share: making the hook, and counting a batch's tokens."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from trainer_hooks.hook import HookConfig, VigilHook


def hook_from_env(hook: VigilHook | None, flops_per_token: float, peak_flops: float) -> VigilHook:
    """The hook given, else one configured from the VIGIL_* variables (HookConfigError names a bad one)."""
    if hook is not None:
        return hook
    return VigilHook(HookConfig.from_env(flops_per_token=flops_per_token, peak_flops=peak_flops))


def count_tokens(batch: Any) -> int:
    """Tokens in one rank's batch: the ones its ``attention_mask`` keeps (when the mask is in host
    memory: summing one on a GPU would wait for it), else every element of its ``input_ids``; a bare
    tensor (or the first of a tuple) counts its elements. 0 when unknown (tokens/s and MFU are then
    not reported; step times still are)."""
    if isinstance(batch, Mapping):
        mask, ids = batch.get("attention_mask"), batch.get("input_ids")
        if isinstance(mask, torch.Tensor) and mask.device.type == "cpu":
            return int(mask.sum())
        return ids.numel() if isinstance(ids, torch.Tensor) else 0
    if isinstance(batch, torch.Tensor):
        return batch.numel()
    if isinstance(batch, Sequence) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0].numel()
    return 0
