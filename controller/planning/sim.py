"""A Monte Carlo of whole training runs: the ETTR's distribution, not only its mean. Pure (a seeded
random generator).

Each run lasts ``days`` of wall time. The time to the next failure is drawn as the first of the
job's GPUs to fail, each GPU's lifetime exponential at the failure rate: the minimum of ``gpus``
exponentials, which is itself exponential at ``gpus`` times the rate (drawn so, one draw a failure).
Each failure is of a kind drawn from the mix (``controller.planning.faults``) and is found in that
kind's time, with or without Vigil; the job then restarts (and, without Vigil, waits for a person
where the fault is a node's). Between failures the job trains ``τ`` and saves ``δ`` in turn; what
it trained since its last completed save is lost. Stragglers come as a Poisson process and slow
the job by ``slowdown`` until found. The ETTR of a run is the training it kept over its wall time.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

from controller.planning.faults import FaultKind, detect_s
from controller.planning.model import DAY_S, Baseline, Cluster, Times


@dataclass(frozen=True, slots=True)
class Distribution:
    runs: int
    mean: float
    p5: float
    p50: float
    p95: float
    failures_mean: float


def simulate(
    cluster: Cluster,
    times: Times,
    interval_s: float,
    mix: tuple[FaultKind, ...],
    vigil: bool,
    baseline: Baseline,
    days: float,
    runs: int = 200,
    seed: int = 0,
) -> Distribution:
    rng = random.Random(seed)
    rate = 1.0 / cluster.mtbf_s
    horizon = days * DAY_S
    weights = [k.count for k in mix]
    straggle_rate = cluster.gpus * times.stragglers_per_1000_gpu_days / (1000.0 * DAY_S)
    ettrs, failures = [], []
    cycle = interval_s + times.save_s

    def down_s() -> float:
        kind = rng.choices(mix, weights)[0]
        person = baseline.person_s if not vigil and kind.node_fault else 0.0
        return detect_s(kind, vigil, baseline.watchdog_s) + times.restart_s + person

    for _ in range(runs):
        t = kept = 0.0
        n = 0
        fails_at = rng.expovariate(rate)
        while t < horizon:
            trained = min(fails_at, horizon) - t  # up from t: train and save in turn
            kept += math.floor(trained / cycle) * interval_s
            if fails_at >= horizon:  # the run ends: what trained since the last save is saved at the end
                kept += min(interval_s, trained % cycle)
                break
            n += 1
            back_at = fails_at + down_s()
            fails_at += rng.expovariate(rate)
            while fails_at < min(back_at, horizon):  # another failure while it recovers: again from there
                n += 1
                back_at = fails_at + down_s()
                fails_at += rng.expovariate(rate)
            t = back_at
        episodes = _poisson(rng, straggle_rate * horizon)
        kept -= episodes * times.straggler_detect_s * times.straggler_slowdown
        ettrs.append(max(0.0, kept) / horizon)
        failures.append(n)
    q = statistics.quantiles(ettrs, n=20, method="inclusive")
    return Distribution(
        runs, statistics.fmean(ettrs), q[0], statistics.median(ettrs), q[-1], statistics.fmean(failures)
    )


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw (Knuth's for small means, a normal approximation for large)."""
    if mean > 50:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1
