"""The agent's durable spool."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from agent.spool import Spool
from vigil_core.signals import GpuRef, Signal, SignalKind


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
    """A throttle report of GPU ``n``: low severity, and no two of them repeats of each other."""
    return Signal("n1", SignalKind.THROTTLE, GpuRef(n), 8, float(n), "throttle", "gpu-poll", 1.0)


def xid_on(gpu: int, code: int, at: float = 1.5) -> Signal:
    return Signal("n1", SignalKind.XID, GpuRef(gpu, f"GPU-{gpu}", ""), code, 0.0, f"xid {code}", "kmsg", at)


def test_a_full_spool_drops_oldest_low_severity_first(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", max_signals=10)
    spool.append([low(i) for i in range(8)])
    spool.append([xid_on(i, 13) for i in range(6)])  # 14 > 10: down to 9, the oldest throttles first
    kept = spool.pending(after_seq=0)
    assert [s.kind for s in kept].count(SignalKind.XID) == 6
    assert [s.value for s in kept if s.kind is SignalKind.THROTTLE] == [5, 6, 7]
    assert spool.dropped == {"THROTTLE": 5} and spool.dropped_faults == 0


def test_repeats_are_merged_before_anything_is_dropped(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", max_signals=10)
    spool.append([xid_on(0, 45, at=float(i)) for i in range(12)])
    (merged,) = spool.pending(after_seq=0)
    assert (merged.code, merged.count, merged.first_observed_at, merged.observed_at) == (45, 12, 0.0, 11.0)
    assert merged.seq == 1 and spool.merged == 11 and not spool.dropped


def test_the_root_cause_outlives_a_flood_of_follow_up_errors(tmp_path: Path) -> None:
    """XID 79, then thousands of other XIDs: the 79 is never what goes, and the loss is counted exactly."""
    spool = Spool(tmp_path / "s.db", max_signals=10)
    spool.append([xid_on(0, 79)])
    spool.append([xid_on(0, 1000 + i) for i in range(30)])  # all different: nothing to merge
    kept = spool.pending(after_seq=0)
    assert kept[0].code == 79 and len(kept) == 9
    assert [s.code for s in kept[1:]] == [1000 + i for i in range(22, 30)]  # the newest others
    assert spool.dropped == {"XID": 22} and spool.dropped_faults == 22


def test_only_signals_waiting_to_be_sent_count_toward_the_bound(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", max_signals=10)
    spool.append([xid_on(i, 13) for i in range(8)])
    assert len(spool.take(after_seq=0)) == 8  # on the wire, waiting for the controller's ack: never dropped
    spool.append([xid_on(i, 31) for i in range(8)])
    assert spool.count() == 16 and not spool.dropped
    # The stream broke: the 8 are sent again as they were (the controller may hold them already),
    # still never dropped; the bound applies to what was never handed to the link.
    spool.append([xid_on(9, 43)] + [xid_on(10 + i, 43) for i in range(3)])
    assert spool.waiting() == 9 and spool.dropped_faults == 3
    assert [s.code for s in spool.pending(after_seq=0)][:8] == [13] * 8
    assert [s.code for s in spool.pending(after_seq=8)][:1] == [31]


def test_faults_to_keep_are_dropped_only_far_past_the_bound_and_counted(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", max_signals=5)
    spool.append([xid_on(i, 79) for i in range(20)])
    assert spool.count() == 20 and spool.dropped_faults == 0  # faults to keep outlive the soft bound
    spool.append([xid_on(20 + i, 48) for i in range(3)])
    assert spool.count() == 20 and spool.dropped_faults == 3
    assert {s.code for s in spool.pending(after_seq=0)} == {79}  # the newest went
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
    assert spool.damage == ""


def test_a_garbage_spool_is_moved_aside_and_said_aloud(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    Spool(path).close()
    path.write_bytes(b"this is not a database" * 100)
    spool = Spool(path)
    assert "could not be used" in spool.damage and str(path) in spool.damage
    aside = [p.name for p in tmp_path.iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1 and spool.append([draft(79)])[0].seq == 1  # and it works again


def test_a_truncated_spool_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    spool = Spool(path)
    spool.append([draft(i) for i in range(2000)])
    spool.close()
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"s.db{suffix}").unlink(missing_ok=True)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    assert "moved aside" in Spool(path).damage


def test_a_spool_emptied_behind_sqlites_back_is_noticed(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    old = Spool(path)
    old.append([draft(79)])
    old.close()
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"s.db{suffix}").unlink(missing_ok=True)
    path.write_bytes(b"")  # truncated to zero: SQLite takes it for a new database
    again = Spool(path)
    assert again.spool_id != old.spool_id and old.spool_id in again.damage and "lost" in again.damage
    again.close()
    assert Spool(path).damage == ""  # said once: the marker now names the new spool


def test_a_spool_that_went_back_is_renumbered_after_what_the_controller_holds(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db")
    spool.append([draft(13), draft(79)])
    assert spool.renumber_after(40) == 2
    assert [s.seq for s in spool.pending(after_seq=40)] == [41, 42]
    assert spool.acked_seq == 40 and [s.seq for s in spool.append([draft(48)])] == [43]


def test_another_nodes_spool_is_set_aside_with_what_it_held(tmp_path: Path) -> None:
    """A cloned disk or a renamed node: the controller would refuse every signal of node-a's spool
    from node-b's agent, for good. Moved aside, said (with its count), and a spool of node-b's own."""
    path = tmp_path / "s.db"
    mine = Spool(path, node="node-a")
    mine.append([draft(13), draft(79)])
    first_id = mine.spool_id
    mine.close()
    again = Spool(path, node="node-a")
    assert again.damage == "" and again.spool_id == first_id  # its own node: nothing to say
    again.close()
    other = Spool(path, node="node-b")
    assert "node 'node-a''s spool, this agent is 'node-b'" in other.damage
    assert "2 unacknowledged signal(s)" in other.damage
    assert other.spool_id != first_id and other.pending(after_seq=0) == []
    assert len([p for p in tmp_path.iterdir() if ".damaged-" in p.name and p.name.endswith(tuple("0123456789"))]) == 1


def test_the_faults_waiting_are_those_kept_above_all_not_yet_acknowledged(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db")
    assert spool.urgent_waiting() == 0
    spool.append([xid_on(0, 79), low(1), xid_on(1, 63), xid_on(2, 48)])  # 79 and 48: what the policy quarantines on
    assert spool.urgent_waiting() == 2
    spool.ack(1)  # the XID 79 delivered
    assert spool.urgent_waiting() == 1
    spool.ack(4)
    assert spool.urgent_waiting() == 0
