"""A reporting window's figures from the ranks' step times. Pure.

In synchronous training every rank waits for the slowest at the next collective, so the job moves
at the pace of its slowest rank: the window's throughput is its tokens over the slowest rank's
summed step time. Step times are each rank's own (the hook's exchange, where the ranks wait for
each other at the end of a step, is not in them), which is what shows a straggler as skew, and
checkpoint pauses are left out, so a save does not read as a slowdown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RankWindow:
    rank: int
    seconds: float  # summed step time over the window
    steps: int

    @property
    def mean_step_s(self) -> float:
        return self.seconds / self.steps if self.steps else 0.0


@dataclass(frozen=True, slots=True)
class WindowFigures:
    tokens_per_s: float
    mfu: float  # 0.0: no peak known


def figures(
    ranks: Sequence[RankWindow], tokens: int, flops_per_token: float, peak_flops_per_device: float
) -> WindowFigures:
    """``tokens``: trained in the window by the whole job; the peak is one device's (one per rank)."""
    slowest = max((r.seconds for r in ranks), default=0.0)
    if slowest <= 0 or tokens <= 0:
        return WindowFigures(0.0, 0.0)
    tokens_per_s = tokens / slowest
    if flops_per_token <= 0 or peak_flops_per_device <= 0:
        return WindowFigures(tokens_per_s, 0.0)
    return WindowFigures(tokens_per_s, tokens_per_s * flops_per_token / (peak_flops_per_device * len(ranks)))
