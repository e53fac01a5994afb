"""Hung jobs of real ranks: how soon Vigil finds them, where it says they are stuck, what it does.

    python -m bench.hang_where [--per-kind 20] [--parallel 6] [--step-s 1.0] [--healthy-s 20]

A real ``vigil controller`` process (default ``jobs.hang`` settings: hung past 8 x the p99 of the
job's own seconds per step, never sooner than 10 s; guards wide open, no pager), one agent per
simulated node (``tests/fakes/fleet.py``: a real gRPC stream each), and jobs of two gloo ranks
(``bench/hang_job.py``, a step a second with a real all-reduce and the real hook) under ``vigil
launch``, one rank per node. Each job steps for ``--healthy-s`` to 1.5 times that (its bound learns
from its windows; before it has any, the bound is ``unlearned_s``, 300 s), then its rank 1 stops:

- ``sleep``: in the job's own code. Expected: application, rank 1 on its node, nothing cordoned;
- ``read``: blocked reading a FIFO nobody writes (a dead mount). Expected: I/O, rank 1, nothing cordoned;
- ``host``: SIGSTOP (a frozen host). Expected: host, rank 1, nothing cordoned;
- ``fabric``: waits for a tensor nobody sends, so every rank waits in a collective, and its node's
  agent reports NVLink errors at that moment (recorded only: alone, nothing). Expected: network or
  GPU, that node quarantined and the job aborted and restarted without it.

From the controller's log: detection (the rank stopped → ``job_hung``), localisation (→
``job_hang_located``, the wavefront; for ``fabric`` → ``job_hang_blamed``, the node named), the share
named correctly (the verdict and the rank and node; for ``fabric`` the one node blamed and
quarantined) and the cordons of the other kinds (must be 0). Printed and appended to
``bench/results/hang_where.jsonl`` with the command.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench.controller_process import controller_target, start_controller
from bench.record import append_result, header, logged_at, percentile
from protos.vigil.v1 import common_pb2
from tests.fakes.fleet import Fleet
from vigil.admin_client import AdminClient
from vigil.launch import command_line

KINDS = ("sleep", "read", "host", "fabric")
VERDICTS = {"sleep": "application", "read": "I/O or data loading", "host": "host", "fabric": "network or GPU"}


@dataclass
class Run:
    job: str
    kind: str
    nodes: tuple[str, str]
    stopped_at: float = 0.0  # wall clock, from the rank's mark
    hung_at: float = 0.0
    located_at: float = 0.0
    verdict: str = ""
    culprits: tuple[tuple[int, str], ...] = ()
    blamed: tuple[str, ...] = ()
    judged: bool = False
    quarantined: tuple[str, ...] = ()

    @property
    def named_at(self) -> float:
        """When Vigil named where it is stuck: the wavefront; for a fabric hang, the node it blamed."""
        return self.located_at if self.kind != "fabric" else (self.located_at if self.blamed else 0.0)

    @property
    def right(self) -> bool:
        if self.verdict != VERDICTS[self.kind]:
            return False
        if self.kind == "fabric":
            return self.blamed == (self.nodes[1],) and self.quarantined == (self.nodes[1],)
        return self.culprits == ((1, self.nodes[1]),) and not self.blamed and not self.quarantined


def read_log(path: Path, runs: dict[str, Run]) -> None:
    """Fold the controller's JSON log into the runs (read whole each time: it stays small)."""
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        run = runs.get(str(event.get("job", "")))
        if run is None:
            continue
        name = event.get("event")
        if name == "job_hung" and not run.hung_at:
            run.hung_at = logged_at(event)
        elif name == "job_hang_located" and not run.located_at:
            run.located_at, run.verdict = logged_at(event), str(event["verdict"])
            run.culprits = tuple((int(r), str(n)) for r, n in event.get("culprits", []))
        elif name == "job_hang_judged":
            run.judged, run.blamed = True, tuple(event.get("blamed", []))
        elif name == "job_hang_blamed" and run.kind == "fabric" and run.blamed:
            run.located_at = max(run.located_at, logged_at(event))


def _stop(proc: psutil.Popen | Any) -> None:
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(tree, timeout=10)


