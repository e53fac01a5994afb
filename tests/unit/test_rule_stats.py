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
