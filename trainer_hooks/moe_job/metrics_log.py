"""The bundled job's own record of a run: ``OUT/metrics.jsonl``, one JSON event a line (start, step,
checkpoint, checkpointed_and_exiting, finished), written by rank 0 and read by the demo and the
tests. No torch here: the readers run where torch may not be installed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

FILE = "metrics.jsonl"


class MetricsLog:
    def __init__(self, path: Path, enabled: bool) -> None:
        self.path, self.enabled = path, enabled

    def event(self, event: str, **fields: Any) -> None:
        if not self.enabled:
            return
        line = json.dumps({"event": event, "at": time.time(), **fields})
        print(line, flush=True)
        with self.path.open("a") as f:
            f.write(line + "\n")


def events(out: Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The run's events in ``out`` (all of them, or those of ``kind``); none before it starts."""
    path = out / FILE
    found = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [e for e in found if kind is None or e["event"] == kind]


def losses(out: Path) -> dict[int, float]:
    """step -> loss; a step trained again after a resume from an older checkpoint: its last value."""
    return {e["step"]: e["loss"] for e in events(out, "step")}
