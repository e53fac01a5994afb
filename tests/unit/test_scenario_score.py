"""The scenario benchmark's file format and scoring (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.scenarios.score import Observed, judge, scorecard
from bench.scenarios.spec import Scenario, load_scenario, scenario_paths
from vigil_core.config_file import ConfigError


def scenario(**expect: object) -> Scenario:
    return Scenario.model_validate({"description": "t", "fleet": {"nodes": 3}, "expect": expect})


def test_every_case_file_loads_and_the_benchmark_has_enough_of_them() -> None:
    paths = scenario_paths()
    assert len(paths) >= 30
    for path in paths:
        load_scenario(path)


def test_a_bad_scenario_is_refused_with_what_is_wrong(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("description: x\nevents: [{node: node-9, kernel_log: {xid: 79}}]\n")
    with pytest.raises(ConfigError, match="node-9"):
        load_scenario(bad)
    bad.write_text("description: x\nevents: [{node: node-1, kernel_log: {xid: 79}, nvml_xid: {xid: 79}}]\n")
    with pytest.raises(ConfigError, match="exactly one"):
        load_scenario(bad)
    with pytest.raises(ValueError, match="no scenario named"):
        scenario_paths(["no-such-scenario"])


def test_judging_names_every_wrong_decision() -> None:
    want = scenario(quarantined=["node-1"], paged=["node-1"], health={"node-3": "HEALTHY"})
    right = Observed(frozenset({"node-1"}), frozenset({"node-1"}), {"node-3": "HEALTHY"}, (0.05,))
    assert judge("s", want, right).passed
    wrong = Observed(frozenset({"node-2"}), frozenset({"node-1", "node-3"}), {"node-3": "SUSPECT"})
    outcome = judge("s", want, wrong)
    assert not outcome.passed
    assert (outcome.true_quarantines, outcome.false_quarantines, outcome.missed_quarantines) == (0, 1, 1)
    assert (outcome.false_pages, outcome.missed_pages) == (1, 0)
    assert any("node-3 is SUSPECT, expected HEALTHY" in p for p in outcome.problems)
    broken = judge("s", scenario(), Observed(frozenset(), frozenset(), {}, error="controller exited"))
    assert not broken.passed and "controller exited" in broken.problems[0]


def test_the_scorecard_counts_precision_recall_and_pages_over_all_scenarios() -> None:
    want = scenario(quarantined=["node-1", "node-2"], paged=["node-1", "node-2"])
    one = judge("a", want, Observed(frozenset({"node-1", "node-3"}), frozenset({"node-1"}), {}, (0.1, 0.3)))
    quiet = judge("b", scenario(), Observed(frozenset(), frozenset(), {}))
    card = scorecard([one, quiet])
    assert card["scenarios"] == 2 and card["passed"] == 1 and card["failed"] == ["a"]
    assert card["quarantine_precision"] == 0.5 and card["quarantine_recall"] == 0.5
    assert card["false_pages"] == 0 and card["missed_faults"] == 2  # node-2 neither quarantined nor paged
    assert card["fault_to_action_s"]["n"] == 2 and card["fault_to_action_s"]["max"] == 0.3
    assert scorecard([quiet])["quarantine_precision"] == 1.0  # nothing quarantined, nothing wrongly
