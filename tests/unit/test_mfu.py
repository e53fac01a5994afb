"""The MFU monitor's judgement (controller.jobs.mfu) and the hook's window figures (trainer_hooks.window)."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.config import JobsConfig
from controller.jobs.mfu import (
    RankTime,
    Reading,
    Track,
    Unit,
    blame,
    describe_figure,
    observe,
    stragglers,
    window_figure,
)
from trainer_hooks.window import RankWindow, figures

CFG = JobsConfig(warmup_windows=1, baseline_windows=3, drop_fraction=0.2, drop_windows=2)


def readings(values: list[float], cfg: JobsConfig = CFG) -> tuple[Track, list[Reading]]:
    track, out = Track(), []
    for v in values:
        track, r = observe(track, v, cfg)
        out.append(r)
    return track, out


def test_warm_up_never_counts_and_the_baseline_is_the_median_after_it() -> None:
    # The warm-up window is far below: were it counted, the baseline would be 0.40, not 0.50.
    track, got = readings([0.05, 0.40, 0.50, 0.55])
    assert got == [Reading.WARMUP, Reading.LEARNING, Reading.LEARNING, Reading.LEARNING]
    assert track.baseline == 0.50


def test_a_drop_is_n_low_windows_in_a_row_reported_once_until_it_recovers() -> None:
    base = [0.1, 0.5, 0.5, 0.5]
    _, got = readings([*base, 0.39, 0.45, 0.39, 0.39, 0.3, 0.3, 0.5, 0.3, 0.3])
    # 0.45 is above 0.8 * 0.5 = 0.40: it breaks the run of low windows.
    assert got[4:] == [
        Reading.LOW, Reading.OK, Reading.LOW, Reading.DROP, Reading.LOW, Reading.LOW,
        Reading.OK, Reading.LOW, Reading.DROP,
    ]  # fmt: skip


def test_a_new_track_after_a_restart_warms_up_again() -> None:
    track, _ = readings([0.1, 0.5, 0.5, 0.5, 0.2])
    assert track.low == 1
    restarted, reading = observe(Track(), 0.01, CFG)  # the slow first window after a restart
    assert reading is Reading.WARMUP and restarted.baseline is None


@given(low=st.integers(1, 6), n=st.integers(1, 4))
def test_drop_fires_exactly_once_per_run_of_low_windows(low: int, n: int) -> None:
    cfg = JobsConfig(warmup_windows=0, baseline_windows=1, drop_windows=n)
    _, got = readings([1.0] + [0.1] * low, cfg)
    assert got.count(Reading.DROP) == (1 if low >= n else 0)


def test_stragglers_are_ranks_far_above_the_median() -> None:
    times = [RankTime(0, "a", 0.10), RankTime(1, "a", 0.11), RankTime(2, "b", 0.25), RankTime(3, "b", 0.10)]
    (s,) = stragglers(times, 1.3)
    assert (s.rank, s.node) == (2, "b") and s.ratio == pytest.approx(0.25 / 0.105)
    assert stragglers(times[:1], 1.3) == []  # one rank has no peers to be slower than


@given(
    times=st.lists(st.floats(0.01, 10.0), min_size=2, max_size=16),
    scale=st.floats(0.1, 100.0),
)
def test_stragglers_do_not_depend_on_the_unit_of_time(times: list[float], scale: float) -> None:
    ranks = [RankTime(i, f"n{i}", t) for i, t in enumerate(times)]
    scaled = [RankTime(i, f"n{i}", t * scale) for i, t in enumerate(times)]
    median = statistics.median(times)
    # Away from the threshold itself (floating point may tip a rank sitting exactly on it).
    if all(abs(t / median - 1.5) > 1e-9 for t in times):
        assert {s.rank for s in stragglers(ranks, 1.5)} == {s.rank for s in stragglers(scaled, 1.5)}


def test_blame_names_the_straggler_node_and_the_doubted_ones() -> None:
    times = [RankTime(0, "a", 0.1), RankTime(1, "b", 0.3), RankTime(2, "c", 0.1), RankTime(3, "d", 0.1)]
    found = blame(["a", "b", "c", "d"], stragglers(times, 1.3), {"c": "SUSPECT (incident c-1)"})
    assert found.nodes == ("b", "c")
    assert any("rank 1 on b" in e for e in found.evidence) and any("c: SUSPECT" in e for e in found.evidence)


def test_stragglers_on_most_nodes_are_nobodys_fault() -> None:
    times = [RankTime(0, "a", 0.3), RankTime(1, "b", 0.3), RankTime(2, "c", 0.1), RankTime(3, "c", 0.1)]
    slow = stragglers(times, 1.3)
    assert {s.node for s in slow} == {"a", "b"}
    found = blame(["a", "b", "c"], slow, {})
    assert found.nodes == () and "not one node's fault" in found.evidence[-1]


def test_one_slow_node_of_two_is_blamed() -> None:
    times = [RankTime(0, "a", 0.1), RankTime(1, "b", 0.3)]
    # The median of two is their mean: b is 1.5x it.
    assert blame(["a", "b"], stragglers(times, 1.3), {}).nodes == ("b",)


def test_the_window_figure_is_mfu_where_known_else_tokens_per_s() -> None:
    assert window_figure(0.41, 1000.0) == (0.41, Unit.MFU)
    assert window_figure(0.0, 1000.0) == (1000.0, Unit.TOKENS_PER_S)
    assert window_figure(0.0, 0.0) is None


def test_window_throughput_is_at_the_slowest_ranks_pace() -> None:
    ranks = [RankWindow(0, 1.0, 10), RankWindow(1, 2.0, 10)]
    fig = figures(ranks, tokens=4000, flops_per_token=1e9, peak_flops_per_device=1e12)
    assert fig.tokens_per_s == 2000.0  # 4000 tokens over the slow rank's 2 s
    assert fig.mfu == pytest.approx(2000 * 1e9 / 2e12)
    assert figures(ranks, 4000, 1e9, 0.0).mfu == 0.0  # no peak: MFU unknown, tokens/s still judged
    assert figures([RankWindow(0, 0.0, 0)], 4000, 1e9, 1e12).tokens_per_s == 0.0


def test_a_dip_within_the_baselines_own_noise_is_no_drop() -> None:
    """Baseline windows 60, 100, 140 tokens/s (median 100, swinging by 40): windows at 70 are 30%
    below, past the 20% threshold, and within the noise: never low. At 15, below the median less
    twice the swing, they are a drop."""
    track, got = readings([50.0, 60.0, 100.0, 140.0, 70.0, 70.0, 70.0])
    assert track.noise == 40.0 and got[4:] == [Reading.OK] * 3
    _, got = readings([50.0, 60.0, 100.0, 140.0, 15.0, 15.0])
    assert got[4:] == [Reading.LOW, Reading.DROP]
    _, got = readings([0.1, 0.50, 0.50, 0.51, 0.39, 0.39])  # a steady baseline: the 20% rule alone
    assert got[4:] == [Reading.LOW, Reading.DROP]


def test_an_mfu_that_rounds_to_zero_is_judged_in_tokens_per_s_and_a_collapse_stays_in_mfu() -> None:
    """A CPU job given a GPU's peak reports MFU 0.00012: no figure to judge by; its tokens/s are.
    A job that starts at 40% MFU keeps MFU for its track, so falling to 0.05% is a drop."""
    assert window_figure(0.00012, 800.0) == (800.0, Unit.TOKENS_PER_S)
    assert window_figure(0.0005, 800.0, Unit.MFU) == (0.0005, Unit.MFU)
    assert window_figure(0.40, 800.0, Unit.TOKENS_PER_S) == (800.0, Unit.TOKENS_PER_S)


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (0.41, Unit.MFU, "MFU 41.0%"),
        (0.000123, Unit.MFU, "MFU 0.0123%"),
        (0.0, Unit.MFU, "MFU 0.0%"),
        (1234.4, Unit.TOKENS_PER_S, "1,234 tokens/s"),
        (4.567, Unit.TOKENS_PER_S, "4.57 tokens/s"),
    ],
)
def test_figures_are_shown_with_the_digits_that_tell_them_apart(value: float, unit: Unit, text: str) -> None:
    assert describe_figure(value, unit) == text
