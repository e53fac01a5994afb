from __future__ import annotations

from checks.devices import busy_gpus, peaks_for
from checks.judge import fleet_outliers, judge_devices
from checks.result import Verdict


def test_a_gpu_below_the_models_figure_fails() -> None:
    values = {"GPU0": 790.0, "GPU1": 780.0, "GPU2": 420.0}
    verdict, reason = judge_devices(values, 989.0, 0.5, 0.15, "TFLOP/s")
    assert verdict is Verdict.FAIL and reason == "GPU2 at 420 TFLOP/s, 42% of the expected 989"


def test_a_gpu_far_below_its_peers_fails_even_above_the_floor() -> None:
    values = {"GPU0": 790.0, "GPU1": 785.0, "GPU2": 600.0, "GPU3": 795.0}
    verdict, reason = judge_devices(values, 989.0, 0.5, 0.15, "TFLOP/s")
    assert verdict is Verdict.FAIL and "GPU2" in reason and "below the median" in reason


def test_healthy_devices_pass_with_the_figures_in_words() -> None:
    verdict, reason = judge_devices({"GPU0": 790.0, "GPU1": 780.0}, 989.0, 0.5, 0.15, "TFLOP/s")
    assert verdict is Verdict.OK and reason == "2 device(s), median 785 TFLOP/s, 79% of the expected 989"
    assert judge_devices({}, None, 0.5, 0.15, "GB/s")[0] is Verdict.UNKNOWN  # nothing measured is not OK


def test_fleet_outliers_use_median_and_spread() -> None:
    fleet = {f"n{i}": 100.0 + i % 3 for i in range(20)} | {"slow": 60.0}
    assert fleet_outliers(fleet, 0.2) == ["slow"]
    noisy = {"a": 100.0, "b": 70.0, "c": 130.0, "d": 75.0, "e": 125.0, "f": 72.0, "g": 128.0, "h": 101.0}
    assert fleet_outliers(noisy, 0.2) == []  # 30 % below, but within the fleet's own spread
    assert fleet_outliers({"a": 1.0, "b": 100.0}, 0.2) == []  # too few to judge
    # Three cannot show a spread: a member 20x below the median is an outlier however far apart the others are.
    assert fleet_outliers({"p1": 0.18, "p2": 0.44, "p3": 0.01}, 0.5) == ["p3"]
    assert fleet_outliers({"p1": 0.18, "p2": 0.44, "p3": 0.12}, 0.5) == []


def test_busy_gpus_ignore_the_check_itself() -> None:
    assert busy_gpus({0: [10, 42], 1: [42], 2: []}, {42}) == {0: [10]}


def test_peaks_by_model_name() -> None:
    assert peaks_for("NVIDIA H100 80GB HBM3") == (989.0, 3350.0)
    assert peaks_for("NVIDIA H100 PCIe") == (756.0, 2000.0)
    assert peaks_for("NVIDIA H200") == (989.0, 4800.0)
    assert peaks_for("Tesla T4") is None
