"""Where a hung job is stuck, from its ranks' faulthandler dumps (controller.jobs.stacks, pure)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from controller.jobs.stacks import HangClass, RankDump, place, wavefront

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
