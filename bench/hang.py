"""Hung jobs: how soon Vigil finds them, and whether it suspects one that is not hung.

    python -m bench.hang [--jobs 20] [--pauses 4] [--healthy 4] [--step-s 1.0] [--healthy-s 30]

A real ``vigil controller`` process (default settings: a job is hung past 8 x the p99 of its own
seconds per step, never sooner than 10 s) and training jobs, each the real hook (``VigilHook``, one
rank; its reporter thread talks gRPC to the controller) in a thread of this process, stepping every
``--step-s`` (±20 %). After a healthy stretch (``--healthy-s`` to twice that, at random):

- ``--jobs`` of them stop stepping: a hang. Their reporters go on heartbeating, as rank 0's does
  while another rank is stuck in a collective or its data loader;
- ``--pauses`` announce a pause (``hook.pause("evaluation")``) three times as long as the default
  floor, then step again: never a hang;
- ``--healthy`` step throughout: never a hang.

Detection time: from the moment a job stopped to the controller's ``ListJobs`` showing it hung
(polled every 0.1 s). False suspicions: a pausing or healthy job ever shown hung. Figures are
printed and appended to ``bench/results/hang.jsonl`` with the command. Naming the rank and node in
hangs of real multi-rank jobs is ``bench.hang_where``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from bench.controller_process import controller_target, start_controller
from bench.record import append_result, header, percentile
from trainer_hooks.hook import HookConfig, VigilHook
from vigil.admin_client import AdminClient

FLOOR_S = 10.0  # the controller's default jobs.hang.floor_s: pauses last three times this


@dataclass
class BenchJob:
    name: str
    kind: str  # "hang", "pause" or "healthy"
    stop_after_s: float
    stopped_at: float | None = None  # wall clock: when it stopped stepping (a hang)
    seen_hung_at: float | None = None
    steps: int = 0
    done: threading.Event = field(default_factory=threading.Event)


def run_job(job: BenchJob, target: str, step_s: float, until: float, rng: random.Random) -> None:
    hook = VigilHook(HookConfig(job_id=job.name, controller=target, node="bench-node", window_steps=5))
    hook.start(0)
    started = time.monotonic()
    try:
        while time.time() < until and not job.done.is_set():
            if job.kind != "healthy" and time.monotonic() - started >= job.stop_after_s:
                if job.kind == "hang":
                    job.stopped_at = time.time()
                    job.done.wait(max(0.0, until - time.time()))  # stuck: the reporter heartbeats on
                    return
                hook.pause("evaluation")
                time.sleep(3 * FLOOR_S)
                hook.resume()
                job.kind, job.stop_after_s = "paused", float("inf")  # it stepped again: judged as a pause
            seconds = step_s * rng.uniform(0.8, 1.2)
            time.sleep(seconds)
            job.steps += 1
            hook.step_end(job.steps, 1000, seconds)
    finally:
        hook.end()


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    controller = start_controller(workdir, {"pager": "none"})
    try:
        target = await controller_target(workdir, controller)
        return await asyncio.to_thread(_run, args, target)
    finally:
        controller.terminate()
        controller.wait(10)


def _run(args: argparse.Namespace, target: str) -> dict[str, Any]:
    rng = random.Random(args.seed)
    kinds = ["hang"] * args.jobs + ["pause"] * args.pauses + ["healthy"] * args.healthy
    jobs = [
        BenchJob(f"bench-{i}", kind, rng.uniform(args.healthy_s, 2 * args.healthy_s)) for i, kind in enumerate(kinds)
    ]
    until = time.time() + 2 * args.healthy_s + 4 * FLOOR_S + 10  # past the last pause, and a bound after
    threads = [
        threading.Thread(target=run_job, args=(j, target, args.step_s, until, random.Random(i)), daemon=True)
        for i, j in enumerate(jobs)
    ]
    for t in threads:
        t.start()
    by_name = {j.name: j for j in jobs}
    with AdminClient(target, plaintext=True) as admin:
        while time.time() < until:
            now = time.time()
            for status in admin.jobs():
                job = by_name.get(status.job_id)
                if job is not None and status.hung_s > 0 and job.seen_hung_at is None:
                    job.seen_hung_at = now
            time.sleep(0.1)
    for j in jobs:
        j.done.set()
    for t in threads:
        t.join(30)
    hung = [j for j in jobs if j.kind == "hang"]
    detected = [j.seen_hung_at - j.stopped_at for j in hung if j.seen_hung_at and j.stopped_at]
    suspected = [j.name for j in jobs if j.kind != "hang" and j.seen_hung_at is not None]
    return {
        "hangs": len(hung),
        "detected": len(detected),
        "missed": len(hung) - len(detected),
        "detection_s": {
            "p50": round(percentile(detected, 0.5), 2),
            "p90": round(percentile(detected, 0.9), 2),
            "max": round(max(detected), 2),
        }
        if detected
        else None,
        "pauses": sum(1 for j in jobs if j.kind == "paused"),
        "healthy": sum(1 for j in jobs if j.kind == "healthy"),
        "false_suspicions": suspected,
        "step_s": args.step_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20, help="jobs that hang")
    parser.add_argument("--pauses", type=int, default=4, help="jobs that pause, announced, then step again")
    parser.add_argument("--healthy", type=int, default=4, help="jobs that step throughout")
    parser.add_argument("--step-s", type=float, default=1.0)
    parser.add_argument("--healthy-s", type=float, default=30.0, help="steps before the first hang or pause")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.jobs < 1 or args.pauses < 0 or args.healthy < 0 or args.step_s <= 0 or args.healthy_s <= 0:
        parser.error("--jobs at least 1; --pauses and --healthy not negative; --step-s and --healthy-s positive")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))  # the hooks' logs
    with tempfile.TemporaryDirectory(prefix="vigil-bench-hang-") as tmp:
        figures = asyncio.run(measure(args, Path(tmp)))
    record = {**header("hang"), **figures}
    print(json.dumps(record, indent=2))
    d = figures["detection_s"]
    if d is not None:
        print(f"hang -> shown hung: p50 {d['p50']} s, p90 {d['p90']} s, max {d['max']} s over {figures['detected']} "
              f"of {figures['hangs']} hangs; false suspicions {len(figures['false_suspicions'])} "
              f"(of {figures['pauses']} announced pauses and {figures['healthy']} healthy jobs)")  # fmt: skip
    append_result("hang", record)
    return 0 if figures["missed"] == 0 and not figures["false_suspicions"] else 1


if __name__ == "__main__":
    sys.exit(main())
