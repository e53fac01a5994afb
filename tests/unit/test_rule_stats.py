"""Precision over time: a quarantine a person undoes soon after counts against its rule (pure)."""

from __future__ import annotations

import pytest

from controller.nodes.rule_stats import AUTOMATIC, Decision, PersonAction, count_rules, rule_id


def test_rule_ids_name_the_xid_or_the_kind() -> None:
    assert (rule_id("XID", 79), rule_id("ECC_DBE", 0), rule_id("CHECK_FAILED", 0)) == (
        "xid-79",
        "ecc_dbe",
        "check_failed",
    )


def test_only_a_persons_undo_within_the_window_counts_against_the_rule() -> None:
    decisions = [
        Decision("i1", "n1", "xid-79", "QUARANTINE", 100.0),
        Decision("i1", "n1", "xid-79", "PAGE", 100.0),
        Decision("i2", "n2", "xid-79", "QUARANTINE", 100.0),
        Decision("i3", "n3", "xid-79", "QUARANTINE", 100.0),
        Decision("i4", "n4", "xid-13", "PAGE", 100.0),
    ]
    people = [
        PersonAction("uncordon", "n1", "sre", 200.0, ""),  # within the hour: a false positive
        PersonAction("uncordon", "n2", AUTOMATIC, 200.0, ""),  # the automatic release: not a person
        PersonAction("uncordon", "n3", "sre", 100.0 + 7200, ""),  # a day's repair later: not counted
        PersonAction("resolve", "n4", "sre", 150.0, "i4"),
    ]
    by_rule = {s.rule: s for s in count_rules(decisions, people, undo_window_s=3600.0)}
    xid79 = by_rule["xid-79"]
    assert (xid79.quarantines, xid79.pages, xid79.undone) == (3, 1, 1)
    assert xid79.precision == pytest.approx(2 / 3)
    assert (by_rule["xid-13"].pages, by_rule["xid-13"].resolved_by_hand, by_rule["xid-13"].precision) == (1, 1, None)


def test_a_release_after_a_repair_is_no_false_positive() -> None:
    """Four quarantines released within the hour: one said repaired, one after its node passed a
    check (a sweep, the release checks), one said not a fault though a check passed, one unsaid
    with no check: the last two count against the rule, the first two as repairs."""
    decisions = [Decision(f"i{k}", f"n{k}", "xid-79", "QUARANTINE", 100.0) for k in range(1, 5)]
    people = [
        PersonAction("uncordon-repaired", "n1", "sre", 300.0, ""),
        PersonAction("uncordon", "n2", "sre", 300.0, ""),
        PersonAction("uncordon-not-a-fault", "n3", "sre", 300.0, ""),
        PersonAction("uncordon", "n4", "sre", 300.0, ""),
    ]
    passed = {"n2": [250.0], "n3": [250.0], "n4": [50.0, 400.0]}  # n4: before its quarantine, after its release
    (xid79,) = count_rules(decisions, people, undo_window_s=3600.0, passed=passed)
    assert (xid79.quarantines, xid79.repaired, xid79.undone) == (4, 2, 2)
    assert xid79.precision == pytest.approx(0.5)
