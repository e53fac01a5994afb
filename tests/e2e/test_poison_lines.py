"""Poison kernel-log lines in a running agent's log: the agent reads on, an XID 79 after them gets the
node quarantined, and a restart (which reads the same lines again when the cursor was not yet saved)
does not crash either."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from gpus.simulated import simulated_gpus
from tests.e2e.processes import start_agent, start_controller
from tests.helpers import poll_until
from vigil.admin_client import AdminClient
from vigil.demo import xid_line

pytestmark = pytest.mark.e2e

BUS = simulated_gpus("node-p", 8)[2].pci_bus_id
POISON = [
    f"3,10,10,-;NVRM: Xid (PCI:{BUS}): {'9' * 5000}, pid=0, a code of 5,000 digits\n",  # past int()'s limit
    f"3,11,11,-;NVRM: Xid (PCI:{BUS}): {2**64}, pid=0, a code beyond 64 bits\n",  # protobuf refused it
    f"3,{'7' * 4400},12,-;NVRM: Xid (PCI:{BUS}): 13, pid={'1' * 4400}, huge sequence and pid\n",
    f"3,13,{'5' * 4400},-;NVRM: Xid (PCI:{BUS}): 43, pid=0, a huge timestamp\n",
]


def test_poison_lines_cost_nothing_but_themselves(tmp_path: Path) -> None:
    ctl, port = start_controller(tmp_path, 1)
    agent, kmsg = start_agent(tmp_path, "node-p", f"127.0.0.1:{port}", spool=tmp_path / "spool.db")
    admin = AdminClient(f"127.0.0.1:{port}")
    try:
        poll_until(lambda: any(n.node == "node-p" for n in admin.status().nodes), what="agent registered")
        with open(kmsg, "ab") as f:
            f.write("".join(POISON).encode() + b"\xff\xfe\x80 invalid UTF-8 NVRM: Xid (PCI:\xc3\x28\n")
            f.write(xid_line(BUS, 79, "GPU has fallen off the bus.", 20).encode())

        def health() -> str:
            return {n.node: n.health for n in admin.status().nodes}.get("node-p", "")

        poll_until(lambda: health() == "QUARANTINED", what="node-p quarantined after the poison")
        assert agent.poll() is None, (tmp_path / "node-p.log").read_text()[-2000:]
        (xid79,) = [i for i in admin.incidents(node="node-p") if i.code == 79]
        assert xid79.signal_count == 1

        # Killed before it saved its cursor past the poison, it must read the same lines again and live.
        agent.send_signal(signal.SIGKILL)
        agent.wait()
        with open(kmsg, "a") as f:
            f.write("".join(POISON))
            f.write(xid_line(simulated_gpus("node-p", 8)[5].pci_bus_id, 48, "double bit ECC error", 21))
        agent, _ = start_agent(tmp_path, "node-p", f"127.0.0.1:{port}", tmp_path / "spool.db", restart=True)
        poll_until(lambda: any(i.code == 48 for i in admin.incidents(node="node-p")), what="the XID 48 after restart")
        assert agent.poll() is None, (tmp_path / "node-p.log").read_text()[-2000:]
        unparsed = (tmp_path / "node-p.log").read_text().count('"kernel_log_unparsed"')
        assert unparsed >= 1  # the poison was seen, counted and skipped
    finally:
        admin.close()
        for proc in (agent, ctl):
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
