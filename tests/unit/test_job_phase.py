"""A job's phases and the moves between them (``controller.jobs.state.JobPhase``)."""

from __future__ import annotations

import pytest

from controller.jobs.state import Job, JobPhase


def test_a_drop_stop_waits_for_its_recovery_sweep_before_the_job_may_start_again() -> None:
    job = Job("moe")
    assert (job.state, job.ready) == ("running", True)
    job.sweep_on_stop = True
    job.move(JobPhase.STOPPING)
    assert (job.state, job.ready, job.stopped) == ("stopping", False, False)
    job.move(JobPhase.SWEEP_PENDING)
    assert (job.state, job.ready, job.stopped) == ("stopped", False, True)
    job.move(JobPhase.SWEEPING)
    assert not job.ready
    job.move(JobPhase.STOPPED)
    assert (job.state, job.ready) == ("stopped", True)
    job.move(JobPhase.RUNNING)  # started again
    job.move(JobPhase.FINISHED)
    assert job.state == "finished"


def test_a_quarantine_stop_may_start_again_at_once() -> None:
    job = Job("moe")
    job.move(JobPhase.STOPPING)
    assert job.ready  # no sweep to wait for: the launcher restarts it as soon as it exits
    job.move(JobPhase.STOPPED)
    assert job.ready and job.stopped


@pytest.mark.parametrize(
    ("start", "to"),
    [
        (JobPhase.RUNNING, JobPhase.SWEEPING),  # a sweep only after a stop
        (JobPhase.RUNNING, JobPhase.STOPPED),  # a stop only after a command
        (JobPhase.STOPPED, JobPhase.STOPPING),  # a stopped job is told nothing more until it restarts
        (JobPhase.FINISHED, JobPhase.RUNNING),  # a finished job is over; its id starts a new one
    ],
)
def test_moves_that_would_be_bugs_are_refused(start: JobPhase, to: JobPhase) -> None:
    job = Job("moe", phase=start)
    with pytest.raises(ValueError, match=f"from {start.value} to {to.value}"):
        job.move(to)
