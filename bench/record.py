"""What every benchmark shares: percentiles, and appending a result line with its command."""

from __future__ import annotations

import json
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
