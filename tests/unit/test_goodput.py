"""Goodput accounting (controller/jobs/goodput.py): every second of a job's timeline lands in one kind."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.jobs.goodput import Goodput, committed, started, trained


def test_a_crash_loses_the_steps_after_the_committed_checkpoint() -> None:
    g = started(Goodput(), at=100.0, step=0, restore_s=0.0)
    g = trained(g, at=110.0, step=10, checkpoint_s=1.0, since=100.0)
    g = committed(g, 10)
    g = trained(g, at=120.0, step=20, checkpoint_s=1.0, since=110.0)
    g = committed(g, 20)
    g = trained(g, at=130.0, step=30, checkpoint_s=0.0, since=120.0)  # steps 21..30 never committed
    # The job dies; its next run starts at 140 from step 20, after 2 s loading the checkpoint.
    g = started(g, at=140.0, step=20, restore_s=2.0)
    assert (g.productive_s, g.checkpoint_s, g.wasted_s, g.restore_s, g.recovery_s) == (18.0, 2.0, 10.0, 2.0, 8.0)
    assert g.total_s == 40.0  # 100 -> 140, every second once
    assert g.ratio == pytest.approx(18 / 40)
    # What the plan compares: two saves blocked 2 s (1 s each), one restart took 10 s back to training.
    assert (g.saves, g.mean_save_s, g.restarts, g.mean_restart_s) == (2, 1.0, 1, 10.0)
    assert committed(g, 20).saves == 2  # the same checkpoint again is not another save


def test_a_clean_stop_wastes_nothing_and_its_save_counts_as_checkpoint_time() -> None:
    g = started(Goodput(), at=0.0, step=0, restore_s=0.0)
    g = trained(g, at=10.0, step=10, checkpoint_s=0.0, since=0.0)
    g = trained(g, at=13.0, step=12, checkpoint_s=1.5)  # the stop's tail: two steps, then a 1.5 s save
    g = committed(g, 12)
    g = started(g, at=20.0, step=12, restore_s=1.0)
    assert (g.productive_s, g.checkpoint_s, g.wasted_s, g.restore_s, g.recovery_s) == (11.5, 1.5, 0.0, 1.0, 6.0)


def test_a_restart_from_inside_a_window_wastes_its_share_of_that_window() -> None:
    g = started(Goodput(), at=0.0, step=0, restore_s=0.0)
    g = trained(g, at=10.0, step=10, checkpoint_s=0.0, since=0.0)
    g = committed(g, 4)
    g = started(g, at=12.0, step=4, restore_s=0.0)
    assert g.wasted_s == pytest.approx(6.0) and g.productive_s == pytest.approx(4.0)
    # What stayed is protected by a later commit, and a second restart cannot waste it again.
    g = trained(g, at=22.0, step=14, checkpoint_s=0.0, since=12.0)
    g = started(g, at=25.0, step=4, restore_s=0.0)
    assert g.wasted_s == pytest.approx(16.0) and g.productive_s == pytest.approx(4.0)


def test_overlapping_or_backward_reports_are_not_counted_twice() -> None:
    g = started(Goodput(), at=0.0, step=0, restore_s=0.0)
    g = trained(g, at=10.0, step=10, checkpoint_s=0.0, since=0.0)
    g = trained(g, at=12.0, step=12, checkpoint_s=0.0, since=5.0)  # began before the last one ended
    assert g.productive_s == 12.0
    g = trained(g, at=11.0, step=12, checkpoint_s=0.0)  # older than what is accounted: nothing
    assert g.total_s == 12.0
    g = trained(g, at=13.0, step=13, checkpoint_s=5.0)  # a save cannot block longer than the time passed
    assert (g.checkpoint_s, g.total_s) == (1.0, 13.0)


# A run: (windows of (seconds, steps, checkpoint seconds, committed?), gap before the next start, restore).
windows = st.lists(
    st.tuples(st.floats(0.1, 100), st.integers(1, 50), st.floats(0, 5), st.booleans()),  # fmt: skip
    min_size=0,
    max_size=6,
)
runs = st.lists(st.tuples(windows, st.floats(0, 60), st.floats(0, 1)), min_size=1, max_size=5)


@given(runs, st.floats(0, 10))
def test_every_second_between_the_first_start_and_the_last_report_is_counted_once(
    plan: list[tuple[list[tuple[float, int, float, bool]], float, float]], first_restore: float
) -> None:
    now, step, trained_s, g = 0.0, 0, 0.0, started(Goodput(), at=0.0, step=0, restore_s=first_restore)
    for windows_, gap, restore_fraction in plan:
        for seconds, steps, checkpoint_s, commit in windows_:
            g = trained(g, at=now + seconds, step=step + steps, checkpoint_s=checkpoint_s, since=now)
            trained_s += seconds - min(checkpoint_s, seconds)
            now, step = now + seconds, step + steps
            if commit:
                g = committed(g, step)
        resume = min((s.first for s in g.spans), default=step)  # back to the newest commit
        now += gap
        g = started(g, at=now, step=resume, restore_s=gap * restore_fraction)
        step = resume
    assert g.total_s == pytest.approx(now + first_restore, rel=1e-9, abs=1e-6)
    assert g.productive_s + g.wasted_s == pytest.approx(trained_s, rel=1e-9, abs=1e-6)
    assert g.productive_s >= -1e-9 and g.wasted_s >= 0
