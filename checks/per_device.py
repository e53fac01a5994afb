"""The shape both per-device workload checks share: refuse busy GPUs, measure each device, judge
against the model's figure and the node's median."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from checks.devices import Device, devices, peaks_for, refuse_if_busy
from checks.judge import judge_devices
from checks.result import CheckResult, NotRun, unknown


def per_device_check(
    check: str,
    args: argparse.Namespace,
    measure: Callable[[Device], float],
    peak_index: int,  # 0: bf16 TFLOP/s, 1: memory GB/s (checks.devices.GPU_PEAKS)
    unit: str,
    key: str,
    describe: Callable[[bool], str],  # the workload, in words, given whether it ran on the CPU
) -> CheckResult:
    started = time.time()
    targets = devices()
    if (refusal := refuse_if_busy(check, targets)) is not None:
        return unknown(check, refusal, started, NotRun.BUSY)
    on_cpu = targets[0].index < 0
    values = {d.label.replace(" ", ""): measure(d) for d in targets}
    peaks = peaks_for(targets[0].name)
    expected = None if on_cpu or peaks is None else peaks[peak_index]
    verdict, reason = judge_devices(values, expected, args.min_fraction, args.max_below_median, unit)
    figures = {f"{key}_{label}": value for label, value in values.items()}
    if expected:
        figures[f"expected_peak_{key}"] = expected
    return CheckResult(check, verdict, f"{describe(on_cpu)}: {reason}", figures, started, time.time())
