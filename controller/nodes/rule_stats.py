"""Precision over time: how often each rule acted, and how often a person undid it. Pure.

A quarantine that a person undoes (``vigil uncordon``) within ``undo_window_s`` of it counts as a
false positive of the rule that made it; so does a page whose incident a person resolves by hand
(``vigil resolve``) within the window. A release after a repair is no such thing: the person says
so (``vigil uncordon --repaired``), or, unsaid, the node passed a check (a sweep, the release
checks) between the quarantine and the release; ``--not-a-fault`` says the quarantine was wrong
whatever passed. ``vigil rules`` and Prometheus show the counts, so operators see which rules to
tune.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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
    what: str  # "uncordon" (unsaid), "uncordon-repaired", "uncordon-not-a-fault", "resolve"
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
    repaired: int = 0  # quarantines released after a repair (said, or the node's checks passed)

    @property
    def precision(self) -> float | None:
        """The share of its quarantines nobody undid; None before it quarantined anything."""
        return None if not self.quarantines else 1.0 - self.undone / self.quarantines


UNCORDON = "uncordon"
VERDICTS = {"": UNCORDON, "repaired": "uncordon-repaired", "not-a-fault": "uncordon-not-a-fault"}


def count_rules(
    decisions: Iterable[Decision],
    people: Iterable[PersonAction],
    undo_window_s: float,
    passed: Mapping[str, Sequence[float]] | None = None,
) -> list[RuleStats]:
    """``passed``: node -> when a check of it passed (a release after one is a repair, unless said)."""
    people = [p for p in people if p.by != AUTOMATIC]
    passed = passed or {}
    counts: dict[str, dict[str, int]] = {}
    for d in decisions:
        c = counts.setdefault(d.rule, {"quarantines": 0, "pages": 0, "undone": 0, "resolved_by_hand": 0, "repaired": 0})
        in_window = [p for p in people if d.done_at <= p.at <= d.done_at + undo_window_s]
        if d.action == "QUARANTINE":
            c["quarantines"] += 1
            released = [p for p in people if p.node == d.node and p.what.startswith(UNCORDON) and p.at >= d.done_at]
            first = released[0] if released else None
            if first is None:
                continue
            checked = any(d.done_at <= at <= first.at for at in passed.get(d.node, ()))
            if first.what == VERDICTS["repaired"] or (first.what == UNCORDON and checked):
                c["repaired"] += 1
            elif first in in_window:
                c["undone"] += 1
        else:
            c["pages"] += 1
            c["resolved_by_hand"] += any(p.what == "resolve" and p.detail == d.incident_id for p in in_window)
    return [RuleStats(rule, **c) for rule, c in sorted(counts.items())]
