"""What a sweep tells whoever watches it: each check's result as it comes, then the sweep's result.
Plain data: the admin edge turns it into the wire's messages (``controller.edge.sweep_updates``),
the job monitor reads the failed nodes from it, the store keeps it as JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from checks.result import CheckResult, Verdict
from controller.sweeps.judge import Row
from controller.sweeps.pairing import Finding


@dataclass(frozen=True)
class SweepResult:
    sweep_id: str
    rows: tuple[Row, ...]
    findings: tuple[Finding, ...]
    nodes: int
    unknown: tuple[str, ...]  # nodes with an UNKNOWN and no FAIL
    failed: tuple[str, ...]  # nodes with a FAIL, in order
    rounds: int  # pairing rounds run: each runs its pairs at once
    pairs: int  # pairs measured across all rounds
    wall_s: float
    verdict: Verdict  # FAIL when a node failed or a link or component is slow; UNKNOWN: not judged; else OK
    # Per failing node, what --quarantine did (the engine's outcome, in words); per blamed component,
    # what became of the nodes behind it.
    quarantine: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


@dataclass(frozen=True)
class SweepProgress:
    """One node's check, or one pair's all-reduce (node "a|b"), as it came."""

    phase: str  # "checks", "pairs", "isolation", "neighbours and across leaves"
    node: str
    result: CheckResult
    request_id: str
    done: int
    total: int  # grows when an isolation round adds pairs


@dataclass(frozen=True)
class SweepDone:
    """The last word: the result, or why there is none (the sweep itself broke)."""

    result: SweepResult | None
    error: str = ""
    done: int = 0
    total: int = 0


SweepEvent = SweepProgress | SweepDone
Emit = Callable[[SweepEvent], None]
