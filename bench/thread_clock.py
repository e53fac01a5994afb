"""Where a process's threads spent chosen windows of wall time, from Linux's per-thread schedstat
(``/proc/<pid>/task/<tid>/schedstat``: time on a CPU, time waiting for one while ready to run)
sampled every few milliseconds in a process of its own.

For a process's main thread (a controller's or a relay's event loop) a window then splits in three:
it ran; it waited for a CPU (the machine busier than its cores); or it slept. Asleep, it was in its
poll with nothing due, or it waited for the GIL while another of its process's threads held it; a
window that should have ended at a timer and ended late while the loop slept is the GIL's. The other
threads' time on a CPU in the same window says which of them ran (each named by
``vigil_core.thread_names``; numbered threads of one kind summed: ``action_#``), and other
processes' (``relays*``, ``postgres*``: all their threads, in clock ticks) which of them took the
machine's CPUs meanwhile.

Reading about fifty files every 4 ms costs part of a core (it says how much): a benchmark takes it
only when asked (``bench.scale --thread-clock``) and says so with its figures.
"""

from __future__ import annotations

import bisect
import contextlib
import multiprocessing
import os
import re
import time
from array import array
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

EVERY_S = 0.004
RESCAN_S = 0.5  # new threads (an executor's, a scrape's) are found this often
LOOP = "loop"  # the main thread: tid == pid
TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


@dataclass
class _Thread:
    name: str
    first: int  # the index in the times of its first sample
    fd: int
    whole_process: bool = False  # /proc/<pid>/stat: all its threads' CPU, no wait (clock ticks)
    cpu: array[int] = field(default_factory=lambda: array("q"))
    wait: array[int] = field(default_factory=lambda: array("q"))

    def at(self, values: array[int], i: int) -> int:
        return values[min(max(i - self.first, 0), len(values) - 1)]

    def read(self) -> tuple[int, int]:
        """Its CPU and its wait for one so far, in ns."""
        text = os.pread(self.fd, 1024, 0)
        if self.whole_process:  # after the name in parentheses: state, ..., utime (12th), stime (13th)
            fields = text.rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) * TICK_NS, 0
        cpu, wait = text.split()[:2]
        return int(cpu), int(wait)


def kind(name: str, tid: int, pid: int) -> str:
    """A thread's kind: its name with numbers as ``#``; the main thread is the loop. Pure."""
    return LOOP if tid == pid else re.sub(r"\d+", "#", name)


def threads_cpu_ns(pid: int, proc: Path = Path("/proc")) -> dict[int, tuple[str, int]]:
    """Each live thread of ``pid``: its kind (``kind``) and its CPU so far, in ns (schedstat); {}
    where the process is gone. One read of each thread, for a phase's totals (``cpu_by_kind_s``)."""
    out: dict[int, tuple[str, int]] = {}
    with contextlib.suppress(OSError):
        for task in (proc / str(pid) / "task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                tid = int(task.name)
                name = kind((task / "comm").read_text().strip(), tid, pid)
                out[tid] = (name, int((task / "schedstat").read_text().split()[0]))
    return out


def cpu_by_kind_s(
    before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]], process_cpu_s: float
) -> dict[str, float]:
    """Each thread kind's CPU between two ``threads_cpu_ns``, in s, largest first (a thread started
    between them counts from nothing); ``gone``: what the process spent in threads that ended
    between them, from its whole CPU over the same span (``process_cpu_s``). Pure."""
    spent: dict[str, float] = {}
    for tid, (name, ns) in after.items():
        spent[name] = spent.get(name, 0.0) + (ns - before.get(tid, (name, 0))[1]) / 1e9
    spent["gone"] = max(process_cpu_s - sum(spent.values()), 0.0)
    return {k: round(v, 1) for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}


