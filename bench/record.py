"""What every benchmark shares: percentiles, and appending a result line with its command."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).parent / "results"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


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
