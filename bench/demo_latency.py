"""Fault → quarantine and fault → page latency of the local demo cluster, over repeated runs.

    python -m bench.demo_latency [--runs N]

Each run is a whole `vigil demo --json` (fresh processes, fresh stores). The figures include the
agent's kernel-log poll interval (0.1 s by default), which dominates them. Results are printed and
appended as one JSON line to bench/results/demo_latency.jsonl with the command that produced them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from bench.record import append_result, percentile


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {"observed": [], "quarantined": [], "paged": [], "wall_s": []}
    for i in range(args.runs):
        proc = subprocess.run([sys.executable, "-m", "vigil", "demo", "--json"], capture_output=True, text=True)
        summary = json.loads(proc.stdout)
        if not summary["ok"]:
            print(f"run {i}: demo failed: {summary.get('error')}", file=sys.stderr)
            return 1
        for key in ("observed", "quarantined", "paged"):
            samples[key].append(summary["latency_s"][key])
        samples["wall_s"].append(summary["wall_s"])
    figures = {
        key: {"p50": round(statistics.median(v), 4), "p99": round(percentile(v, 0.99), 4), "max": round(max(v), 4)}
        for key, v in samples.items()
    }
    record = {
        "bench": "demo_latency",
        "command": f"python -m bench.demo_latency --runs {args.runs}",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}",
        "runs": args.runs,
        "seconds_after_fault": figures,
    }
    print(f"{'step':<12}{'p50':>10}{'p99':>10}{'max':>10}   (seconds after the fault, {args.runs} demo runs)")
    for key, f in figures.items():
        print(f"{key:<12}{f['p50']:>10.3f}{f['p99']:>10.3f}{f['max']:>10.3f}")
    append_result("demo_latency", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
