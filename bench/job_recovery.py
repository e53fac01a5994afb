"""Fault → checkpoint committed → first step after restart, phase by phase; and what Vigil's hook
costs a training step.

    python -m bench.job_recovery [--runs 3] [--steps 400] [--preset debug] [--global-batch 6] [--overhead-only]

Recovery: a real ``vigil controller``, two simulated-GPU agents (node-a, node-b) and ``vigil launch``
running the bundled job with one gloo rank per node, all on this machine. Once the job is past step
20, an XID 79 line is written into node-b's kernel log; the clocks of every process's own log lines
(the controller's, rank 0's, the launcher's, the job's metrics) split the recovery into:

    fault written → incident opened (agent + controller) → command seen by rank 0 (its next poll)
    → checkpoint committed and ranks exited → restart started (the launcher's Plan) → resumed
    (imports, process group, model, checkpoint loaded) → first step done

Hook overhead, side by side: uninterrupted 2-rank runs of the same job reporting to the controller,
with the hook's exchange at every step (the default) and about once a second (``VIGIL_SYNC_S=1``,
every 10 steps here), alternated; the ratio of their wall time per step, and the hook's share of
rank 0's step path (time in ``step_end``, which includes waiting there for the other rank). Printed, and appended to
bench/results/job_recovery.jsonl.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.record import append_result, header, logged_at
from tests.e2e.processes import JobCluster, job_cluster, json_lines
from tests.helpers import poll_until
from tests.training.launch import events

PHASES = ("detected", "command_seen", "checkpointed_and_exited", "restart_started", "resumed", "first_step")


def _at(entry: dict[str, Any]) -> float:
    """A structlog line's time (ISO, UTC) or a metrics line's (Unix seconds)."""
    if "at" in entry:
        return float(entry["at"])
    return logged_at(entry)


def _first(entries: list[dict[str, Any]], event: str, **match: Any) -> dict[str, Any]:
    return next(e for e in entries if e.get("event") == event and all(e.get(k) == v for k, v in match.items()))


def _launch(cluster: JobCluster, steps: int, job: tuple[str, int], sync_s: float = 0.0) -> subprocess.Popen[bytes]:
    """The bundled job under vigil launch; ``job``: its preset and global batch."""
    env = {"VIGIL_WINDOW_STEPS": "10", "VIGIL_SYNC_S": str(sync_s), "OMP_NUM_THREADS": "1"}
    (preset, batch) = job
    args = ["--preset", preset, "--steps", str(steps), "--global-batch", str(batch), "--checkpoint-every", "10"]
    return cluster.launch("bench", ["node-a", "node-b"], args, env)


def one_run(tmp: Path, steps: int, job: tuple[str, int]) -> dict[str, Any]:
    with job_cluster(tmp, pager="none") as cluster:
        launcher = _launch(cluster, steps, job)
        run = tmp / "run"
        poll_until(lambda: any(e["step"] >= 20 for e in events(run, "step")), timeout=300, what="step 20")
        faulted_at = time.time()
        cluster.xid("node-b")
        if launcher.wait(600) != 0:
            raise RuntimeError((tmp / "launch.log").read_text()[-3000:])
    controller, launch = json_lines(tmp / "ctl.log"), json_lines(tmp / "launch.log")
    rank0 = json_lines(tmp / "ranks" / "node-a-rank0.log")
    metrics = events(tmp / "run")
    resumed = _first(metrics, "start", restart=1)
    marks = {
        "detected": _at(_first(controller, "incident_opened", node="node-b")),
        "command_seen": _at(_first(rank0, "vigil_checkpoint_and_restart")),
        "checkpointed_and_exited": _at(_first(launch, "job_start_ended", start=0)),
        "restart_started": _at(_first(launch, "job_starting", start=1)),
        "resumed": _at(resumed),
        "first_step": _at(next(e for e in metrics if e["event"] == "step" and e["at"] > resumed["at"])),
    }
    stopped = _first(metrics, "checkpointed_and_exiting")
    finished = metrics[-1]
    phases, before = {}, faulted_at
    for name in PHASES:
        phases[name] = round(marks[name] - before, 3)
        before = marks[name]
    return {
        "phases_s": phases,
        "total_s": round(marks["first_step"] - faulted_at, 3),
        "checkpoint_step": stopped["step"],
        "resumed_step": resumed["step"],
        "one_rank_hook_overhead": finished["hook_s"] / finished["trained_s"],
    }


def hook_overhead(tmp: Path, steps: int, job: tuple[str, int], sync_s: float) -> dict[str, float]:
    """An uninterrupted 2-rank run reporting to a controller: its wall time per step (start event to
    finished event: the same checkpoints either way), and the hook's share of rank 0's step time."""
    with job_cluster(tmp, nodes=(), pager="none") as cluster:
        if _launch(cluster, steps, job, sync_s).wait(900) != 0:
            raise RuntimeError((tmp / "launch.log").read_text()[-3000:])
    start, finished = events(tmp / "run", "start")[-1], events(tmp / "run", "finished")[-1]
    return {
        "sync_s": sync_s,
        "wall_per_step_s": (finished["at"] - start["at"]) / steps,
        "hook_share": finished["hook_s"] / (finished["trained_s"] + finished["hook_s"]),
    }


def _shares(runs: list[dict[str, float]]) -> str:
    return ", ".join(f"{o['hook_share']:.2%}" for o in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--preset", default="debug")
    parser.add_argument("--global-batch", type=int, default=6, help="sequences per step (longer steps: more)")
    parser.add_argument("--overhead-only", action="store_true", help="measure the hook's cost only, no faults")
    args = parser.parse_args()
    job = (args.preset, args.global_batch)
    runs = []
    for i in range(0 if args.overhead_only else args.runs):
        with tempfile.TemporaryDirectory(prefix="vigil-bench-") as tmp:
            runs.append(one_run(Path(tmp), args.steps, job))
        phases = "  ".join(f"{k} {v:.2f}" for k, v in runs[-1]["phases_s"].items())
        print(f"run {i + 1}: fault → first step after restart {runs[-1]['total_s']:.2f} s  ({phases})")
    overheads: list[dict[str, float]] = []
    for _ in range(args.runs):  # alternated: exchange every step (the default), and about every second
        for sync_s in (0.0, 1.0):
            with tempfile.TemporaryDirectory(prefix="vigil-bench-") as tmp:
                overheads.append(hook_overhead(Path(tmp), args.steps, job, sync_s))
    if runs:
        print("phase medians (s): " + "  ".join(
            f"{p} {statistics.median(r['phases_s'][p] for r in runs):.3f}" for p in PHASES))  # fmt: skip
    every = [o for o in overheads if o["sync_s"] == 0.0]
    sparse = [o for o in overheads if o["sync_s"] > 0.0]
    ratios = [a["wall_per_step_s"] / b["wall_per_step_s"] for a, b in zip(every, sparse, strict=True)]
    print(
        f"hook, 2 ranks, {args.preset}, global batch {args.global_batch}: "
        "wall per step with an exchange every step / about every second: "
        f"{', '.join(f'x{r:.3f}' for r in ratios)}; hook's share of rank 0's step path "
        f"{_shares(every)} (every step), {_shares(sparse)} (sparse)"
    )
    record = {
        **header("job_recovery", preset=args.preset, steps=args.steps, global_batch=args.global_batch),
        "runs": runs,
        "hook_overhead": overheads,
    }
    print(f"appended to {append_result('job_recovery', record)}")


if __name__ == "__main__":
    main()
