"""The agent's durable spool."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from agent.spool import Spool
from vigil.signals import GpuRef, Signal, SignalKind


def draft(code: int) -> Signal:
    return Signal("n1", SignalKind.XID, GpuRef(0, "GPU-x", "0000:18:00"), code, 0.0, f"xid {code}", "kmsg", 1.5)


def test_numbers_signals_and_keeps_them_across_reopen(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db")
    numbered = spool.append([draft(13), draft(79)])
    assert [s.seq for s in numbered] == [1, 2]
    spool_id = spool.spool_id
    spool.close()
    again = Spool(tmp_path / "s.db")
    assert again.spool_id == spool_id
    assert again.pending(after_seq=0) == numbered
    assert [s.seq for s in again.append([draft(48)])] == [3]


def test_ack_drops_up_to_seq_and_sequence_never_goes_back(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db")
    spool.append([draft(i) for i in range(5)])
    assert spool.ack(3) == 3
    assert [s.seq for s in spool.pending(after_seq=spool.acked_seq)] == [4, 5]
    assert spool.ack(2) == 0  # an old ack changes nothing
    assert spool.ack(99) == 2  # an ack beyond what was numbered is clamped
    assert spool.count() == 0
    spool.close()
    assert [s.seq for s in Spool(tmp_path / "s.db").append([draft(1)])] == [6]


def test_a_new_spool_file_gets_a_new_id(tmp_path: Path) -> None:
    assert Spool(tmp_path / "a.db").spool_id != Spool(tmp_path / "b.db").spool_id


def _append_and_die(path: str) -> None:
    Spool(Path(path)).append([draft(79)])
    os._exit(0)  # no clean close: what append returned must already be on disk


def test_appended_signal_survives_a_process_that_dies(tmp_path: Path) -> None:
    proc = multiprocessing.get_context("spawn").Process(target=_append_and_die, args=(str(tmp_path / "s.db"),))
    proc.start()
    proc.join(30)
    assert [s.code for s in Spool(tmp_path / "s.db").pending(after_seq=0)] == [79]


def low(n: int) -> Signal:
    return Signal("n1", SignalKind.THROTTLE, GpuRef(0), 8, float(n), "throttle", "gpu-poll", 1.0)


def test_a_full_spool_drops_oldest_low_severity_first(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", max_signals=10)
    spool.append([low(i) for i in range(8)])
    spool.append([draft(i) for i in range(6)])  # 14 > 10: the four oldest throttle signals go
    kept = spool.pending(after_seq=0)
    assert [s.kind for s in kept].count(SignalKind.XID) == 6
    assert [s.value for s in kept if s.kind is SignalKind.THROTTLE] == [4, 5, 6, 7]
    assert spool.dropped == {"THROTTLE": 4} and spool.dropped_faults == 0


def test_faults_are_kept_past_the_bound_and_counted_when_dropped(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", max_signals=5)
    spool.append([draft(i) for i in range(20)])
    assert spool.count() == 20 and spool.dropped_faults == 0  # faults outlive the soft bound
    spool.append([draft(100 + i) for i in range(3)])
    assert spool.count() == 20 and spool.dropped_faults == 3
    assert [s.code for s in spool.pending(after_seq=0)][:2] == [3, 4]  # the oldest went first
    spool.close()
    assert Spool(tmp_path / "s.db", max_signals=5).dropped_faults == 3  # and the count survives


def test_cursors_commit_with_their_signals(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db")
    assert spool.cursor("kmsg") is None
    spool.append([draft(79)], cursors={"kmsg": "boot-a:1234"})
    spool.append([], cursors={"gpu": "{}"})
    spool.close()
    again = Spool(tmp_path / "s.db")
    assert (again.cursor("kmsg"), again.cursor("gpu")) == ("boot-a:1234", "{}")


def test_a_spool_from_before_the_bound_is_upgraded_in_place(tmp_path: Path) -> None:
    import sqlite3

    db = sqlite3.connect(tmp_path / "old.db")
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE signals (seq INTEGER PRIMARY KEY, payload BLOB NOT NULL);"
        "INSERT INTO meta VALUES ('spool_id', 'abc'), ('next_seq', '1'), ('acked_seq', '0');"
    )
    db.close()
    spool = Spool(tmp_path / "old.db")
    assert spool.spool_id == "abc" and [s.seq for s in spool.append([draft(1)])] == [1]