class _Samples:
    def __init__(self, pid: int, proc: Path, others: dict[str, list[int]], by_name: tuple[str, ...] = ()) -> None:
        self.pid, self.proc = pid, proc
        self.times: array[float] = array("d")
        self.threads: dict[int | str, _Thread] = {}
        self._live: dict[int | str, _Thread] = {}
        self._others = others  # other processes, each kind's pids: their whole CPU, as "<kind>*"
        self._by_name = by_name  # and every process whose name is one of these (a database's), likewise
        self._not_named: set[str] = set()

    def rescan(self) -> None:
        self._rescan_threads()
        wanted = [(group, pid) for group, pids in self._others.items() for pid in pids]
        if self._by_name:
            with contextlib.suppress(OSError):
                for entry in self.proc.iterdir():
                    if entry.name.isdigit() and entry.name not in self._not_named:
                        with contextlib.suppress(OSError):
                            name = (entry / "comm").read_text().strip()
                            if name in self._by_name:
                                wanted.append((name, int(entry.name)))
                            else:
                                self._not_named.add(entry.name)
        for name, pid in wanted:
            if f"p{pid}" not in self.threads:
                self._track(f"p{pid}", f"{name}*", self.proc / str(pid) / "stat", whole_process=True)

    def _rescan_threads(self) -> None:
        with contextlib.suppress(OSError):
            for task in (self.proc / str(self.pid) / "task").iterdir():
                tid = int(task.name)
                if tid not in self.threads:
                    with contextlib.suppress(OSError):
                        name = kind((task / "comm").read_text().strip(), tid, self.pid)
                        self._track(tid, name, task / "schedstat")

    def _track(self, key: int | str, name: str, path: Path, whole_process: bool = False) -> None:
        """Sample ``path`` from the next sample on (a thread or process gone already: nothing)."""
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY)
            self.threads[key] = self._live[key] = _Thread(name, len(self.times), fd, whole_process)

    def sample(self) -> None:
        self.times.append(time.time())
        for tid, thread in list(self._live.items()):
            try:
                cpu, wait = thread.read()
                thread.cpu.append(cpu)
                thread.wait.append(wait)
            except (OSError, ValueError, IndexError):  # gone: its last sample stands
                os.close(thread.fd)
                del self._live[tid]
                if not thread.cpu:
                    del self.threads[tid]

    def spent(self, start: float, end: float) -> dict[str, float]:
        """Each kind's ms on a CPU between ``start`` and ``end`` (the samples around them), the loop's
        wait for a CPU and its sleep, and the span the samples cover."""
        if len(self.times) < 2:
            return {}
        i0 = max(bisect.bisect_right(self.times, start) - 1, 0)
        i1 = min(bisect.bisect_left(self.times, end), len(self.times) - 1)
        out: dict[str, float] = {"span_ms": (self.times[i1] - self.times[i0]) * 1000}
        for thread in self.threads.values():
            ran = (thread.at(thread.cpu, i1) - thread.at(thread.cpu, i0)) / 1e6
            out[thread.name] = out.get(thread.name, 0.0) + ran
            if thread.name == LOOP:
                out["loop_waited_for_cpu"] = (thread.at(thread.wait, i1) - thread.at(thread.wait, i0)) / 1e6
        if LOOP in out:  # never a whole window said slept for a loop that was not sampled
            out["loop_slept"] = out["span_ms"] - out[LOOP] - out["loop_waited_for_cpu"]
        return {k: round(v, 1) for k, v in out.items()}


def _run(
    conn: Connection, pid: int, every_s: float, proc: Path, others: dict[str, list[int]], by_name: tuple[str, ...]
) -> None:
    samples = _Samples(pid, proc, others, by_name)
    rescanned = 0.0
    while True:
        if time.monotonic() - rescanned > RESCAN_S:
            samples.rescan()
            rescanned = time.monotonic()
        samples.sample()
        if conn.poll(every_s):
            windows = conn.recv()
            if windows is None:
                return
            spent = [samples.spent(start, end) for start, end in windows]
            conn.send((spent, round(sum(os.times()[:2]), 1)))  # and this process's own CPU, s


class ThreadClock:
    """Samples ``pid``'s threads, and the whole CPU of the ``others`` (each kind's pids) and of every
    process named one of ``by_name``, from now until ``stop``; ``spent`` asks where windows went."""

    def __init__(
        self,
        pid: int,
        others: dict[str, list[int]] | None = None,
        by_name: tuple[str, ...] = (),
        every_s: float = EVERY_S,
        proc: Path = Path("/proc"),
    ) -> None:
        self._conn, theirs = multiprocessing.Pipe()
        self._process = multiprocessing.get_context("spawn").Process(
            target=_run, args=(theirs, pid, every_s, proc, others or {}, by_name), daemon=True
        )
        self._process.start()
        self.own_cpu_s = 0.0  # the clock's own CPU, known once spent was asked

    def spent(self, windows: list[tuple[float, float]]) -> list[dict[str, float]]:
        """For each (start, end) in wall-clock seconds: ``_Samples.spent``."""
        self._conn.send(windows)
        spent, self.own_cpu_s = self._conn.recv()
        return list(spent)

    def stop(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self._conn.send(None)
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()


def held_up(spent: list[dict[str, float]], settle_ms: float, over_ms: float) -> dict[str, object]:
    """From each probe's settling window (from its incident opened to its sleep over; ``spent`` of
    each): of the windows that ended more than ``over_ms`` past the sleep's own ``settle_ms``, their
    count, how long past it in all, and where the time went, summed (ms); and the same for every
    window, to compare. Pure."""

    def total(windows: list[dict[str, float]]) -> dict[str, float]:
        summed: dict[str, float] = {}
        for w in windows:
            for k, v in w.items():
                summed[k] = summed.get(k, 0.0) + v
        return {k: round(v, 1) for k, v in sorted(summed.items(), key=lambda kv: -kv[1])}

    late = [w for w in spent if w.get("span_ms", 0.0) > settle_ms + over_ms]
    return {
        "windows": len(spent),
        "late": len(late),
        "late_past_settle_ms": round(sum(w["span_ms"] - settle_ms for w in late), 1),
        "late_spent_ms": total(late),
        "all_spent_ms": total(spent),
    }
