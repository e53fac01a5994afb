"""Token shards and a deterministic, resumable sampler.

The corpus is a folder of ``*.bin`` files of little-endian uint16 tokens (the nanoGPT format),
read through memory maps; without one, a synthetic corpus is generated deterministically from the
seed (a Markov chain over the vocabulary with a few likely successors per token, so a model can
learn it and its loss has somewhere to go).

A sample is a window of ``seq_len + 1`` tokens at a fixed position; the samples are visited in a
seeded permutation, a new one each epoch. The whole state of the loader is one number, the count
of samples the run has consumed, so a restart (with any number of ranks) continues at exactly the
next sample: each step takes the next ``global_batch`` samples, and rank r of W reads the r-th
slice of them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

Tokens = npt.NDArray[np.uint16]


def synthetic_corpus(vocab_size: int, n_tokens: int, seed: int, successors: int = 4) -> Tokens:
    """A reproducible token stream with learnable structure: each token has a few likely successors."""
    rng = np.random.default_rng(seed)
    table = rng.integers(0, vocab_size, size=(vocab_size, successors))
    choices = rng.integers(0, successors, size=n_tokens)
    noise = rng.random(n_tokens) < 0.1  # one token in ten is uniform: the loss cannot reach zero
    uniform = rng.integers(0, vocab_size, size=n_tokens)
    out = np.empty(n_tokens, dtype=np.uint16)
    token = 0
    for i in range(n_tokens):
        token = int(uniform[i]) if noise[i] else int(table[token, choices[i]])
        out[i] = token
    return out


def load_shards(folder: Path) -> list[Tokens]:
    files = sorted(folder.glob("*.bin"))
    if not files:
        raise ValueError(f"no *.bin token shards in {folder}")
    return [np.memmap(f, dtype=np.uint16, mode="r") for f in files]


class Sampler:
    def __init__(self, shards: list[Tokens], seq_len: int, seed: int) -> None:
        self._shards = shards
        self._window = seq_len + 1
        # Sample i starts at token (i - first sample of its shard) * seq_len of that shard.
        per_shard = [max(0, (len(s) - 1) // seq_len) for s in shards]
        self._starts = np.cumsum([0, *per_shard])
        self.samples = int(self._starts[-1])
        if self.samples == 0:
            raise ValueError(f"the corpus is shorter than one sample of {self._window} tokens")
        self._seq_len = seq_len
        self._seed = seed
        self._epoch, self._order = -1, np.empty(0, dtype=np.int64)

    def _position(self, consumed: int) -> int:
        """Which sample the ``consumed``-th draw is: epoch by epoch, in a seeded permutation."""
        epoch, index = divmod(consumed, self.samples)
        if epoch != self._epoch:
            self._epoch, self._order = epoch, np.random.default_rng((self._seed, epoch)).permutation(self.samples)
        return int(self._order[index])

    def sample(self, consumed: int) -> Tokens:
        position = self._position(consumed)
        shard = int(np.searchsorted(self._starts, position, side="right")) - 1
        start = (position - int(self._starts[shard])) * self._seq_len
        return np.asarray(self._shards[shard][start : start + self._window])

    def batch(self, consumed: int, global_batch: int, rank: int, world_size: int) -> npt.NDArray[np.int64]:
        """This rank's rows of the step that starts after ``consumed`` samples: (global_batch / W, S+1)."""
        if global_batch % world_size:
            raise ValueError(f"global_batch {global_batch} does not split over {world_size} ranks")
        per_rank = global_batch // world_size
        first = consumed + rank * per_rank
        return np.stack([self.sample(first + i) for i in range(per_rank)]).astype(np.int64)
