"""A sweep of many simulated nodes: wall time against pairing rounds and node pairs.

    python -m bench.sweep [--sizes 125,250,500,1000] [--check-s 0.5] [--pair-s 1.0]

For each fleet size, a real ``vigil controller`` process sweeps a fleet of simulated agents (one
real gRPC stream per node, ``tests.fakes.sim_checks`` answering RunCheck): four local checks per
node, each taking ``--check-s``, then pairwise all-reduce, each pair taking ``--pair-s``, with one
node's link 10 times slower than the rest (so there is an isolation round). The floor a sweep
cannot beat is ``4 · check_s + rounds · pair_s``; what it takes beyond that is the controller's own
cost (and this process's, which plays every agent). Run side by side over growing fleets, the wall
time should follow the rounds (constant) and not the pairs (growing with the fleet).
Figures are printed and appended to bench/results/sweep.jsonl with the command that produced them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psutil

from bench.controller_process import controller_target, start_controller
from bench.record import append_result, header
from protos.vigil.v1 import admin_pb2, admin_pb2_grpc
from tests.fakes.fleet import Fleet
from tests.fakes.sim_checks import SimulatedChecks

LOCAL_CHECKS = ["gpu_health", "matmul", "membw", "allreduce"]


@dataclass
class Swept:
    summary: admin_pb2.SweepSummary
    wall_s: float
    controller_cpu_s: float
    updates: int


async def run_sweep(
    names: list[str], sim: SimulatedChecks, settings: dict[str, Any], workdir: Path, checks: list[str]
) -> Swept:
    """One sweep of ``checks`` by a real controller process (``settings`` added to its config) over
    simulated agents, one real gRPC stream per node."""
    controller = start_controller(workdir, {"pager": "none", **settings})
    try:
        target = await controller_target(workdir, controller)
        fleet = Fleet(target, names, heartbeat_s=5.0, checks=sim)
        await fleet.start(timeout_s=120)
        ctl = psutil.Process(controller.pid)
        cpu_before = sum(ctl.cpu_times()[:2])
        started = time.monotonic()
        async with grpc.aio.insecure_channel(target) as channel:
            request = admin_pb2.SweepRequest(checks=checks, requested_by="bench")
            updates = [u async for u in admin_pb2_grpc.AdminStub(channel).Sweep(request)]
        wall_s = time.monotonic() - started
        cpu_s = sum(ctl.cpu_times()[:2]) - cpu_before
        await fleet.close()
    finally:
        controller.terminate()
        controller.wait(30)
        (workdir / "port").unlink(missing_ok=True)
    if updates[-1].error:
        raise RuntimeError(f"the sweep broke: {updates[-1].error}")
    return Swept(updates[-1].summary, wall_s, cpu_s, len(updates))


async def sweep_once(nodes: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    names = [f"gpu-{i:05d}" for i in range(nodes)]
    slow = names[nodes // 3]
    sim = SimulatedChecks(duration_s=args.check_s, pair_duration_s=args.pair_s, link_gbps={slow: 4.0})
    swept = await run_sweep(
        names, sim, {"database": str(workdir / f"ctl-{nodes}.db")}, workdir, [*LOCAL_CHECKS, "pairs"]
    )
    summary, wall_s = swept.summary, swept.wall_s
    floor_s = len(LOCAL_CHECKS) * args.check_s + summary.rounds * args.pair_s
    return {
        "nodes": nodes,
        "pairs": summary.pairs,
        "rounds": summary.rounds,
        "wall_s": round(wall_s, 3),
        "floor_s": floor_s,
        "overhead_s": round(wall_s - floor_s, 3),
        "controller_cpu_s": round(swept.controller_cpu_s, 2),
        "updates": swept.updates,
        "culprits": [f.node for f in summary.findings],
        "culprit_found": [f.node for f in summary.findings] == [slow],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="125,250,500,1000", help="fleet sizes, comma-separated")
    parser.add_argument("--check-s", type=float, default=0.5, help="how long each simulated local check takes")
    parser.add_argument("--pair-s", type=float, default=1.0, help="how long each simulated pair all-reduce takes")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    runs = []
    with tempfile.TemporaryDirectory(prefix="vigil-bench-") as tmp:
        for nodes in sizes:
            try:
                runs.append(asyncio.run(sweep_once(nodes, args, Path(tmp))))
            except (TimeoutError, RuntimeError) as exc:
                print(f"bench failed at {nodes} nodes: {exc!r}", file=sys.stderr)
                return 1
    record = {
        **header("sweep"),
        "check_s": args.check_s,
        "pair_s": args.pair_s,
        "runs": runs,
    }
    print(json.dumps(record, indent=2))
    first = runs[0]
    for r in runs:
        print(
            f"{r['nodes']:5} nodes: {r['pairs']:4} pairs in {r['rounds']} rounds, wall {r['wall_s']:.2f} s "
            f"(floor {r['floor_s']:.1f} s, +{r['overhead_s']:.2f} s), controller CPU {r['controller_cpu_s']:.1f} s; "
            f"vs {first['nodes']} nodes: pairs x{r['pairs'] / first['pairs']:.1f}, "
            f"wall x{r['wall_s'] / first['wall_s']:.2f}"
            f"; culprit {'found' if r['culprit_found'] else 'MISSED: ' + str(r['culprits'])}"
        )
    append_result("sweep", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
