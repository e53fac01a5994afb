"""Where a hung job is stuck, from its ranks' faulthandler dumps (controller.jobs.stacks, pure)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.jobs.stacks import Collective, HangClass, RankDump, collective_front, kernel_reading, place, wavefront
from trainer_hooks.collectives import last_collectives
from vigil.launch import kernel_view

# As faulthandler writes it on a signal: the reporter thread, then the training thread (the
# program's, <module> at its bottom) waiting in a gloo all_gather inside the hook's exchange.
WAITING = """Thread 0x00007f2a4e7fc640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/work/trainer_hooks/reporter.py", line 63 in _run
  File "/usr/lib/python3.11/threading.py", line 975 in run
  File "/usr/lib/python3.11/threading.py", line 1038 in _bootstrap_inner
  File "/usr/lib/python3.11/threading.py", line 995 in _bootstrap

Current thread 0x00007f2a5f1b7740 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3910 in all_gather
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/work/trainer_hooks/hook.py", line 262 in _exchange
  File "/work/trainer_hooks/hook.py", line 231 in step_end
  File "/work/trainer_hooks/moe_job/train.py", line 147 in main
  File "/work/trainer_hooks/moe_job/train.py", line 210 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "<frozen runpy>", line 198 in _run_module_as_main
"""
READING = WAITING.replace(
    """  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3910 in all_gather
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/work/trainer_hooks/hook.py", line 262 in _exchange
  File "/work/trainer_hooks/hook.py", line 231 in step_end""",
    """  File "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 1133 in _next_data
  File "/work/trainer_hooks/moe_job/data.py", line 88 in batch""",
)


def test_the_rank_outside_the_collective_is_the_culprit_and_says_where() -> None:
    found = wavefront([RankDump(0, "node-a", True, WAITING), RankDump(1, "node-b", True, READING)])
    assert found.verdict is HangClass.IO and found.waiting == 1
    (culprit,) = found.culprits
    assert (culprit.rank, culprit.node, culprit.where) == (1, "node-b", "data.py:88 in batch")
    assert "rank 1 on node-b at data.py:88 in batch" in found.describe()


def test_a_rank_that_does_not_answer_is_the_host() -> None:
    found = wavefront([RankDump(0, "node-a", True, WAITING), RankDump(1, "node-b", False)])
    assert found.verdict is HangClass.HOST and [c.rank for c in found.culprits] == [1]
    assert "no answer (stopped or frozen)" in found.describe()


def test_every_rank_in_the_collective_is_the_network_or_a_gpu() -> None:
    found = wavefront([RankDump(r, f"node-{r}", True, WAITING) for r in range(4)])
    assert found.verdict is HangClass.COLLECTIVE and found.culprits == () and found.waiting == 4
    assert wavefront([]).verdict is HangClass.UNKNOWN
    alone = wavefront([RankDump(0, "node-a", True, READING)])  # nobody waits: nothing singles it out
    assert alone.verdict is HangClass.UNKNOWN


def test_a_real_faulthandler_dump_of_a_sleeping_program_is_read(tmp_path: Path) -> None:
    out = tmp_path / "rank1.txt"
    program = (
        "import faulthandler, signal, threading, time\n"
        f"f = open({str(out)!r}, 'a')\n"
        "faulthandler.register(signal.SIGUSR2, file=f, all_threads=True)\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "def stuck():\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
        "stuck()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while not out.read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
    text = out.read_text()
    rank = place(RankDump(1, "node-b", True, text))
    assert not rank.in_collective and rank.where.startswith("<string>:") and rank.where.endswith(" in stuck"), text
    found = wavefront([RankDump(0, "node-a", True, WAITING), RankDump(1, "node-b", True, text)])
    assert found.verdict is HangClass.APPLICATION and [c.rank for c in found.culprits] == [1]


# A read in C leaves no Python frame of its own: the rank's innermost frame is the job's own code.
READING_IN_C = WAITING.replace(
    """  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3910 in all_gather
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/work/trainer_hooks/hook.py", line 262 in _exchange
  File "/work/trainer_hooks/hook.py", line 231 in step_end""",
    """  File "/work/trainer_hooks/moe_job/data.py", line 61 in load_shard""",
)


@pytest.mark.parametrize(
    ("state", "kernel_wait", "verdict"),
    [
        ("S", "anon_pipe_read", HangClass.IO),  # a FIFO, as a data loader's pipe
        ("S", "pipe_read", HangClass.IO),
        ("D", "rpc_wait_bit_killable", HangClass.IO),  # a dead NFS mount
        ("D", "", HangClass.IO),  # uninterruptible: waiting on I/O
        ("S", "sk_wait_data", HangClass.IO),  # a socket
        ("S", "hrtimer_nanosleep", HangClass.APPLICATION),  # a sleep in its own code
        ("S", "futex_wait_queue", HangClass.APPLICATION),  # a lock
        ("", "", HangClass.APPLICATION),  # /proc did not say
    ],
)
def test_the_kernels_view_tells_a_read_in_c_from_the_jobs_own_code(
    state: str, kernel_wait: str, verdict: HangClass
) -> None:
    dumps = [RankDump(0, "node-a", True, WAITING), RankDump(1, "node-b", True, READING_IN_C, state, kernel_wait)]
    found = wavefront(dumps)
    assert found.verdict is verdict
    (culprit,) = found.culprits
    assert culprit.where.startswith("data.py:61 in load_shard")
    assert (f"(kernel: {kernel_wait})" in culprit.where) is bool(kernel_wait)


def test_a_silent_rank_says_what_the_kernel_says_of_it() -> None:
    found = wavefront([RankDump(0, "node-a", True, WAITING), RankDump(1, "node-b", False, "", "T", "do_signal_stop")])
    assert found.verdict is HangClass.HOST
    assert "rank 1 on node-b: no answer (stopped or frozen; kernel state T, do_signal_stop)" in found.describe()


@pytest.mark.skipif(not Path("/proc/self/wchan").exists(), reason="needs Linux's /proc (the launcher reads it there)")
def test_the_launcher_reads_a_real_ranks_kernel_view(tmp_path: Path) -> None:
    fifo = tmp_path / "stuck.fifo"
    os.mkfifo(fifo)
    program = f"import os\nprint('ready', flush=True)\nos.read(os.open({str(fifo)!r}, os.O_RDWR), 1)\n"
    proc = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        deadline = time.monotonic() + 10
        while "pipe" not in kernel_view(proc.pid).get("kernel_wait", "") and time.monotonic() < deadline:
            time.sleep(0.02)
        reading = kernel_view(proc.pid)
        proc.send_signal(signal.SIGSTOP)
        while kernel_view(proc.pid).get("state") != "T" and time.monotonic() < deadline:
            time.sleep(0.02)
        stopped = kernel_view(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert reading["state"] == "S" and kernel_reading(reading["state"], reading["kernel_wait"]), reading
    assert stopped["state"] == "T"
    assert kernel_view(proc.pid) == {}  # gone


def test_the_flight_recorders_say_who_never_entered_the_collective_the_others_wait_in() -> None:
    def fr(*rows: tuple[str, int, bool]) -> tuple[Collective, ...]:
        return tuple(Collective(group, seq, "gloo:all_reduce", done) for group, seq, done in rows)

    behind = [
        RankDump(0, "node-a", True, WAITING, collectives=fr(("default_pg", 226, False), ("hook", 40, True))),
        RankDump(1, "node-b", True, READING, collectives=fr(("default_pg", 225, True), ("hook", 40, True))),
        RankDump(2, "node-c", True, WAITING, collectives=fr(("default_pg", 226, False), ("hook", 40, True))),
    ]
    said = collective_front(behind)
    assert said == "default_pg: rank 1 never entered gloo:all_reduce #226, which 2 rank(s) wait in"
    assert wavefront(behind).describe().endswith(f"(flight recorder: {said})")
    stalled = [RankDump(r, f"node-{r}", True, WAITING, collectives=fr(("default_pg", 7, False))) for r in range(4)]
    assert collective_front(stalled) == "default_pg: all 4 ranks entered gloo:all_reduce #7, and it does not complete"
    done = [RankDump(r, f"node-{r}", True, WAITING, collectives=fr(("default_pg", 7, True))) for r in range(2)]
    assert collective_front(done) == "" and collective_front([RankDump(0, "n", True, WAITING)]) == ""


def test_a_flight_recorder_dump_becomes_each_groups_last_collective() -> None:
    trace = {
        "entries": [
            {"collective_seq_id": 3, "process_group": ["0", "default_pg"], "profiling_name": "gloo:all_reduce",
             "retired": True, "state": "scheduled", "is_p2p": False},
            {"collective_seq_id": 4, "process_group": ["0", "default_pg"], "profiling_name": "gloo:all_gather",
             "retired": False, "state": "scheduled", "is_p2p": False},
            {"collective_seq_id": 0, "process_group": ["0", "default_pg"], "profiling_name": "gloo:recv",
             "retired": False, "state": "scheduled", "is_p2p": True},
            {"collective_seq_id": 9, "process_group": ["1", ""], "profiling_name": "gloo:broadcast",
             "retired": False, "state": "completed", "is_p2p": False},
        ]
    }  # fmt: skip
    assert last_collectives(trace) == [
        {"group": "1", "seq": 9, "op": "gloo:broadcast", "completed": True},
        {"group": "default_pg", "seq": 4, "op": "gloo:all_gather", "completed": False},
    ]
    assert last_collectives({}) == []
