"""A quarantined node comes back on its own: hold-down, then its agent's health check, over real gRPC."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from gpus.simulated import simulated_gpus
from tests.e2e.processes import configured_controller, port_of, start_agent
from tests.helpers import poll_until
from vigil.admin_client import AdminClient
from vigil.demo import xid_line

pytestmark = pytest.mark.e2e


def test_released_after_hold_down_and_a_passing_check(tmp_path: Path) -> None:
    ctl = configured_controller(tmp_path, "ctl", pager="none", recovery={"hold_down_s": 1.5, "check_every_s": 1})
    port = port_of(tmp_path, "ctl")
    agent, kmsg = start_agent(tmp_path, "node-a", f"127.0.0.1:{port}")
    try:
        with AdminClient(f"127.0.0.1:{port}") as admin:
            poll_until(lambda: admin.status().nodes, what="agent registered")
            with open(kmsg, "a") as f:
                f.write(xid_line(simulated_gpus("node-a", 8)[1].pci_bus_id, 79, "GPU has fallen off the bus.", 1))
            poll_until(lambda: admin.status().nodes[0].health == "QUARANTINED", what="quarantined")
            poll_until(lambda: admin.status().nodes[0].health == "HEALTHY", what="released", timeout=30)
            (incident,) = admin.incidents(node="node-a")
            assert incident.status == "RESOLVED"
        log = (tmp_path / "ctl.log").read_text()
        assert "release_check_sent" in log and "vigil (automatic)" in log
    finally:
        for proc in (agent, ctl):
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
