"""Failover: the leader controller is killed; how long until the new leader acts on a fault.

    python -m bench.failover [--runs 3] [--lease-s 15] [--databases postgresql,sqlite]

Two ``vigil controller`` processes (Lease leader election against the Kubernetes API server on
loopback, the test suite's emulator) and four simulated-GPU agents, each given both controllers'
addresses. Each run: the leader is SIGKILLed and, at the same moment, an XID 79 is written to a
node's kernel log. Measured: kill → the standby serving (its port file), and kill → the node's
cordon PATCH by the new leader. The Lease's timings are the defaults scaled to ``--lease-s``
(lease 15 s, renew deadline 10 s, retry 2 s), so most of the figure is the Lease expiring, by
design: a standby must not act while the old leader might still be alive. With ``postgresql``
the replicas share one database (a private server of Debian's postgresql package); with
``sqlite`` each has its own file. Figures are printed and appended to bench/results/failover.jsonl.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.record import append_result, header
from gpus.simulated import simulated_gpus
from tests.e2e.processes import configured_controller, start_agent, stop_all
from tests.fakes.kube_api import KubeApiServer
from tests.fakes.slack_api import CHANNEL, TOKEN, FakeSlack
from tests.helpers import free_port, poll_until
from tests.postgres import postgres_server
from tests.postgres import unavailable as postgres_unavailable
from vigil.demo import xid_line

NODES = ("node-a", "node-b", "node-c", "node-d")


def lease(identity: str, lease_s: int) -> dict[str, Any]:
    renew = max(2, round(lease_s * 2 / 3))
    return {
        "enabled": True,
        "namespace": "vigil",
        "identity": identity,
        "lease_duration_s": lease_s,
        "renew_deadline_s": renew,
        "retry_period_s": max(1, min(2, int(renew / 1.2) - 1)),
    }


def one_run(work: Path, database: str, lease_s: int) -> dict[str, float]:
    os.environ["VIGIL_SLACK_TOKEN"] = TOKEN
    procs: list[subprocess.Popen[bytes]] = []
    with KubeApiServer() as kube, FakeSlack() as slack, contextlib.ExitStack() as stack:
        shared = stack.enter_context(postgres_server()) if database == "postgresql" else None
        for node in NODES:
            kube.add_node(node)
        ports = {name: free_port() for name in ("ctl-a", "ctl-b")}

        def controller(name: str) -> subprocess.Popen[bytes]:
            return configured_controller(
                work, name, port=ports[name], database=shared or str(work / f"{name}.db"),
                actuator="kubernetes", kubernetes={"kubeconfig": str(kube.kubeconfig(work / "kubeconfig"))},
                pager="slack", slack={"channel": CHANNEL, "base_url": slack.base_url},
                guardrails={"breaker_max_fraction": 1.0}, leader_election=lease(name, lease_s),
            )  # fmt: skip

        try:
            leader = controller("ctl-a")
            procs.append(leader)
            poll_until(lambda: (work / "ctl-a.port").exists(), timeout=60, what="ctl-a leads")
            procs.append(controller("ctl-b"))
            targets = ",".join(f"127.0.0.1:{p}" for p in ports.values())
            kmsg = {}
            for node in NODES:
                agent, kmsg[node] = start_agent(work, node, targets)
                procs.append(agent)
            time.sleep(3)  # every agent connected and heartbeating
            gpu = simulated_gpus("node-c", 8)[0]
            killed = time.time()
            leader.send_signal(signal.SIGKILL)
            with open(kmsg["node-c"], "a") as f:
                f.write(xid_line(gpu.pci_bus_id, 79, "GPU has fallen off the bus.", 100))
            poll_until(lambda: (work / "ctl-b.port").exists(), timeout=lease_s * 4, what="ctl-b leads")
            serving = (work / "ctl-b.port").stat().st_mtime
            poll_until(
                lambda: kube.requests("PATCH", r"/api/v1/nodes/node-c$"), timeout=lease_s * 4, what="node-c cordoned"
            )
            cordoned = time.time()
            return {"kill_to_new_leader_s": round(serving - killed, 3), "kill_to_action_s": round(cordoned - killed, 3)}
        finally:
            stop_all(procs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--lease-s", type=int, default=15)
    parser.add_argument("--databases", default="postgresql,sqlite")
    args = parser.parse_args()
    databases = [d.strip() for d in args.databases.split(",") if d.strip()]
    if unknown := set(databases) - {"sqlite", "postgresql"}:
        parser.error(f"--databases: unknown {sorted(unknown)}; known: sqlite, postgresql")
    if "postgresql" in databases and (why := postgres_unavailable()):
        parser.error(f"--databases postgresql: {why}")
    for database in databases:
        runs = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="vigil-failover-") as tmp:
                runs.append(one_run(Path(tmp), database, args.lease_s))
        record = {
            **header("failover"),
            "database": database,
            "lease_duration_s": args.lease_s,
            "runs": runs,
            "kill_to_action_s_median": round(statistics.median(r["kill_to_action_s"] for r in runs), 3),
        }
        append_result("failover", record)
        print(
            f"{database:10} lease {args.lease_s} s: kill -> new leader serving "
            f"{[r['kill_to_new_leader_s'] for r in runs]} s, kill -> the fault's cordon "
            f"{[r['kill_to_action_s'] for r in runs]} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
