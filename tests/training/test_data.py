from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_hooks.moe_job.data import Sampler, load_shards, synthetic_corpus

CORPUS = synthetic_corpus(vocab_size=64, n_tokens=5000, seed=7)


def test_the_synthetic_corpus_is_reproducible_and_learnable() -> None:
    again = synthetic_corpus(vocab_size=64, n_tokens=5000, seed=7)
    assert np.array_equal(CORPUS, again) and CORPUS.max() < 64
    pairs = len({(int(a), int(b)) for a, b in zip(CORPUS[:-1], CORPUS[1:], strict=True)})
    assert pairs < 64 * 64 / 4  # few successors per token: there is something to learn


@settings(max_examples=60, deadline=None)
@given(
    steps_before=st.integers(0, 40),
    worlds=st.tuples(st.sampled_from([1, 2, 3, 6]), st.sampled_from([1, 2, 3, 6])),
)
def test_a_step_reads_the_same_samples_whatever_the_world_size(steps_before: int, worlds: tuple[int, int]) -> None:
    sampler = Sampler([CORPUS], seq_len=16, seed=1)
    consumed = steps_before * 6
    steps = [np.concatenate([sampler.batch(consumed, 6, r, w) for r in range(w)]) for w in worlds]
    assert np.array_equal(steps[0], steps[1])
    assert steps[0].shape == (6, 17)


def test_every_sample_once_per_epoch_then_a_new_order() -> None:
    sampler = Sampler([CORPUS], seq_len=16, seed=1)
    n = sampler.samples
    first = [tuple(sampler.sample(i)) for i in range(n)]
    second = [tuple(sampler.sample(n + i)) for i in range(n)]
    assert len(set(first)) == n and set(first) == set(second) and first != second


def test_shards_on_disk_are_read_in_order(tmp_path: Path) -> None:
    CORPUS[:2000].tofile(tmp_path / "00.bin")
    CORPUS[2000:].tofile(tmp_path / "01.bin")
    shards = load_shards(tmp_path)
    sampler = Sampler(shards, seq_len=16, seed=1)
    assert sampler.samples == (2000 - 1) // 16 + (3000 - 1) // 16
    windows = {tuple(sampler.sample(i)) for i in range(sampler.samples)}
    assert tuple(CORPUS[2000:2017]) in windows
    with pytest.raises(ValueError, match="no \\*.bin token shards"):
        load_shards(tmp_path / "empty")
    with pytest.raises(ValueError, match="does not split over 4 ranks"):
        sampler.batch(0, 6, 0, 4)
