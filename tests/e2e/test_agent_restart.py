"""An agent killed (SIGKILL) in the middle of a stream of kernel-log faults and started again
neither loses a fault nor reports one twice: its kernel-log cursor and GPU fault baseline are
committed with the signals, in the spool."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from agent.simulated import simulated_gpus
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


def stored_messages(db: Path) -> list[str]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return [row[0] for row in conn.execute("SELECT message FROM signals WHERE node = 'node-r' AND kind = 'XID'")]


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
        poll_until(lambda: len(stored_messages(tmp_path / "ctl.db")) >= LINES // 4, what="a quarter delivered")
        agent.send_signal(signal.SIGKILL)
        agent.wait()
        time.sleep(0.3)  # faults keep coming while the agent is down
        agent = start_agent(tmp_path, port, kmsg, 2)
        writer.join()
        poll_until(lambda: len(stored_messages(tmp_path / "ctl.db")) >= LINES, timeout=30, what="all delivered")
        time.sleep(1.0)  # anything repeated would arrive now
        messages = stored_messages(tmp_path / "ctl.db")
        numbers = sorted(int(m.rsplit("fault number ", 1)[1]) for m in messages)
        assert numbers == list(range(LINES))  # each exactly once
    finally:
        for proc in (agent, ctl):
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
