"""Storms folded at the agent: the first of a fault at once, its repeats as one counted signal."""

from __future__ import annotations

import json

from agent.storm import StormFolder
from vigil_core.signals import GpuRef, Signal, SignalKind


def xid(code: int, at: float, gpu: int = 0, message: str = "") -> Signal:
    return Signal(
        "n1", SignalKind.XID, GpuRef(gpu, f"GPU-{gpu}"), code, message=message or f"xid {code}", observed_at=at
    )


def total(signals: list[Signal]) -> int:
    return sum(s.count for s in signals)


def test_the_first_goes_out_at_once_and_repeats_leave_as_one_counted_signal() -> None:
    storm = StormFolder(flush_s=1.0, burst=1)
    assert [s.code for s in storm.fold([xid(45, 10.0)])] == [45]
    assert storm.fold([xid(45, 10.0 + i / 10, message=f"repeat {i}") for i in range(1, 6)]) == []
    assert storm.due(10.5) == []  # not yet: at most one summary per flush_s
    (summary,) = storm.due(11.0)
    assert (summary.code, summary.count, summary.first_observed_at, summary.observed_at) == (45, 5, 10.1, 10.5)
    assert summary.message == "repeat 1" and summary.seq == 0
    assert storm.due(20.0) == []  # nothing held any more


def test_a_different_fault_is_never_held_behind_a_storm() -> None:
    storm = StormFolder(flush_s=1.0)
    storm.fold([xid(45, 1.0), *[xid(45, 1.0) for _ in range(1000)]])
    assert [(s.code, s.gpu.index) for s in storm.fold([xid(79, 1.0, gpu=3), xid(45, 1.0, gpu=1)])] == [(79, 3), (45, 1)]


def test_a_flood_costs_signals_in_proportion_to_time_not_lines() -> None:
    storm = StormFolder(flush_s=1.0)
    out: list[Signal] = []
    for i in range(100_000):  # 100,000 lines over 10 s, the folder asked for summaries every 0.1 s
        at = i / 10_000
        out += storm.fold([xid(45, at)])
        if i % 1000 == 0:
            out += storm.due(at)
    out += storm.flush_all()
    assert total(out) == 100_000  # nothing lost, nothing counted twice
    assert len(out) <= storm.burst + 11


def test_a_short_burst_goes_out_at_once_so_a_threshold_rule_is_not_late() -> None:
    """Three XID 13 in one second reach the controller as three signals at once (the default rule
    decides on the third); the fifth is the first held back, and the storm's burst is not granted
    again until the key has been quiet for ``flush_s``."""
    storm = StormFolder(flush_s=1.0, burst=4)
    assert [s.count for s in storm.fold([xid(13, 5.0), xid(13, 5.1), xid(13, 5.2)])] == [1, 1, 1]
    assert len(storm.fold([xid(13, 5.3)])) == 1
    assert storm.fold([xid(13, 5.4), xid(13, 5.5)]) == []
    (summary,) = storm.due(6.3)
    assert summary.count == 2
    assert storm.fold([xid(13, 6.5)]) == []  # still the same storm: folded, no second burst
    assert [s.count for s in storm.due(7.3)] == [1]
    assert len(storm.fold([xid(13, 9.0), xid(13, 9.1)])) == 2  # quiet for a while: a new storm, a new burst


def test_state_signals_are_never_folded() -> None:
    storm = StormFolder(flush_s=1.0)
    hung = [Signal("n1", SignalKind.COLLECTOR_HUNG, code=c, source="gpu-poll", observed_at=1.0) for c in (1, 0, 1)]
    assert storm.fold(hung) == hung


def test_held_repeats_survive_a_restart_through_the_snapshot() -> None:
    storm = StormFolder(flush_s=1.0, burst=1)
    storm.fold([xid(13, 5.0), xid(13, 5.2), xid(13, 5.4)])
    assert storm.dirty
    saved = json.loads(json.dumps(storm.snapshot()))
    assert not storm.dirty
    again = StormFolder(flush_s=1.0)
    again.restore(saved)
    (summary,) = again.due(6.0)
    assert (summary.count, summary.first_observed_at, summary.observed_at, summary.gpu.uuid) == (2, 5.2, 5.4, "GPU-0")


def test_off_when_flush_is_zero_and_bounded_in_keys() -> None:
    assert len(StormFolder(flush_s=0).fold([xid(45, 1.0)] * 3)) == 3
    storm = StormFolder(flush_s=1.0, max_keys=2)
    first = storm.fold([xid(c, 1.0) for c in (1, 2, 3)])
    assert len(first) == 3 and len(storm.fold([xid(3, 1.1)])) == 1  # the third key was never tracked
