import os
from pathlib import Path

import pytest

from bench.thread_clock import _Samples, cpu_by_kind_s, held_up, kind, threads_cpu_ns

PID = 100


def _thread(proc: Path, tid: int, name: str, cpu_ns: int, wait_ns: int) -> None:
    task = proc / str(PID) / "task" / str(tid)
    task.mkdir(parents=True, exist_ok=True)
    (task / "comm").write_text(name + "\n")
    (task / "schedstat").write_text(f"{cpu_ns} {wait_ns} 7\n")


def _process(proc: Path, pid: int, name: str, ticks: int) -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "comm").write_text(name.split()[0] + "\n")
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    (proc / str(pid) / "stat").write_text(f"{pid} ({name}) S 1 1 1 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0 1\n")


def test_kinds_sum_numbered_threads_and_name_the_main_thread_the_loop() -> None:
    assert kind("action_3", 101, PID) == "action_#"
    assert kind("python", PID, PID) == "loop"
    assert kind("write-behind", 102, PID) == "write-behind"


def test_a_window_splits_the_loops_time_into_ran_waited_and_slept_and_says_who_else_ran(tmp_path: Path) -> None:
    ms = 1_000_000
    _thread(tmp_path, PID, "vigil", 0, 0)
    _thread(tmp_path, 101, "write-behind", 0, 0)
    _thread(tmp_path, 102, "action_0", 0, 0)
    _process(tmp_path, 200, "vigil relay", 0)
    _process(tmp_path, 300, "postgres", 0)
    _process(tmp_path, 301, "bash", 0)
    samples = _Samples(PID, tmp_path, {"relays": [200]}, by_name=("postgres",))
    samples.rescan()
    samples.sample()
    samples.times[-1] = 10.0
    # 100 ms later: the loop ran 10 ms and waited 30 ms for a CPU; the writer ran 55 ms
    _thread(tmp_path, PID, "vigil", 10 * ms, 30 * ms)
    _thread(tmp_path, 101, "write-behind", 55 * ms, 0)
    _thread(tmp_path, 103, "action_1", 0, 0)  # started now: found by the next rescan
    _process(tmp_path, 200, "vigil relay", 2)  # two clock ticks
    _process(tmp_path, 300, "postgres", 3)
    _process(tmp_path, 301, "bash", 4)
    samples.rescan()
    samples.sample()
    samples.times[-1] = 10.1
    _thread(tmp_path, 102, "action_0", 4 * ms, 0)
    _thread(tmp_path, 103, "action_1", 3 * ms, 0)
    samples.sample()
    samples.times[-1] = 10.2

    first = samples.spent(10.0, 10.1)
    assert first["span_ms"] == pytest.approx(100.0)
    assert first["loop"] == 10.0 and first["loop_waited_for_cpu"] == 30.0
    assert first["loop_slept"] == pytest.approx(60.0)
    assert first["write-behind"] == 55.0 and first["action_#"] == 0.0
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    assert first["relays*"] == 2 * tick_ms and first["postgres*"] == 3 * tick_ms  # whole processes
    assert "bash*" not in first
    second = samples.spent(10.05, 10.15)  # widened to the samples around it: 10.0 .. 10.2
    assert second["span_ms"] == pytest.approx(200.0)
    assert second["action_#"] == 7.0  # both executor threads, one of them begun within it


def test_a_thread_gone_keeps_its_last_sample(tmp_path: Path) -> None:
    _thread(tmp_path, PID, "vigil", 0, 0)
    _thread(tmp_path, 101, "Thread-12 (proc", 5_000_000, 0)
    samples = _Samples(PID, tmp_path, {})
    samples.rescan()
    samples.sample()
    (tmp_path / str(PID) / "task" / "101" / "schedstat").write_text("")  # unreadable now: gone
    samples.sample()
    assert samples.spent(0, 1e12)["Thread-# (proc"] == 0.0


def test_held_up_sums_the_windows_that_ended_late_beside_all_of_them() -> None:
    spent = [
        {"span_ms": 32.0, "loop": 5.0, "loop_slept": 27.0},
        {"span_ms": 130.0, "loop": 20.0, "loop_waited_for_cpu": 90.0, "loop_slept": 20.0, "write-behind": 40.0},
        {"span_ms": 90.0, "loop": 10.0, "loop_waited_for_cpu": 10.0, "loop_slept": 70.0, "write-behind": 60.0},
    ]
    held = held_up(spent, settle_ms=30, over_ms=20)
    assert held["windows"] == 3 and held["late"] == 2
    assert held["late_past_settle_ms"] == 160.0
    late = held["late_spent_ms"]
    assert isinstance(late, dict)
    assert late["write-behind"] == 100.0 and late["loop_waited_for_cpu"] == 100.0 and late["loop_slept"] == 90.0
    assert list(late)[0] == "span_ms"  # largest first
    all_ = held["all_spent_ms"]
    assert isinstance(all_, dict) and all_["loop"] == 35.0


def test_a_loop_not_sampled_is_never_said_to_have_slept(tmp_path: Path) -> None:
    _thread(tmp_path, 101, "write-behind", 0, 0)  # the main thread's files unreadable: only another thread
    samples = _Samples(PID, tmp_path, {})
    samples.rescan()
    samples.sample()
    samples.sample()
    spent = samples.spent(0, 1e12)
    assert "loop_slept" not in spent and "loop" not in spent and spent["write-behind"] == 0.0


def test_a_phases_cpu_splits_by_thread_kind_with_new_threads_from_nothing_and_ended_ones_as_gone(
    tmp_path: Path,
) -> None:
    s = 1_000_000_000
    _thread(tmp_path, PID, "vigil", 1 * s, 0)
    _thread(tmp_path, 101, "write-behind", 2 * s, 0)
    _thread(tmp_path, 102, "action_0", 1 * s, 0)
    before = threads_cpu_ns(PID, tmp_path)
    assert before[PID] == ("loop", 1 * s)
    _thread(tmp_path, PID, "vigil", 5 * s, 0)
    _thread(tmp_path, 101, "write-behind", 3 * s, 0)
    _thread(tmp_path, 103, "action_1", 2 * s, 0)  # started since; action_0 ended
    for f in (tmp_path / str(PID) / "task" / "102").iterdir():
        f.unlink()
    (tmp_path / str(PID) / "task" / "102").rmdir()
    after = threads_cpu_ns(PID, tmp_path)
    assert cpu_by_kind_s(before, after, process_cpu_s=7.5) == {
        "loop": 4.0,
        "action_#": 2.0,
        "gone": 0.5,
        "write-behind": 1.0,
    }
    assert list(cpu_by_kind_s(before, after, 7.5))[0] == "loop"
    assert threads_cpu_ns(999, tmp_path) == {}
