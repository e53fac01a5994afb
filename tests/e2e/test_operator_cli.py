"""The operator's commands against a running controller: status, incidents, resume, uncordon, resolve."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpus.simulated import simulated_gpus
from tests.e2e.processes import configured_controller, port_of, start_agent
from tests.helpers import poll_until
from vigil.admin_client import AdminClient
from vigil.demo import xid_line

pytestmark = pytest.mark.e2e


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    wide = {**os.environ, "COLUMNS": "200"}  # rich wraps tables to the terminal's width
    return subprocess.run([sys.executable, "-m", "vigil", *args], capture_output=True, text=True, timeout=60, env=wide)


def test_operator_commands(tmp_path: Path) -> None:
    ctl = configured_controller(
        tmp_path,
        "ctl",
        pager="none",
        guardrails={"breaker_max_nodes": 1, "breaker_max_fraction": 1.0, "breaker_page_delay_s": 0},
        recovery={"auto_release": False},
    )
    procs = [ctl]
    try:
        target = f"127.0.0.1:{port_of(tmp_path, 'ctl')}"
        kmsgs = {}
        for node in ("node-a", "node-b", "node-c"):
            proc, kmsgs[node] = start_agent(tmp_path, node, target)
            procs.append(proc)
        with AdminClient(target) as admin:
            poll_until(lambda: len(admin.status().nodes) == 3, what="three agents")
            for node in ("node-a", "node-b"):
                with open(kmsgs[node], "a") as f:
                    f.write(xid_line(simulated_gpus(node, 8)[0].pci_bus_id, 79, "GPU has fallen off the bus.", 1))
                poll_until(lambda n=node: admin.incidents(node=n), what=f"{node}'s incident")
            poll_until(lambda: admin.status().held_nodes, what="the breaker holding node-b")

        status = cli("status", "--controller", target)
        assert status.returncode == 0, status.stderr
        assert "paused" in status.stdout and "held by the circuit breaker: node-b" in status.stdout
        assert "QUARANTINED 1" in status.stdout

        resumed = cli("resume", "--controller", target, "--apply-held", "--reason", "two bad GPUs, checked")
        said = " ".join(resumed.stdout.split())
        assert resumed.returncode == 0 and "automation: active" in said and "applied on 1 node(s): node-b" in said, said
        again = cli("resume", "--controller", target)
        assert again.returncode == 2 and "FAILED_PRECONDITION" in again.stdout + again.stderr

        with AdminClient(target) as admin:
            poll_until(
                lambda: (
                    {n.node: n.health for n in admin.status().nodes}
                    == {"node-a": "QUARANTINED", "node-b": "QUARANTINED", "node-c": "HEALTHY"}
                ),
                what="node-b quarantined after the resume",
            )
        incidents = cli("incidents", "--controller", target, "--json")
        listed = json.loads(incidents.stdout)
        assert sorted(i["node"] for i in listed) == ["node-a", "node-b"]
        assert all(i["status"] == "OPEN" for i in listed)
        # Numbers as numbers (not the JSON mapping's "79"), every field there, zeros and empties too.
        assert all(i["code"] == 79 and isinstance(i["signal_count"], int) for i in listed), listed
        assert all({"remedy", "first_message", "actions"} <= set(i) for i in listed), listed

        released = cli("uncordon", "node-a", "--controller", target, "--reason", "GPU replaced")
        assert released.returncode == 0 and "node-a: HEALTHY" in released.stdout
        unknown = cli("uncordon", "no-such-node", "--controller", target)
        assert unknown.returncode == 2 and "NOT_FOUND" in unknown.stdout + unknown.stderr
        table = cli("incidents", "--controller", target)
        assert "RESOLVED" in table.stdout and "node-b" in table.stdout
        # Piped, a table keeps each row on one line (whole rows for grep), however wide it is.
        (row,) = [line for line in table.stdout.splitlines() if listed[0]["id"] in line]
        assert "XID 79: GPU has fallen off the bus" in row and "QUARANTINE:DONE" in row

        with open(kmsgs["node-c"], "a") as f:  # an XID no catalog has: SUSPECT, still in service
            f.write(xid_line(simulated_gpus("node-c", 8)[1].pci_bus_id, 4000, "an error no catalog has", 2))
        with AdminClient(target) as admin:
            (suspect,) = poll_until(lambda: admin.incidents(open_only=True, node="node-c"), what="node-c's incident")
        resolved = cli("resolve", suspect.id, "--controller", target, "--note", "a known firmware counter bug")
        assert resolved.returncode == 0 and "node-c is HEALTHY" in resolved.stdout, resolved.stdout + resolved.stderr
        node_b = next(i["id"] for i in listed if i["node"] == "node-b")
        quarantined = cli("resolve", node_b, "--controller", target)  # node-b: out of service
        assert quarantined.returncode == 2 and "vigil uncordon" in quarantined.stdout + quarantined.stderr
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(10)
