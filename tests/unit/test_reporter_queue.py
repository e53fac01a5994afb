"""Rank 0's reporter keeps a short queue: what it drops when full is counted and said, never quiet."""

from __future__ import annotations

import structlog.testing

from protos.vigil.v1 import trainer_pb2
from trainer_hooks.reporter import QUEUE_WINDOWS, Reporter


def test_windows_dropped_from_a_full_queue_are_counted_and_logged() -> None:
    reporter = Reporter("127.0.0.1:1", trainer_pb2.Progress, lambda command: None)  # never started
    with structlog.testing.capture_logs() as logs:
        for step in range(QUEUE_WINDOWS + 5):
            reporter.put(trainer_pb2.Progress(job_id="j", step=step))
    assert reporter.dropped == 5
    (said,) = [e for e in logs if e["event"] == "vigil_report_windows_dropped"]  # the first, not each
    assert said["dropped"] == 1
