"""The MFU monitor's judgement: baseline, drop, and who is to blame. Pure.

Each reporting window of a job gives one figure: its MFU, or its tokens/s where the job knows no
peak (a CPU run); both are computed by the hook from the ranks' step times, so a window with a
checkpoint pause does not look slow. After every (re)start the first ``warmup_windows`` are
warm-up (compilation, caches, the allocator) and never count; the baseline is then the median of
the next ``baseline_windows``. A figure below ``(1 - drop_fraction) * baseline`` for
``drop_windows`` windows in a row is a drop, reported once until the figure recovers; never one
within the noise of the baseline's own windows (a figure must also be more than twice their widest
swing from the median below it: a job whose windows swing by half is not paged for a 30% dip).

The unit is chosen once per track, at its first window: MFU where it means something (at least
``MIN_MFU``, 0.1%), else tokens/s (a CPU run, or a peak that does not match the device: an MFU
that rounds to zero is no figure to judge). A later window of the track is judged in the same
unit, so a collapse from 40% to 0.05% MFU is a drop, not a change of unit.

Blame: a rank whose step time is ``straggler_ratio`` times the median rank's is a straggler, and
its node is the suspect; a node of the job that the controller already holds as not healthy
(throttling made it SUSPECT, say) is a suspect too. Stragglers on more than half of the job's
nodes are not a node's fault (a slow network, a data stall): then nobody is blamed.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from controller.jobs.settings import JobsConfig


class Reading(StrEnum):
    WARMUP = "WARMUP"
    LEARNING = "LEARNING"  # collecting the baseline
    OK = "OK"
    LOW = "LOW"
    DROP = "DROP"  # the N-th low window in a row


@dataclass(frozen=True, slots=True)
class Track:
    """One job's MFU history since its last (re)start (a new start begins a new Track)."""

    windows: int = 0
    samples: tuple[float, ...] = ()
    baseline: float | None = None
    low: int = 0
    noise: float = 0.0  # the baseline windows' widest swing from their median

    def floor(self, cfg: JobsConfig) -> float:
        """Below this a window is low (with a baseline)."""
        baseline = self.baseline or 0.0
        return min((1 - cfg.drop_fraction) * baseline, baseline - 2 * self.noise)


def observe(track: Track, value: float, cfg: JobsConfig) -> tuple[Track, Reading]:
    """Fold one window's figure into the track."""
    track = replace(track, windows=track.windows + 1)
    if track.windows <= cfg.warmup_windows:
        return track, Reading.WARMUP
    if track.baseline is None:
        samples = (*track.samples, value)
        if len(samples) < cfg.baseline_windows:
            return replace(track, samples=samples), Reading.LEARNING
        baseline = statistics.median(samples)
        noise = max(abs(v - baseline) for v in samples)
        return replace(track, samples=samples, baseline=baseline, noise=noise), Reading.LEARNING
    if value >= track.floor(cfg):
        return replace(track, low=0), Reading.OK
    low = track.low + 1
    return replace(track, low=low), Reading.DROP if low == cfg.drop_windows else Reading.LOW


@dataclass(frozen=True, slots=True)
class RankTime:
    rank: int
    node: str
    step_time_s: float


@dataclass(frozen=True, slots=True)
class Straggler:
    rank: int
    node: str
    ratio: float  # its step time over the median rank's


def stragglers(times: Sequence[RankTime], ratio: float) -> list[Straggler]:
    """Ranks at least ``ratio`` times slower than the median rank; none with fewer than 2 ranks."""
    if len(times) < 2:
        return []
    median = statistics.median(t.step_time_s for t in times)
    if median <= 0:
        return []
    found = [Straggler(t.rank, t.node, t.step_time_s / median) for t in times if t.step_time_s >= ratio * median]
    return sorted(found, key=lambda s: -s.ratio)


@dataclass(frozen=True, slots=True)
class Blame:
    nodes: tuple[str, ...]  # empty: no culprit
    evidence: tuple[str, ...]


def blame(job_nodes: Sequence[str], slow: Sequence[Straggler], unhealthy: Mapping[str, str]) -> Blame:
    """Which of the job's nodes explain its drop. ``unhealthy``: node -> why the controller doubts it."""
    evidence = [f"rank {s.rank} on {s.node}: step time {s.ratio:.2f}x the median rank's" for s in slow]
    slow_nodes = list(dict.fromkeys(s.node for s in slow))
    if len(slow_nodes) * 2 > len(job_nodes) and len(job_nodes) > 1:
        evidence.append(
            f"stragglers on {len(slow_nodes)} of {len(job_nodes)} nodes: not one node's fault (network? data?)"
        )
        slow_nodes = []
    doubted = [n for n in job_nodes if n in unhealthy]
    evidence += [f"{n}: {unhealthy[n]}" for n in doubted]
    return Blame(tuple(dict.fromkeys([*slow_nodes, *doubted])), tuple(evidence))


class Unit(StrEnum):
    """What a job's windows are judged in."""

    MFU = "mfu"  # a fraction of the GPUs' peak, where the job knows it
    TOKENS_PER_S = "tokens_per_s"  # no peak known (a CPU, an unlisted GPU)


MIN_MFU = 0.001  # below 0.1% MFU means nothing to judge by (module docstring)


def window_figure(mfu: float, tokens_per_s: float, unit: Unit | None = None) -> tuple[float, Unit] | None:
    """The figure a window is judged by, and its unit: ``unit`` where the track has one and the
    window gives it (an MFU no longer reported at all is a change of unit); else MFU where
    meaningful, else tokens/s; None for an empty window."""
    if unit is Unit.TOKENS_PER_S and tokens_per_s > 0:
        return tokens_per_s, Unit.TOKENS_PER_S
    if mfu >= MIN_MFU or (unit is Unit.MFU and mfu > 0):
        return mfu, Unit.MFU
    if tokens_per_s > 0:
        return tokens_per_s, Unit.TOKENS_PER_S
    return (mfu, Unit.MFU) if mfu > 0 else None


def describe_figure(value: float, unit: Unit) -> str:
    """For a person, with the digits that tell figures apart: ``MFU 41.0%``, ``MFU 0.0123%``,
    ``1,234 tokens/s``, ``4.56 tokens/s``."""
    if unit is Unit.MFU:
        percent = value * 100
        return f"MFU {percent:.1f}%" if percent >= 1 or percent == 0 else f"MFU {percent:.3g}%"
    return f"{value:,.0f} tokens/s" if value >= 100 else f"{value:.3g} tokens/s"
