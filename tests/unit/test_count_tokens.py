"""How the framework adapters count a batch's tokens (trainer_hooks/adapters/common.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the adapters need torch (make test installs the CPU build)")

from trainer_hooks.adapters.common import count_tokens  # noqa: E402


def test_a_mask_in_host_memory_leaves_out_the_padding() -> None:
    ids = torch.ones(2, 5, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    assert count_tokens({"input_ids": ids, "attention_mask": mask}) == 8
    assert count_tokens({"input_ids": ids}) == 10


def test_bare_tensors_and_tuples_count_their_elements_and_anything_else_is_unknown() -> None:
    assert count_tokens(torch.zeros(3, 7)) == 21
    assert count_tokens([torch.zeros(4, 8), torch.zeros(4)]) == 32
    assert count_tokens({"pixels": torch.zeros(2, 2)}) == 0
    assert count_tokens("text") == 0
