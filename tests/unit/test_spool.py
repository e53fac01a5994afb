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
