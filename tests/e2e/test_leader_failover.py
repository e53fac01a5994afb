"""Two controller replicas with Lease leader election; the leader is SIGKILLed in the middle of
acting. The standby takes over: no action is repeated and no incident is lost."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpus.simulated import simulated_gpus
from tests.e2e.processes import configured_controller, fast_lease, start_agent, stop_all
from tests.fakes.kube_api import KubeApiServer
from tests.fakes.slack_api import CHANNEL, TOKEN, FakeSlack
from tests.helpers import free_port, poll_until
from vigil.admin_client import AdminClient
from vigil.demo import xid_line

pytestmark = pytest.mark.e2e


def controller(tmp: Path, name: str, port: int, kube: KubeApiServer, slack: FakeSlack) -> subprocess.Popen[bytes]:
    return configured_controller(
        tmp,
        name,
        port=port,
        actuator="kubernetes",
        kubernetes={"kubeconfig": str(kube.kubeconfig(tmp / "kubeconfig"))},
        pager="slack",
        slack={"channel": CHANNEL, "base_url": slack.base_url},
        # Two nodes: the default 5 % would let one quarantine through per window (the new leader counts
        # the one it adopts), and this test is about failover, not the breaker.
        guardrails={"breaker_max_nodes": 10, "breaker_max_fraction": 1.0},
        leader_election=fast_lease(name),
    )


def inject_xid79(kmsg: Path, node: str, seq: int) -> None:
    gpu = simulated_gpus(node, 8)[2]
    with open(kmsg, "a") as f:
        f.write(xid_line(gpu.pci_bus_id, 79, "GPU has fallen off the bus.", seq))


def cordoned(kube: KubeApiServer, node: str) -> bool:
    return bool(kube.node(node)["spec"].get("unschedulable"))


def test_leader_killed_mid_action_standby_finishes_without_repeating(tmp_path: Path) -> None:
    os.environ["VIGIL_SLACK_TOKEN"] = TOKEN
    procs: list[subprocess.Popen[bytes]] = []
    with KubeApiServer() as kube, FakeSlack() as slack:
        for node in ("node-a", "node-b"):
            kube.add_node(node)
        port_a, port_b = free_port(), free_port()
        try:
            ctl_a = controller(tmp_path, "ctl-a", port_a, kube, slack)
            procs.append(ctl_a)
            poll_until(lambda: (tmp_path / "ctl-a.port").exists(), what="ctl-a leads")
            ctl_b = controller(tmp_path, "ctl-b", port_b, kube, slack)
            procs.append(ctl_b)
            targets = f"127.0.0.1:{port_a},127.0.0.1:{port_b}"
            agent_a, kmsg_a = start_agent(tmp_path, "node-a", targets)
            agent_b, kmsg_b = start_agent(tmp_path, "node-b", targets)
            procs += [agent_a, agent_b]
            with AdminClient(f"127.0.0.1:{port_a}") as admin:
                poll_until(lambda: len(admin.status().nodes) == 2, what="both agents on the leader")
            assert not (tmp_path / "ctl-b.port").exists()  # the standby serves nothing

            # The leader is killed half-way: node cordoned, but its condition write failing and Slack
            # making it wait a minute, so neither the condition, the Event nor the page is out.
            slack.rate_limit("chat.postMessage", times=1, retry_after=60)
            kube.fail("PATCH", r"/nodes/node-a/status$", 503, times=1000)
            inject_xid79(kmsg_a, "node-a", 1)
            poll_until(lambda: cordoned(kube, "node-a"), what="node-a cordoned by ctl-a")
            poll_until(lambda: slack.calls("chat.postMessage"), what="ctl-a trying to page")
            poll_until(lambda: kube.requests("PATCH", r"/nodes/node-a/status$"), what="ctl-a failing to write")
            ctl_a.send_signal(signal.SIGKILL)
            ctl_a.wait()
            kube.clear_faults()
            assert not kube.objects_of("events")

            poll_until(lambda: (tmp_path / "ctl-b.port").exists(), timeout=30, what="ctl-b takes over")
            poll_until(lambda: len(slack.state.top_level()) == 1, timeout=30, what="the page, by ctl-b")
            lease = next(o for o in kube.objects_of("leases"))
            assert lease["spec"]["holderIdentity"] == "ctl-b"

            # A second fault, after the take-over, is handled by the new leader.
            inject_xid79(kmsg_b, "node-b", 1)
            poll_until(lambda: cordoned(kube, "node-b"), timeout=30, what="node-b cordoned by ctl-b")
            poll_until(lambda: len(slack.state.top_level()) == 2, what="node-b paged")

            with AdminClient(f"127.0.0.1:{port_b}") as admin:
                # node-a is known from the adoption at once; its agent's replay of the fault follows.
                poll_until(
                    lambda: {n.node: n.last_seq for n in admin.status().nodes} == {"node-a": 1, "node-b": 1},
                    what="both agents replayed to the new leader",
                )
                # A node is QUARANTINED once its whole quarantine is done (the cordon, its condition and
                # its Event), a little after the cordon this test saw on a loaded machine.
                poll_until(
                    lambda: (
                        {n.node: n.health for n in admin.status().nodes}
                        == {"node-a": "QUARANTINED", "node-b": "QUARANTINED"}
                    ),
                    what="both nodes QUARANTINED on the new leader",
                )
                incidents = {i.node: i for i in admin.incidents()}
            assert set(incidents) == {"node-a", "node-b"}  # none lost
            assert incidents["node-a"].code == 79  # the adopted incident learned its facts from the replay

            # Nothing repeated: one cordon write per node, one message per incident.
            assert len(kube.requests("PATCH", r"/api/v1/nodes/node-a$")) == 1
            assert len(kube.requests("PATCH", r"/api/v1/nodes/node-b$")) == 1
            assert len(kube.objects_of("events")) == 2
            conditions = {c["type"]: c["status"] for c in kube.node("node-a")["status"]["conditions"]}
            assert conditions["VigilQuarantined"] == "True"  # the new leader finished the quarantine
            ids = sorted(m["metadata"]["event_payload"]["incident_id"] for m in slack.state.top_level())
            assert ids == sorted(i.id for i in incidents.values())
        finally:
            stop_all(procs)


def test_a_leader_told_to_stop_hands_the_lease_over_at_once(tmp_path: Path) -> None:
    """A rolling update or a drain stops the leader with SIGTERM: it hands the Lease back once it no
    longer acts, and the standby leads within its retry period, not the Lease's 12 s."""
    procs: list[subprocess.Popen[bytes]] = []
    with KubeApiServer() as kube:
        kube.add_node("node-a")
        lease = {"lease_duration_s": 12, "renew_deadline_s": 8, "retry_period_s": 1}
        try:
            for name in ("ctl-a", "ctl-b"):
                procs.append(
                    configured_controller(
                        tmp_path,
                        name,
                        port=free_port(),
                        actuator="kubernetes",
                        kubernetes={"kubeconfig": str(kube.kubeconfig(tmp_path / "kubeconfig"))},
                        leader_election={**fast_lease(name), **lease},
                    )
                )
                poll_until(lambda: (tmp_path / "ctl-a.port").exists(), what="ctl-a leads")
            time.sleep(3)  # the standby has seen the Lease renewed
            assert not (tmp_path / "ctl-b.port").exists()

            procs[0].send_signal(signal.SIGTERM)
            assert procs[0].wait(30) == 0
            stopped = time.monotonic()
            poll_until(lambda: (tmp_path / "ctl-b.port").exists(), timeout=30, what="ctl-b takes over")
            took_s = time.monotonic() - stopped
            assert took_s < 6, f"ctl-b led {took_s:.1f} s after ctl-a stopped: it waited the Lease out"
            assert next(o for o in kube.objects_of("leases"))["spec"]["holderIdentity"] == "ctl-b"
        finally:
            stop_all(procs)
