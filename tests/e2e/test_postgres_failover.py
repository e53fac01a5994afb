"""Two controller replicas on one PostgreSQL database (a real server), Lease leader election; the
leader is SIGKILLed. The standby takes over where it left off: an XID count two-thirds of the way
to its threshold, two quarantines and their pages, the circuit breaker's full window and the
quarantine it holds. Nothing is repeated, nothing forgotten: the count reaches its threshold, the
held quarantine is still held (automation paused) until a person resumes it on the new leader.
(With a database per replica, the count and the held action would be gone.)"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpus.simulated import simulated_gpus
from protos.vigil.v1 import admin_pb2
from tests.e2e.processes import configured_controller, fast_lease, start_agent, stop_all
from tests.fakes.kube_api import KubeApiServer
from tests.fakes.slack_api import CHANNEL, TOKEN, FakeSlack
from tests.helpers import free_port, poll_until
from tests.postgres import postgres_server, unavailable
from vigil.admin_client import AdminClient
from vigil.demo import xid_line

pytestmark = pytest.mark.e2e
NODES = ("node-a", "node-b", "node-c", "node-d")


def controller(
    tmp: Path, name: str, port: int, dsn: str, kube: KubeApiServer, slack: FakeSlack
) -> subprocess.Popen[bytes]:
    return configured_controller(
        tmp,
        name,
        port=port,
        database=dsn,
        actuator="kubernetes",
        kubernetes={"kubeconfig": str(kube.kubeconfig(tmp / "kubeconfig"))},
        pager="slack",
        slack={"channel": CHANNEL, "base_url": slack.base_url},
        # The breaker under test: three of four nodes with XID 79 would otherwise be one fleet incident.
        guardrails={
            "breaker_max_nodes": 2,
            "breaker_max_fraction": 1.0,
            "breaker_page_delay_s": 0,
            "shared": {"enabled": False},
        },  # fmt: skip
        leader_election=fast_lease(name),
    )


def inject(kmsg: Path, node: str, code: int, seq: int, times: int = 1) -> None:
    gpu = simulated_gpus(node, 8)[1]
    with open(kmsg, "a") as f:
        f.write("".join(xid_line(gpu.pci_bus_id, code, "injected", seq + i) for i in range(times)))


def cordoned(kube: KubeApiServer, node: str) -> bool:
    return bool(kube.node(node)["spec"].get("unschedulable"))


@pytest.mark.timeout(180)
@pytest.mark.skipif(bool(why := unavailable()), reason=why or "")
def test_the_new_leader_continues_counts_incidents_and_the_breaker_window(tmp_path: Path) -> None:
    os.environ["VIGIL_SLACK_TOKEN"] = TOKEN
    procs: list[subprocess.Popen[bytes]] = []
    with postgres_server() as dsn, KubeApiServer() as kube, FakeSlack() as slack:
        for node in NODES:
            kube.add_node(node)
        port_a, port_b = free_port(), free_port()
        try:
            ctl_a = controller(tmp_path, "ctl-a", port_a, dsn, kube, slack)
            procs.append(ctl_a)
            poll_until(lambda: (tmp_path / "ctl-a.port").exists(), timeout=30, what="ctl-a leads")
            procs.append(controller(tmp_path, "ctl-b", port_b, dsn, kube, slack))
            targets = f"127.0.0.1:{port_a},127.0.0.1:{port_b}"
            kmsg = {}
            for node in NODES:
                agent, kmsg[node] = start_agent(tmp_path, node, targets)
                procs.append(agent)
            with AdminClient(f"127.0.0.1:{port_a}") as admin:
                poll_until(lambda: len(admin.status().nodes) == len(NODES), what="every agent on the leader")
                inject(kmsg["node-a"], "node-a", 13, 100)  # two of the three crashes the XID 13 rule wants
                time.sleep(1.2)  # lines closer than the policy's crash_s (1 s) are one crash
                inject(kmsg["node-a"], "node-a", 13, 101)
                inject(kmsg["node-b"], "node-b", 79, 100)
                poll_until(lambda: cordoned(kube, "node-b"), what="node-b cordoned by ctl-a")
                inject(kmsg["node-c"], "node-c", 79, 100)  # the window's second quarantine: now it is full
                poll_until(lambda: cordoned(kube, "node-c"), what="node-c cordoned by ctl-a")
                inject(kmsg["node-d"], "node-d", 79, 100)  # a third: the breaker holds it
                poll_until(lambda: admin.status().automation != "active", what="the breaker trips on ctl-a")
                poll_until(
                    lambda: {n.node: n.last_seq for n in admin.status().nodes}.get("node-a") == 2,
                    what="both XID 13 recorded",
                )
            ctl_a.send_signal(signal.SIGKILL)
            ctl_a.wait()
            assert not cordoned(kube, "node-d")

            poll_until(lambda: (tmp_path / "ctl-b.port").exists(), timeout=30, what="ctl-b takes over")
            with AdminClient(f"127.0.0.1:{port_b}") as admin:
                poll_until(lambda: len(admin.status().nodes) == len(NODES), timeout=30, what="agents on ctl-b")
                status = admin.status()
                assert status.automation != "active"  # the held quarantine is still held
                assert {n.node: n.health for n in status.nodes}["node-b"] == "QUARANTINED"
                inject(kmsg["node-a"], "node-a", 13, 200)  # the third: counted with the two before
                poll_until(
                    lambda: {n.node: n.health for n in admin.status().nodes}["node-a"] == "SUSPECT",
                    what="node-a SUSPECT: the count survived the failover",
                )
                assert not cordoned(kube, "node-d")
                reply = admin.resume("sre@example.com", "the rack is fine", apply_held=True)
                assert reply.applied >= 1
                poll_until(lambda: cordoned(kube, "node-d"), what="node-d cordoned once a person resumed")
                # node-a's page (SUSPECT) waits out the settling window; it may land after node-d's cordon.
                poll_until(lambda: "node-a" in _paged(admin.incidents()), what="node-a paged")
                incidents = admin.incidents()
            # Nothing repeated: one cordon write per quarantined node, one message per paged incident.
            for node in ("node-b", "node-c", "node-d"):
                assert len(kube.requests("PATCH", rf"/api/v1/nodes/{node}$")) == 1, node
            posted = [m["metadata"]["event_payload"]["incident_id"] for m in slack.state.top_level()]
            assert len(posted) == len(set(posted))
            assert {"node-a", "node-b", "node-c"} <= _paged(incidents)
        finally:
            stop_all(procs)


def _paged(incidents: Sequence[admin_pb2.Incident]) -> set[str]:
    return {i.node for i in incidents if any(a.kind.startswith("PAGE") and a.status == "DONE" for a in i.actions)}
