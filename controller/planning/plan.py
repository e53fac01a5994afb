"""``vigil plan``: the plan for a run with Vigil beside the same run without it. Pure.

The formulas are ``controller.planning.model``'s, the fault mix ``controller.planning.faults``', the
simulation ``controller.planning.sim``'s. The job's own times default to what Vigil measured
(``MEASURED``, each with its source); every one can be given instead, and at scale should be: the
measured ones come from a 2-rank job on 2 CPU cores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from controller.planning.faults import LLAMA3_MIX, FaultKind, mean_detect_s, node_fault_share
from controller.planning.model import (
    DAY_S,
    Baseline,
    Cluster,
    Expected,
    Times,
    curve,
    daly_interval_s,
    expected,
    without_vigil,
    young_interval_s,
)
from controller.planning.sim import Distribution, simulate

# What Vigil measured, and where (bench/results/, 2 cores, CPU torch 2.13.0).
MEASURED = {
    "save_s": (0.0111, "async checkpoint blocking, the bundled job's small preset (bench/results/checkpoint.jsonl)"),
    "restart_s": (4.3, "XID -> the job's first step after restarting, 2 gloo ranks (bench/results/job_recovery.jsonl)"),
}


@dataclass(frozen=True, slots=True)
class PlanInputs:
    gpus: int
    failures_per_1000_gpu_days: float
    save_s: float = MEASURED["save_s"][0]
    restart_s: float = MEASURED["restart_s"][0]  # relaunch; the measured figure includes the load
    restore_s: float = 0.0  # loading the checkpoint, where not counted in restart_s
    detect_s: float | None = None  # with Vigil, for every fault; None: each kind's measured latency
    days: float = 30.0
    stragglers_per_1000_gpu_days: float = 0.0
    straggler_slowdown: float = 0.3
    straggler_detect_s: float = 120.0  # Vigil: two low MFU windows, then the straggler's node is out
    baseline: Baseline = Baseline()
    runs: int = 200
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    times: Times
    young_s: float
    daly_s: float
    at_optimum: Expected
    simulated: Distribution
    curve: list[Expected]


@dataclass(frozen=True, slots=True)
class Plan:
    inputs: PlanInputs
    mtbf_s: float
    failures_per_day: float
    vigil: Scenario
    baseline: Scenario

    @property
    def saved_share(self) -> float:
        """ETTR points Vigil adds (at each one's optimum)."""
        return self.vigil.at_optimum.ettr - self.baseline.at_optimum.ettr


def never_trains(inputs: PlanInputs) -> str | None:
    """Why no checkpoint interval helps, where none can: a restart (with its load) that outlasts the
    job's time between failures never ends in training (ETTR 0 whatever the plan)."""
    mtbf_s = Cluster(inputs.gpus, inputs.failures_per_1000_gpu_days).mtbf_s
    back_s = inputs.restart_s + inputs.restore_s
    if back_s < mtbf_s:
        return None
    return (
        f"{inputs.gpus:,} GPUs at {inputs.failures_per_1000_gpu_days:g} failures per 1,000 GPU-days fail every "
        f"{mtbf_s:,.0f} s, and a restart takes {back_s:,.0f} s: the job would never train again (ETTR 0 at any "
        "checkpoint interval). Lower the restart time or the failure rate, or plan for fewer GPUs"
    )


def make_plan(inputs: PlanInputs, mix: tuple[FaultKind, ...] = LLAMA3_MIX) -> Plan:
    cluster = Cluster(inputs.gpus, inputs.failures_per_1000_gpu_days)
    watchdog = inputs.baseline.watchdog_s
    if inputs.detect_s is not None:  # one detection time given for every kind of fault
        mix = tuple(replace(k, vigil_s=inputs.detect_s) for k in mix)
    times = Times(
        save_s=inputs.save_s,
        detect_s=mean_detect_s(mix, True, watchdog),
        restart_s=inputs.restart_s + inputs.restore_s,
        straggler_detect_s=inputs.straggler_detect_s,
        stragglers_per_1000_gpu_days=inputs.stragglers_per_1000_gpu_days,
        straggler_slowdown=inputs.straggler_slowdown,
    )
    unwatched = without_vigil(times, inputs.baseline, mean_detect_s(mix, False, watchdog), node_fault_share(mix))
    # The simulation adds the person per fault of a node's itself: it is given the job's own restart.
    simulated_unwatched = replace(times, straggler_detect_s=inputs.baseline.straggler_detect_s)
    scenarios = [
        _scenario("with Vigil", cluster, times, times, True, inputs, mix),
        _scenario("without Vigil", cluster, unwatched, simulated_unwatched, False, inputs, mix),
    ]
    return Plan(inputs, cluster.mtbf_s, DAY_S / cluster.mtbf_s, scenarios[0], scenarios[1])


def _scenario(
    name: str,
    cluster: Cluster,
    times: Times,
    sim_times: Times,
    vigil: bool,
    inputs: PlanInputs,
    mix: tuple[FaultKind, ...],
) -> Scenario:
    daly = max(1.0, daly_interval_s(times.save_s, cluster.mtbf_s))
    sim = simulate(cluster, sim_times, daly, mix, vigil, inputs.baseline, inputs.days, inputs.runs, inputs.seed)
    return Scenario(
        name,
        times,
        young_interval_s(times.save_s, cluster.mtbf_s),
        daly,
        expected(cluster, times, daly),
        sim,
        curve(cluster, times),
    )


@dataclass(frozen=True, slots=True)
class JobPlan:
    """A running job's plan: its ETTR expected at its size, and how often it should save."""

    ettr: float
    interval_s: float
    save_s: float  # what was planned with: the job's measured mean, else Vigil's measurement
    restart_s: float


def job_plan(
    gpus: int, failures_per_1000_gpu_days: float, save_s: float | None, restart_s: float | None
) -> JobPlan | None:
    """The plan for a job of ``gpus`` ranks from its own measured save and restart times where it
    has them (Vigil's measurements until then); None for a job whose size is not known."""
    if gpus <= 0:
        return None
    save = MEASURED["save_s"][0] if save_s is None else save_s
    restart = MEASURED["restart_s"][0] if restart_s is None else restart_s
    cluster = Cluster(gpus, failures_per_1000_gpu_days)
    times = Times(save_s=save, detect_s=mean_detect_s(LLAMA3_MIX, True, Baseline().watchdog_s), restart_s=restart)
    interval = max(1.0, daly_interval_s(save, cluster.mtbf_s))
    return JobPlan(expected(cluster, times, interval).ettr, interval, save, restart)


class HistoryError(ValueError):
    """The controller's history cannot give a failure rate; the message says why."""


def rate_from_history(failures_at: Sequence[float], gpus: int, since: float, now: float) -> float:
    """Failures per 1,000 GPU-days from the controller's own record: the nodes it quarantined
    (``failures_at``: when) over the GPUs it watches and the time it watched them."""
    if gpus <= 0:
        raise HistoryError("no GPUs reported by any agent: the controller watches no GPU node")
    days = (now - since) / DAY_S
    if days < 1.0:
        raise HistoryError(f"{days * 24:.1f} h of history: too little to fit a failure rate (a day at least)")
    failures = sum(1 for t in failures_at if since <= t <= now)
    if failures == 0:
        raise HistoryError(f"no node was quarantined in {days:.1f} days: give the rate (--failures-per-1000-gpu-days)")
    return 1000.0 * failures / (gpus * days)
