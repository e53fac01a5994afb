"""When a job that stopped stepping is hung (controller.jobs.hang, pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.jobs.hang import HangConfig, gone_silent, hang_of, seconds_per_step, step_bound

CFG = HangConfig(factor=8, floor_s=10, ceiling_s=600, unlearned_s=300)


def test_the_bound_is_k_times_the_jobs_own_p99_within_the_floor_and_ceiling() -> None:
    assert step_bound([], CFG) == 300  # nothing learnt yet
    assert step_bound([0.5] * 50, CFG) == 10  # 8 x 0.5 s is under the floor
    assert step_bound([2.0] * 99 + [3.0], CFG) == pytest.approx(24.0)  # the p99 of a hundred: 3 s
    assert step_bound([200.0], CFG) == 600  # a step of minutes: the ceiling
    with pytest.raises(ValueError, match="floor_s"):
        HangConfig(floor_s=700, ceiling_s=600)


def test_a_window_says_seconds_per_step_with_its_saves_left_out() -> None:
    assert seconds_per_step(12.0, 10, checkpoint_s=2.0) == pytest.approx(1.0)
    assert seconds_per_step(12.0, 0) is None and seconds_per_step(0.0, 3) is None


def test_a_stall_past_the_bound_is_a_hang_whether_or_not_rank_0_still_reports() -> None:
    learnt = [1.0] * 20  # about a step a second: bound 10 s
    assert hang_of(100.0, 109.0, "", learnt, CFG, 109.0) is None
    hang = hang_of(100.0, 111.5, "", learnt, CFG, 112.0)
    assert hang is not None and not hang.silent and hang.stalled_s == pytest.approx(12.0) and hang.bound_s == 10
    assert "though its rank 0 still reports" in hang.describe(4242) and "step 4242" in hang.describe(4242)
    silent = hang_of(100.0, 100.0, "", learnt, CFG, 112.0)
    assert silent is not None and silent.silent and "nothing has come from it" in silent.describe(1)


def test_a_pause_the_job_keeps_announcing_is_not_a_hang_until_it_goes_silent() -> None:
    learnt = [1.0] * 20
    assert hang_of(100.0, 159.0, "checkpoint", learnt, CFG, 160.0) is None  # a long save, still saying so
    assert hang_of(100.0, 120.0, "checkpoint", learnt, CFG, 160.0) is not None  # silent for 40 s: no word vouches
    assert hang_of(100.0, 159.0, "", learnt, HangConfig(enabled=False), 1e6) is None
    limit = CFG.pause_limit_s
    assert hang_of(100.0, 100.0 + limit, "checkpoint", learnt, CFG, 100.0 + limit) is None  # at the limit: a save
    stuck = hang_of(100.0, 101.0 + limit, "checkpoint", learnt, CFG, 101.0 + limit)  # past it, still saying so
    assert stuck is not None and not stuck.silent  # a save stuck on a dead filesystem is a hang all the same


@given(st.lists(st.floats(0.001, 1000), min_size=0, max_size=60), st.floats(0, 2000))
def test_never_hung_before_the_floor_and_always_past_the_ceiling(per_step: list[float], stalled: float) -> None:
    hang = hang_of(0.0, stalled, "", per_step, CFG, stalled)
    if stalled <= CFG.floor_s:
        assert hang is None
    if stalled > CFG.ceiling_s:
        assert hang is not None


def test_the_time_the_controller_itself_was_held_is_not_the_jobs_stall() -> None:
    learnt = [1.0] * 20  # bound 10 s
    held_4s_at_108 = lambda t: max(0.0, min(4.0, 112.0 - max(t, 108.0)))  # noqa: E731 (its loop held 108-112)
    # Stepped at 100, last word at 107; at 112 it is 12 s stalled, 4 of them the controller's own: not yet.
    assert hang_of(100.0, 107.0, "", learnt, CFG, 112.0) is not None
    assert hang_of(100.0, 107.0, "", learnt, CFG, 112.0, held_4s_at_108) is None
    # A true stall is still found, a moment later (and its stall says the whole time, held or not).
    hang = hang_of(100.0, 107.0, "", learnt, CFG, 114.5, lambda t: 4.0 if t <= 108.0 else 0.0)
    assert hang is not None and hang.stalled_s == pytest.approx(14.5) and not hang.silent
    # Silence too: nothing heard for 12 s, 4 of them held, is not past the 10 s bound.
    assert hang_of(100.0, 100.0, "checkpoint", learnt, CFG, 112.0, held_4s_at_108) is None


def test_a_job_is_forgotten_once_silent_for_its_bound_less_the_controllers_own_hold() -> None:
    assert not gone_silent(100.0, 3700.0, 3600.0) and gone_silent(100.0, 3700.1, 3600.0)
    held_30s = lambda t: 30.0 if t <= 100.0 else 0.0  # noqa: E731 (held 30 s since its last word)
    assert not gone_silent(100.0, 3700.1, 3600.0, held_30s) and gone_silent(100.0, 3730.1, 3600.0, held_30s)
