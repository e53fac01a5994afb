"""A check's answer, and the exit-code contract for checks run as programs (0 OK, 1 FAIL, 2 UNKNOWN)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Verdict(StrEnum):
    OK = "OK"
    FAIL = "FAIL"
    UNKNOWN = "UNKNOWN"

    @property
    def exit_code(self) -> int:
        return {Verdict.OK: 0, Verdict.FAIL: 1, Verdict.UNKNOWN: 2}[self]


class NotRun(StrEnum):
    """Why a check measured nothing, for a reason that says nothing of the node's health. Its
    verdict is UNKNOWN, and a sweep neither blames nor clears a node on it (``controller.sweeps``)."""

    BUSY = "busy"  # a workload is using the GPU: an invasive check is not run
    PORT_TAKEN = "port_taken"  # the all-reduce's rank 0 could not listen: another program holds the port
    STOPPED = "stopped"  # the controller stopped it: its pair's partner could not run
    NO_AGENT = "no_agent"  # the node's agent is not connected, went away, or did not answer


@dataclass(frozen=True, slots=True)
class CheckResult:
    check: str
    verdict: Verdict
    reason: str
    figures: dict[str, float] = field(default_factory=dict)
    started_at: float = 0.0
    finished_at: float = 0.0
    # A NotRun value, or "" when the check ran. A string: an agent newer than this controller may
    # name a cause it does not know, and that still means "measured nothing".
    not_run: str = ""

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "verdict": self.verdict.value})

    @classmethod
    def from_json(cls, text: str) -> CheckResult:
        d: dict[str, Any] = json.loads(text)
        return cls(
            check=str(d["check"]),
            verdict=Verdict(d["verdict"]),
            reason=str(d["reason"]),
            figures={str(k): float(v) for k, v in d.get("figures", {}).items()},
            started_at=float(d.get("started_at", 0.0)),
            finished_at=float(d.get("finished_at", 0.0)),
            not_run=str(d.get("not_run") or ""),
        )


def unknown(check: str, reason: str, started_at: float | None = None, not_run: str = "") -> CheckResult:
    now = time.time()
    return CheckResult(check, Verdict.UNKNOWN, reason, {}, started_at or now, now, not_run)
