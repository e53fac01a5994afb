"""The kernel-log collector returns its cursor like every other collector: with the signals of the
lines before it (one spool write holds both), else at most every ``save_every_s``."""

from __future__ import annotations

from pathlib import Path

from agent.collectors import KernelLog
from agent.kernel_log import FileTail, KernelLogCollector
from agent.spool import Spool

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."


def collector(path: Path, saved: str | None = None, every_s: float = 3600.0) -> KernelLog:
    tail = FileTail(path, saved)
    lines = KernelLogCollector("n1", tail.read_lines, [], source="file")
    return KernelLog("n1", tail, lines, 0.1, "kernel-log:file", saved, save_every_s=every_s)


def test_the_cursor_comes_back_with_the_signals_of_the_lines_before_it(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("boot\n")
    kernel = collector(log)
    first = kernel.poll()  # the first read: where it stands is saved once
    assert first.signals == [] and set(first.cursors) == {"kernel-log:file"}
    assert kernel.poll().cursors == {}  # nothing read, nothing new to save
    with log.open("a") as f:
        f.write("an unrelated line\n")
    assert kernel.poll().cursors == {}  # moved, but no signal with it: not before save_every_s
    with log.open("a") as f:
        f.write(XID + "\n")
    polled = kernel.poll()
    assert [s.code for s in polled.signals] == [79]
    assert polled.cursors == {"kernel-log:file": kernel.source.cursor}


def test_an_agent_restarted_from_the_spools_cursor_reads_only_what_came_after(tmp_path: Path) -> None:
    log, spool = tmp_path / "kern.log", Spool(tmp_path / "spool.db")
    log.write_text(XID + "\n")
    kernel = collector(log, every_s=0.0)
    polled = kernel.poll()
    spool.append(polled.signals, polled.cursors)
    with log.open("a") as f:
        f.write(XID.replace(": 79,", ": 48,") + "\n")
    again = collector(log, spool.cursor("kernel-log:file"))
    assert [s.code for s in again.poll().signals] == [48]