async def one(run: Run, args: argparse.Namespace, workdir: Path, target: str, fleet: Fleet, log: Path,
              runs: dict[str, Run], rng: random.Random) -> None:  # fmt: skip
    jobdir = workdir / run.job
    jobdir.mkdir()
    mark = jobdir / "stopped"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "BENCH_STEP_S": str(args.step_s),
        "BENCH_HANG_HOW": "collective" if run.kind == "fabric" else run.kind,
        "BENCH_HANG_RANK": "1",
        "BENCH_HANG_AFTER_S": str(args.healthy_s * rng.uniform(1.0, 1.5)),
        "BENCH_HANG_MARK": str(mark),
    }
    command = command_line(run.job, run.nodes, target, jobdir / "ranks", [sys.executable, "-m", "bench.hang_job"])
    with open(jobdir / "launch.log", "wb") as out:
        launcher = psutil.Popen(command, env=env, stdout=out, stderr=out)
    try:
        give_up = time.time() + 4 * args.healthy_s + 120
        while not mark.exists() and time.time() < give_up:
            await asyncio.sleep(0.1)
        if not mark.exists():
            return
        await asyncio.sleep(0.05)
        run.stopped_at = float(mark.read_text() or time.time())
        if run.kind == "fabric":  # its node's own word, at the moment its link broke
            fleet.nodes[run.nodes[1]].fault(4, kind=common_pb2.NVLINK_ERRORS, message="NVLink CRC errors grew by 4")
        while time.time() < run.stopped_at + 120:
            read_log(log, runs)
            if run.judged and (run.kind != "fabric" or not run.blamed or run.located_at):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # a quarantine decided is carried out
        with AdminClient(target, plaintext=True) as admin:
            health = {n.node: n.health for n in admin.status().nodes}
        run.quarantined = tuple(n for n in run.nodes if health.get(n) == "QUARANTINED")
    finally:
        await asyncio.to_thread(_stop, launcher)


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    settings = {
        "pager": "none",
        "guardrails": {"breaker_max_nodes": 10000, "breaker_max_fraction": 1.0, "shared": {"enabled": False}},
    }
    controller = start_controller(workdir, settings)
    rng = random.Random(args.seed)
    kinds = [k for _ in range(args.per_kind) for k in args.kinds]
    runs = {f"hw-{i:03d}": Run(f"hw-{i:03d}", kind, (f"hw-{i:03d}-a", f"hw-{i:03d}-b")) for i, kind in enumerate(kinds)}
    try:
        target = await controller_target(workdir, controller)
        fleet = Fleet(target, [n for r in runs.values() for n in r.nodes], heartbeat_s=5.0)
        await fleet.start()
        gate = asyncio.Semaphore(args.parallel)

        async def gated(run: Run, delay: float) -> None:
            await asyncio.sleep(delay)  # starts spread out: each rank imports torch
            async with gate:
                await one(run, args, workdir, target, fleet, workdir / "controller.out", runs, rng)

        try:
            await asyncio.gather(*(gated(r, 3.0 * min(i, args.parallel)) for i, r in enumerate(runs.values())))
        finally:
            await fleet.close()
    finally:
        controller.terminate()
        controller.wait(10)
    return figures(list(runs.values()), args)


def _p(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"p50": round(percentile(values, 0.5), 2), "p90": round(percentile(values, 0.9), 2),
            "max": round(max(values), 2)}  # fmt: skip


def figures(runs: list[Run], args: argparse.Namespace) -> dict[str, Any]:
    by_kind: dict[str, Any] = {}
    for kind in args.kinds:
        mine = [r for r in runs if r.kind == kind and r.stopped_at]
        by_kind[kind] = {
            "hangs": len(mine),
            "detected": sum(1 for r in mine if r.hung_at),
            "detection_s": _p([r.hung_at - r.stopped_at for r in mine if r.hung_at]),
            "named_s": _p([r.named_at - r.stopped_at for r in mine if r.named_at]),
            "named_right": sum(1 for r in mine if r.right),
            "cordons": sum(len(r.quarantined) for r in mine),
            "wrong": [
                {"job": r.job, "verdict": r.verdict, "culprits": r.culprits, "blamed": r.blamed, "out": r.quarantined}
                for r in mine
                if not r.right
            ][:10],
        }
    done = [r for r in runs if r.stopped_at]
    return {
        "kinds": by_kind,
        "hangs": len(done),
        "named_right": sum(1 for r in done if r.right),
        "detection_s": _p([r.hung_at - r.stopped_at for r in done if r.hung_at]),
        "named_s": _p([r.named_at - r.stopped_at for r in done if r.named_at]),
        "cordons_without_evidence": sum(len(r.quarantined) for r in done if r.kind != "fabric"),
        "never_stopped": [r.job for r in runs if not r.stopped_at],
        "step_s": args.step_s,
        "parallel": args.parallel,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-kind", type=int, default=20, help="hangs of each kind")
    parser.add_argument("--parallel", type=int, default=6, help="jobs at once (two ranks and a launcher each)")
    parser.add_argument("--step-s", type=float, default=1.0)
    parser.add_argument("--healthy-s", type=float, default=20.0, help="steps at least this long before the hang")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    args = parser.parse_args()
    if args.per_kind < 1 or args.parallel < 1 or args.step_s <= 0 or args.healthy_s <= 0:
        parser.error("--per-kind and --parallel at least 1; --step-s and --healthy-s positive")
    with tempfile.TemporaryDirectory(prefix="vigil-bench-hang-where-") as tmp:
        result = asyncio.run(measure(args, Path(tmp)))
    record = {**header("hang_where"), **result}
    print(json.dumps(record, indent=2))
    for kind, k in result["kinds"].items():
        d, n = k["detection_s"] or {}, k["named_s"] or {}
        print(f"{kind:7} {k['named_right']}/{k['hangs']} named right; detected p50 {d.get('p50')} s "
              f"p90 {d.get('p90')} s; named p50 {n.get('p50')} s p90 {n.get('p90')} s; "
              f"cordons {k['cordons']}")  # fmt: skip
    append_result("hang_where", record)
    ok = result["named_right"] == result["hangs"] and not result["never_stopped"]
    return 0 if ok and result["cordons_without_evidence"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
