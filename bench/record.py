"""What every benchmark shares: percentiles, a log line's time, and appending a result line with its command."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).parent / "results"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def logged_at(entry: dict[str, Any]) -> float:
    """When a Vigil process wrote a JSON log line (structlog's ISO timestamp, UTC), in Unix seconds."""
    return datetime.fromisoformat(str(entry["timestamp"]).replace("Z", "+00:00")).timestamp()


def append_result(bench: str, record: dict[str, Any]) -> Path:
    path = RESULTS_DIR / f"{bench}.jsonl"
    RESULTS_DIR.mkdir(exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
    return path


def header(bench: str, **machine: Any) -> dict[str, Any]:
    """What every result line starts with: the benchmark, the command that ran it, when, and where."""
    return {
        "bench": bench,
        "command": f"python -m bench.{bench} " + " ".join(sys.argv[1:]),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), **machine},
    }


def host_pace_ms(tries: int = 5) -> float:
    """This host's pace now: the CPU time of this thread for a fixed piece of pure-Python work (a
    million sets and gets of a small dict), in ms, the least of ``tries``. A shared host runs the
    same code slower at some hours, and counts more CPU seconds for it; figures taken hours apart
    are read beside it. Taken while nothing else of the benchmark runs."""

    def work() -> int:
        d: dict[int, int] = {}
        total = 0
        for i in range(1_000_000):
            d[i & 4095] = i
            total += d.get((i * 7) & 4095, 0)
        return total

    least = float("inf")
    for _ in range(tries):
        start = time.thread_time()
        work()
        least = min(least, time.thread_time() - start)
    return round(least * 1000, 1)


def revision() -> str:
    """The code measured: its commit, and whether the working tree differed from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(  # the results file itself is not the code measured
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results"],
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + (" (modified)" if dirty.stdout.strip() else "")
