"""Precision over time: how often each rule acted, and how often a person undid it. Pure.

A quarantine that a person undoes (``vigil uncordon``) within ``undo_window_s`` of it counts as a
false positive of the rule that made it; so does a page whose incident a person resolves by hand
(``vigil resolve``) within the window. ``vigil rules`` and Prometheus show the counts, so operators
see which rules to tune.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

AUTOMATIC = "vigil (automatic)"  # who the automatic release says it is: not a person


def rule_id(kind: str, code: int) -> str:
    """The rule a decision came from: ``xid-79``, ``ecc_dbe``, ``check_failed``."""
    return f"xid-{code}" if kind == "XID" else kind.lower()


@dataclass(frozen=True, slots=True)
class Decision:
    """A quarantine or a page Vigil carried out, as the store records it."""

    incident_id: str
    node: str
    rule: str
    action: str  # "QUARANTINE" or "PAGE"
    done_at: float


@dataclass(frozen=True, slots=True)
class PersonAction:
    what: str  # "uncordon", "resolve"
    node: str
    by: str
    at: float
    detail: str  # for "resolve": the incident id


@dataclass(frozen=True, slots=True)
class RuleStats:
    rule: str
    quarantines: int = 0
    pages: int = 0
    undone: int = 0  # quarantines a person undid within the window
    resolved_by_hand: int = 0  # paged incidents a person resolved within the window

    @property
    def precision(self) -> float | None:
        """The share of its quarantines nobody undid; None before it quarantined anything."""
        return None if not self.quarantines else 1.0 - self.undone / self.quarantines


def count_rules(decisions: Iterable[Decision], people: Iterable[PersonAction], undo_window_s: float) -> list[RuleStats]:
    people = [p for p in people if p.by != AUTOMATIC]
    counts: dict[str, dict[str, int]] = {}
    for d in decisions:
        c = counts.setdefault(d.rule, {"quarantines": 0, "pages": 0, "undone": 0, "resolved_by_hand": 0})
        in_window = [p for p in people if d.done_at <= p.at <= d.done_at + undo_window_s]
        if d.action == "QUARANTINE":
            c["quarantines"] += 1
            c["undone"] += any(p.what == "uncordon" and p.node == d.node for p in in_window)
        else:
            c["pages"] += 1
            c["resolved_by_hand"] += any(p.what == "resolve" and p.detail == d.incident_id for p in in_window)
    return [RuleStats(rule, **c) for rule, c in sorted(counts.items())]
