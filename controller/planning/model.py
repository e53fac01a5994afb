"""Do the math: how often to checkpoint, and what share of a run trains, given how often the
cluster fails and how fast a fault is found and the job is back. Pure.

Inputs: the job's size and its GPUs' failure rate give the job's mean time between failures
``M = 1000 · 86400 / (gpus · failures per 1000 GPU-days)`` seconds; a save blocks training ``δ``
seconds; after a failure the job loses the detection time ``D``, the restart (relaunch, process
group, loading the checkpoint) ``R``, and the work since its last completed checkpoint.

- **Optimal interval** (compute time between saves): Young (1974) ``τ = √(2δM)``; Daly (2006), to
  higher order, ``τ = √(2δM)·(1 + √(δ/2M)/3 + (δ/2M)/9) − δ`` for ``δ < 2M``, else ``M``.
- **ETTR** (effective training time ratio: the share of wall time that trains and is kept), first
  order: each failure costs ``D + R + (τ + δ)/2`` (on average half a cycle of work is lost); the
  rest of the time is cycles of ``τ`` training and ``δ`` saving, so
  ``ETTR = (1 − (D + R + (τ + δ)/2)/M) · τ/(τ + δ) − s``, where ``s`` is the stragglers' share:
  episodes per second × how long one slows the job before it is dealt with × how much it slows it.
  The badput is that, cause by cause. ``controller.planning.sim`` draws whole runs instead.
- **Baseline without Vigil**: a dead rank is noticed by the NCCL watchdog (10 min by default), and
  a person has to find and take out the node before the job can restart; a straggler slows the job
  until a person notices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

DAY_S = 86400.0


@dataclass(frozen=True, slots=True)
class Cluster:
    gpus: int
    failures_per_1000_gpu_days: float

    @property
    def mtbf_s(self) -> float:
        """The job's mean time between failures, in seconds."""
        return 1000.0 * DAY_S / (self.gpus * self.failures_per_1000_gpu_days)


@dataclass(frozen=True, slots=True)
class Times:
    """What a failure and a save cost the job (seconds), and the stragglers it meets."""

    save_s: float  # a checkpoint blocks training this long
    detect_s: float  # fault -> the job is told to stop
    restart_s: float  # told -> training again: stop, relaunch, process group, load the checkpoint
    straggler_detect_s: float = 0.0  # a slow node slows the job this long before it is dealt with
    stragglers_per_1000_gpu_days: float = 0.0
    straggler_slowdown: float = 0.0  # the job runs this much slower meanwhile (0.3: 30 % slower)


def young_interval_s(save_s: float, mtbf_s: float) -> float:
    return math.sqrt(2.0 * save_s * mtbf_s)


def daly_interval_s(save_s: float, mtbf_s: float) -> float:
    if save_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = save_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - save_s


@dataclass(frozen=True, slots=True)
class Badput:
    """Shares of wall time that did not train (or trained and were lost), by cause."""

    checkpoint: float
    lost_work: float
    detection: float
    restart: float
    stragglers: float

    @property
    def total(self) -> float:
        return self.checkpoint + self.lost_work + self.detection + self.restart + self.stragglers


@dataclass(frozen=True, slots=True)
class Expected:
    interval_s: float
    ettr: float
    badput: Badput


def expected(cluster: Cluster, times: Times, interval_s: float) -> Expected:
    """The first-order ETTR and its badput at a checkpoint interval (module docstring)."""
    m, tau, delta = cluster.mtbf_s, interval_s, times.save_s
    cycle = tau + delta
    per_failure = {"detection": times.detect_s, "restart": times.restart_s, "lost_work": cycle / 2.0}
    failed = min(1.0, sum(per_failure.values()) / m)
    share = {k: (v / m if failed < 1.0 else v / sum(per_failure.values())) for k, v in per_failure.items()}
    running = 1.0 - failed
    episodes_per_s = cluster.gpus * times.stragglers_per_1000_gpu_days / (1000.0 * DAY_S)
    stragglers = min(running, episodes_per_s * times.straggler_detect_s * times.straggler_slowdown)
    badput = Badput(
        checkpoint=running * delta / cycle,
        lost_work=share["lost_work"],
        detection=share["detection"],
        restart=share["restart"],
        stragglers=stragglers,
    )
    return Expected(interval_s, max(0.0, running * tau / cycle - stragglers), badput)


def optimum(cluster: Cluster, times: Times) -> Expected:
    """The plan at Daly's interval (at least one second)."""
    return expected(cluster, times, max(1.0, daly_interval_s(times.save_s, cluster.mtbf_s)))


@dataclass(frozen=True, slots=True)
class Baseline:
    """What finding a fault takes without Vigil."""

    watchdog_s: float = 600.0  # NCCL's watchdog notices a dead rank (TORCH_NCCL ... timeout: 10 min)
    person_s: float = 1800.0  # someone finds the bad node and takes it out before the restart
    straggler_detect_s: float = 4 * 3600.0  # someone notices a slow job and finds the node


def without_vigil(times: Times, baseline: Baseline, detect_s: float, node_fault_share: float) -> Times:
    """The same job's times where nothing watches the cluster: faults found in ``detect_s`` on
    average (mostly the watchdog's), and a person finding the node for the share of them that are a
    node's, before the job can restart."""
    return replace(
        times,
        detect_s=detect_s,
        restart_s=times.restart_s + baseline.person_s * node_fault_share,
        straggler_detect_s=baseline.straggler_detect_s,
    )


def curve(cluster: Cluster, times: Times, points: int = 60) -> list[Expected]:
    """ETTR against the checkpoint interval, around the optimum (a tenth to ten times it, log-spaced)."""
    best = max(1.0, daly_interval_s(times.save_s, cluster.mtbf_s))
    return [expected(cluster, times, best * 10 ** (-1 + 2 * i / (points - 1))) for i in range(points)]
