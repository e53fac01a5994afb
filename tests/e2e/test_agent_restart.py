"""An agent killed (SIGKILL) in the middle of a stream of kernel-log faults and started again
neither loses a fault nor reports one twice: its kernel-log cursor, GPU fault baseline and the
repeats its storm folder holds are committed with the signals, in the spool."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from gpus.simulated import simulated_gpus
from tests.e2e.processes import start_controller, vigil
from tests.helpers import poll_until
from vigil.demo import xid_line

pytestmark = pytest.mark.e2e
LINES = 300


def start_agent(tmp: Path, port: int, kmsg: Path, run: int):  # type: ignore[no-untyped-def]
    return vigil(
        "agent", "--plaintext", "--gpu-backend", "simulated", "--node", "node-r", "--controller", f"127.0.0.1:{port}",
        "--kernel-log", str(kmsg), "--spool", str(tmp / "spool.db"), "--metrics-port", "0",
        "--log-format", "json", out=tmp / f"agent{run}.out",
    )  # fmt: skip


def stored(db: Path) -> list[tuple[str, int]]:
    """The controller's XID signals of node-r in the agent's order: (message, observations)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        query = "SELECT message, count FROM signals WHERE node = 'node-r' AND kind = 'XID' ORDER BY spool_id, seq"
        return [(row[0], row[1]) for row in conn.execute(query)]


def observations(db: Path) -> int:
    return sum(count for _, count in stored(db))


def test_agent_killed_mid_stream_neither_loses_nor_double_reports(tmp_path: Path) -> None:
    ctl, port = start_controller(tmp_path, 1)
    kmsg = tmp_path / "node-r.kmsg"
    kmsg.write_text("")
    agent = start_agent(tmp_path, port, kmsg, 1)
    gpu = simulated_gpus("node-r", 8)[1]
    written = threading.Event()

    def write_faults() -> None:
        with open(kmsg, "a") as f:
            for i in range(LINES):
                # XID 43 is record-only, so a flood of them changes no node's health.
                f.write(xid_line(gpu.pci_bus_id, 43, f"fault number {i}", i + 1))
                f.flush()
                time.sleep(0.004)
        written.set()

    try:
        poll_until(lambda: "agent_started" in (tmp_path / "agent1.log").read_text(), what="agent up")
        time.sleep(0.3)  # let it take its first look at the log (it starts at the end)
        writer = threading.Thread(target=write_faults)
        writer.start()
        poll_until(lambda: observations(tmp_path / "ctl.db") >= LINES // 4, what="a quarter delivered")
        agent.send_signal(signal.SIGKILL)
        agent.wait()
        time.sleep(0.3)  # faults keep coming while the agent is down
        agent = start_agent(tmp_path, port, kmsg, 2)
        writer.join()
        poll_until(lambda: observations(tmp_path / "ctl.db") >= LINES, timeout=30, what="all delivered")
        time.sleep(1.5)  # anything repeated would arrive now
        # Each signal is a line, or (folded at the agent) a line and the repeats after it: the next
        # signal must start exactly where the last one's count ends. Every line exactly once, in order.
        expected = 0
        for message, count in stored(tmp_path / "ctl.db"):
            assert int(message.rsplit("fault number ", 1)[1]) == expected
            expected += count
        assert expected == LINES
    finally:
        for proc in (agent, ctl):
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
