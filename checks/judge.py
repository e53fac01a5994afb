"""Verdicts from figures: against the model's expected figure and against the device's peers. Pure."""

from __future__ import annotations

import statistics

from checks.result import Verdict


def judge_devices(
    values: dict[str, float],
    expected: float | None,
    min_fraction: float,
    max_below_median: float,
    unit: str,
) -> tuple[Verdict, str]:
    """FAIL when a device reaches less than ``min_fraction`` of the expected figure, or falls more than
    ``max_below_median`` below the median of the devices measured with it."""
    if not values:
        return Verdict.UNKNOWN, "nothing was measured"
    median = statistics.median(values.values())
    problems = []
    for label, value in sorted(values.items()):
        if expected is not None and value < min_fraction * expected:
            problems.append(f"{label} at {value:.4g} {unit}, {value / expected:.0%} of the expected {expected:.0f}")
        elif len(values) > 1 and value < (1 - max_below_median) * median:
            problems.append(f"{label} at {value:.4g} {unit}, {1 - value / median:.0%} below the median {median:.4g}")
    if problems:
        return Verdict.FAIL, "; ".join(problems)
    against = f", {median / expected:.0%} of the expected {expected:.0f}" if expected else " (no expected figure here)"
    return Verdict.OK, f"{len(values)} device(s), median {median:.4g} {unit}{against}"


def fleet_outliers(
    values: dict[str, float], max_below_median: float, min_spread_mads: float = 3.0, min_for_spread: int = 8
) -> list[str]:
    """Members far below the fleet: below (1 - max_below_median)·median and, where the fleet is large
    enough to show its own spread (``min_for_spread`` members), more than ``min_spread_mads`` median
    absolute deviations under the median. A smaller fleet is judged by the ratio alone: three values
    cannot tell a fleet's spread from one bad member."""
    if len(values) < 3:
        return []
    median = statistics.median(values.values())
    mad = statistics.median(abs(v - median) for v in values.values())
    spread_known = len(values) >= min_for_spread and mad > 0
    return sorted(
        k
        for k, v in values.items()
        if v < (1 - max_below_median) * median and (not spread_known or (median - v) > min_spread_mads * mad)
    )
