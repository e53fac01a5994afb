"""Fault → cordon PATCH at the API server, and fault → Slack message at Slack: single faults and a burst.

    python -m bench.fault_to_action [--nodes 2000] [--single 200] [--burst 375] [--heartbeat-s 5]
                                    [--databases sqlite,postgresql]

A real ``vigil controller`` process (Kubernetes actuator, Slack pager) serves a fleet of simulated
agents (one real gRPC stream per node, heartbeating) and talks to a Kubernetes API server and a
Slack API on loopback (the test suite's emulators), which stamp each request as it arrives. The
clock starts when the agent stamps the signal (``observed_at``) and sends it.

- single: ``--single`` faults one after another, each on a fresh node (the next once the previous
  one's cordon and message have arrived);
- burst: ``--burst`` nodes fail at the same moment.

The circuit breaker and the shared-cause guard are set wide open for this run (they would rightly
hold back 375 of 2,000 failing at once), and the rate limit is the default (100 quarantines/s,
burst 200). Each quarantine still waits the guard's settling window (``--settle-s``; a list runs
once per value, the first the baseline, and prints their ratio). Baseline: a bare PATCH round trip
from this process to the same API server. ``--databases`` runs the whole measurement once per
incident store, one after the other in one invocation: SQLite (a file) and PostgreSQL (a private
server of Debian's postgresql package, on loopback, as ``tests/postgres.py`` starts it), and
prints their ratio. Figures are printed and appended to bench/results/fault_to_action.jsonl (one
line per store) with the command that produced them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.controller_process import controller_target, start_controller, wide_open
from bench.record import append_result, header, percentile
from controller.nodes.guards.shared import SharedCauseConfig
from tests.fakes.fleet import Fleet
from tests.fakes.kube_api import KubeApiServer
from tests.fakes.slack_api import CHANNEL, TOKEN, FakeSlack
from tests.postgres import postgres_server
from tests.postgres import unavailable as postgres_unavailable
from vigil.admin_client import AdminClient


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_s": round(percentile(values, 0.5), 4),
        "p99_s": round(percentile(values, 0.99), 4),
        "max_s": round(max(values), 4),
        "mean_s": round(statistics.fmean(values), 4),
    }


class Arrivals:
    """When the cordon PATCH and the incident's Slack message of each node arrived (read incrementally,
    so watching does not slow the emulators it watches)."""

    def __init__(self, kube: KubeApiServer, slack: FakeSlack) -> None:
        self._kube, self._slack = kube, slack
        self._k_seen = self._s_seen = 0
        self.cordon_at: dict[str, float] = {}
        self.message_at: dict[str, float] = {}

    def update(self) -> None:
        with self._kube.rules.lock:
            new_requests = self._kube.rules.log[self._k_seen :]
            self._k_seen += len(new_requests)
        for r in new_requests:
            if r.method == "PATCH" and r.path.count("/") == 4 and (r.body or {}).get("spec", {}).get("unschedulable"):
                self.cordon_at.setdefault(r.path.rsplit("/", 1)[1], r.at)
        with self._slack.state.lock:
            new_calls = self._slack.state.calls[self._s_seen :]
            self._s_seen += len(new_calls)
        for method, args, at in new_calls:
            meta = args.get("metadata")
            if isinstance(meta, str):
                meta = json.loads(meta)
            if method == "chat.postMessage" and meta and not args.get("thread_ts"):
                self.message_at.setdefault(meta["event_payload"]["incident_id"].split("-bench-")[0], at)


async def wait_for(arrivals: Arrivals, nodes: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        arrivals.update()
        if all(n in arrivals.cordon_at and n in arrivals.message_at for n in nodes):
            return
        await asyncio.sleep(0.005)
    raise TimeoutError(f"not every node was cordoned and paged within {timeout_s} s")


def baseline_patch_rtt(kube: KubeApiServer, workdir: Path, rounds: int = 200) -> dict[str, float]:
    from kubernetes import client

    from controller.act.kube.client import api_client

    core = client.CoreV1Api(api_client(kube.kubeconfig(workdir / "kubeconfig-baseline")))
    kube.add_node("baseline-node")
    samples = []
    for i in range(rounds):
        t0 = time.time()
        core.patch_node(
            "baseline-node",
            {"metadata": {"labels": {"round": str(i)}}},
            _content_type="application/merge-patch+json",
            _preload_content=False,
        )
        samples.append(time.time() - t0)
    return summary(samples)


def controller_settings(
    workdir: Path, kube: KubeApiServer, slack: FakeSlack, nodes: int, faulting: int, settle_s: float | None = None
) -> dict[str, Any]:
    shared = wide_open(faulting, settle_s)
    return {
        "actuator": "kubernetes",
        "kubernetes": {"kubeconfig": str(kube.kubeconfig(workdir / "kubeconfig"))},
        "pager": "slack",
        "slack": {"channel": CHANNEL, "base_url": slack.base_url},
        "guardrails": {"breaker_max_nodes": nodes, "breaker_max_fraction": 1.0, "shared": shared},
    }


async def run(args: argparse.Namespace, workdir: Path, database: str) -> dict[str, Any]:
    with KubeApiServer() as kube, FakeSlack() as slack:
        names = [f"gpu-{i:05d}" for i in range(args.nodes)]
        for name in names:
            kube.add_node(name)
        baseline = baseline_patch_rtt(kube, workdir)
        settings = controller_settings(workdir, kube, slack, args.nodes, args.single + args.burst, args.settle) | {
            "database": database
        }
        controller = start_controller(workdir, settings, {"VIGIL_SLACK_TOKEN": TOKEN})
        try:
            target = await controller_target(workdir, controller)
            fleet = Fleet(target, names, args.heartbeat_s)
            t0 = time.monotonic()
            await fleet.start()
            connect_s = time.monotonic() - t0
            arrivals = Arrivals(kube, slack)
            await asyncio.sleep(args.heartbeat_s)  # a full heartbeat period: the steady load is on
            ctl_proc = psutil.Process(controller.pid)
            ctl_proc.cpu_percent()
            single_started = time.monotonic()

            single_nodes = names[: args.single]
            sent: dict[str, float] = {}
            for name in single_nodes:
                sent[name] = fleet.nodes[name].fault()
                await wait_for(arrivals, [name], 30)
            controller_cpu = ctl_proc.cpu_percent()  # % of one core, over the single-fault phase
            single_s = time.monotonic() - single_started
            cordons, messages = arrivals.cordon_at, arrivals.message_at
            single = {
                "phase_s": round(single_s, 2),
                "controller_cpu_percent_of_one_core": round(controller_cpu, 1),
                "cordon": summary([cordons[n] - sent[n] for n in single_nodes]),
                "slack": summary([messages[n] - sent[n] for n in single_nodes]),
            }

            burst: dict[str, Any] = {}
            burst_nodes = names[args.single : args.single + args.burst]
            for name in burst_nodes:
                sent[name] = fleet.nodes[name].fault()
            if burst_nodes:
                await wait_for(arrivals, burst_nodes, 300)
                burst = {
                    "cordon": summary([cordons[n] - sent[n] for n in burst_nodes]),
                    "slack": summary([messages[n] - sent[n] for n in burst_nodes]),
                    "node_lists": len(kube.requests("GET", r"^/api/v1/nodes$")),
                    "node_gets": len(kube.requests("GET", r"^/api/v1/nodes/gpu-")),
                }
            reconnects = sum(n.reconnects for n in fleet.nodes.values())
            # Split each single fault's time: delivery (agent stamp → the controller's receipt, which
            # includes this process's own queueing with thousands of streams) and the controller's part
            # (receipt → the cordon PATCH arriving at the API server).
            with AdminClient(target, timeout_s=60) as admin:
                received = {i.node: i.received_at for i in admin.incidents(limit=10000)}
            for phase, nodes in ((single, single_nodes), (burst, burst_nodes)):
                if nodes:
                    phase["delivery"] = summary([received[n] - sent[n] for n in nodes])
                    phase["controller_to_cordon"] = summary([cordons[n] - received[n] for n in nodes])
            await fleet.close()
        finally:
            controller.terminate()
            controller.wait(30)
    return {
        "connect_s": round(connect_s, 2),
        "stream_reconnects": reconnects,
        "single": single,
        "burst": burst,
        "baseline_patch_rtt": baseline,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--single", type=int, default=200)
    parser.add_argument("--burst", type=int, default=375, help="0: single faults only (e.g. with --nodes 20000)")
    parser.add_argument("--heartbeat-s", type=float, default=5.0)
    parser.add_argument("--databases", default="sqlite", help="comma-separated: sqlite, postgresql")
    parser.add_argument(
        "--settle-s", default="", help="comma-separated settling windows, e.g. 0,0.05 (default: the controller's)"
    )
    args = parser.parse_args()
    try:
        settles: list[float | None] = [float(v) for v in args.settle_s.split(",") if v.strip()] or [None]
    except ValueError:
        parser.error(f"--settle-s: numbers of seconds, comma-separated, not {args.settle_s!r}")
    if any(v is not None and not 0 <= v <= 5 for v in settles):
        parser.error("--settle-s: each window from 0 to 5 s")
    if args.single + args.burst > args.nodes:
        parser.error("--single + --burst must not exceed --nodes (each fault gets a fresh node)")
    databases = [d.strip() for d in args.databases.split(",") if d.strip()]
    if unknown := set(databases) - {"sqlite", "postgresql"}:
        parser.error(f"--databases: unknown {sorted(unknown)}; known: sqlite, postgresql")
    if "postgresql" in databases and (why := postgres_unavailable()):
        parser.error(f"--databases postgresql: {why}")
    if len(settles) > 1 and len(databases) > 1:
        parser.error("--settle-s with several windows runs on one database")
    records = {}
    for settle in settles:
        args.settle = settle
        for database in databases:
            record = measure(args, database)
            if record is None:
                return 1
            records[database if len(settles) == 1 else f"settle {settle}"] = record
    if len(settles) > 1:
        base_name = f"settle {settles[0]}"
        for name, record in records.items():
            if name == base_name or not record["single"]:
                continue
            a, b = records[base_name]["single"]["cordon"], record["single"]["cordon"]
            print(f"single cordon: {name} / {base_name}  p50 ×{b['p50_s'] / a['p50_s']:.2f}  "
                  f"p99 ×{b['p99_s'] / a['p99_s']:.2f}  (p99 {a['p99_s']:.3f} s -> {b['p99_s']:.3f} s)")  # fmt: skip
    if len(records) == 2 and len(settles) == 1:
        for phase in ("single", "burst"):
            for what in ("cordon", "slack"):
                if records["sqlite"][phase] and what in records["sqlite"][phase]:
                    a, b = records["sqlite"][phase][what], records["postgresql"][phase][what]
                    print(
                        f"{phase:6} {what:7}: PostgreSQL / SQLite  p50 ×{b['p50_s'] / a['p50_s']:.2f}  "
                        f"p99 ×{b['p99_s'] / a['p99_s']:.2f}"
                    )
    return 0


def measure(args: argparse.Namespace, database: str) -> dict[str, Any] | None:
    with tempfile.TemporaryDirectory(prefix="vigil-bench-") as tmp, contextlib.ExitStack() as stack:
        target = stack.enter_context(postgres_server()) if database == "postgresql" else str(Path(tmp) / "ctl.db")
        try:
            figures = asyncio.run(run(args, Path(tmp), target))
        except (TimeoutError, RuntimeError) as exc:
            print(f"bench failed: {exc!r}; the controller's last words:", file=sys.stderr)
            print((Path(tmp) / "controller.out").read_text()[-3000:], file=sys.stderr)
            return None
    record = {
        **header("fault_to_action"),
        "nodes": args.nodes,
        "database": database,
        "settle_s": SharedCauseConfig().settle_s if args.settle is None else args.settle,
        **figures,
    }
    print(json.dumps(record, indent=2))
    base = figures["baseline_patch_rtt"]["p50_s"]
    for phase in ("single", "burst"):
        for what in ("cordon", "slack", "delivery", "controller_to_cordon") if figures[phase] else ():
            if what not in figures[phase]:
                continue
            s = figures[phase][what]
            print(
                f"{database:10} {phase:6} {what:20}: p50 {s['p50_s']:.3f} s  p99 {s['p99_s']:.3f} s  "
                f"(p50 = {s['p50_s'] / base:.0f}× a bare PATCH round trip)"
            )
    append_result("fault_to_action", record)
    return record


if __name__ == "__main__":
    sys.exit(main())
