"""The scenario benchmark's file format and scoring (pure)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench.scenarios.score import Observed, SweepSeen, judge, scorecard
from bench.scenarios.spec import Scenario, load_scenario, scenario_paths
from vigil_core.config_file import ConfigError


def scenario(family: str = "f", **expect: object) -> Scenario:
    return Scenario.model_validate({"description": "t", "family": family, "fleet": {"nodes": 3}, "expect": expect})


def test_every_case_file_loads_and_the_benchmark_has_enough_of_them() -> None:
    paths = scenario_paths()
    assert len(paths) >= 120
    for path in paths:
        load_scenario(path)


def test_a_bad_scenario_is_refused_with_what_is_wrong(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("description: x\nfamily: f\nevents: [{node: node-9, kernel_log: {xid: 79}}]\n")
    with pytest.raises(ConfigError, match="node-9"):
        load_scenario(bad)
    bad.write_text("description: x\nfamily: f\nevents: [{node: node-1, kernel_log: {xid: 79}, nvml_xid: {xid: 79}}]\n")
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


def test_some_of_these_nodes_is_judged_by_its_bounds_not_one_by_one() -> None:
    want = scenario(among=[{"of": ["node-1", "node-2", "node-3"], "at_least": 1, "at_most": 1}])
    one = judge("s", want, Observed(frozenset({"node-2"}), frozenset({"node-2"}), {}))
    assert one.passed and (one.true_quarantines, one.false_quarantines) == (1, 0)
    two = judge("s", want, Observed(frozenset({"node-1", "node-3"}), frozenset(), {}))
    assert not two.passed and two.false_quarantines == 1 and "at most 1" in two.problems[0]
    none = judge("s", want, Observed(frozenset(), frozenset(), {}))
    assert not none.passed and none.missed_quarantines == 1 and "at least 1" in none.problems[0]
    with pytest.raises(ValueError, match="at_most"):
        scenario(among=[{"of": ["node-1"], "at_most": 2}])
    with pytest.raises(ValueError, match="name each node once"):
        scenario(quarantined=["node-1"], among=[{"of": ["node-1", "node-2"], "at_most": 1}])


def test_what_a_page_must_say_is_judged_in_any_case() -> None:
    want = scenario(paged=["node-1"], page_says={"node-1": ["Reset the GPU"], "fleet": ["xid-79 on 3"]})
    said = {"node-1": ("XID 79 | reset the gpu (nvidia-smi -r)",), "fleet": ("shared cause: xid-79 on 3 of 3",)}
    assert judge("s", want, Observed(frozenset(), frozenset({"node-1"}), {}, page_texts=said)).passed
    vague = judge("s", want, Observed(frozenset(), frozenset({"node-1"}), {}, page_texts={"node-1": ("XID 79",)}))
    assert [p.split(" (")[0] for p in vague.problems] == [
        "no page for fleet says 'xid-79 on 3'",
        "no page for node-1 says 'Reset the GPU'",
    ]


def test_the_scorecard_has_a_row_per_family() -> None:
    good = judge("a", scenario("crash", quarantined=["node-1"]), Observed(frozenset({"node-1"}), frozenset(), {}))
    bad = judge("b", scenario("shared"), Observed(frozenset({"node-2"}), frozenset(), {}))
    families = scorecard([good, bad])["families"]
    assert families["crash"]["passed"] == 1 and families["crash"]["quarantine_precision"] == 1.0
    assert families["shared"]["failed"] == ["b"] and families["shared"]["false_quarantines"] == 1


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


def test_every_recorded_page_is_one_slack_message_and_nothing_else_is() -> None:
    want = scenario(paged=["node-1"])
    seen = Observed(frozenset(), frozenset({"node-1"}), {}, paged_incidents=frozenset({"i1"}), slack_posts=("i1",))
    assert judge("s", want, seen).passed
    twice = judge("s", want, replace(seen, slack_posts=("i1", "i1")))
    assert twice.problems == ("incident i1 posted 2 times to Slack",)
    lost = judge("s", want, replace(seen, slack_posts=()))
    assert lost.problems == ("recorded as paged but not in Slack: i1",)
    stray = judge("s", want, replace(seen, slack_posts=("i1", "i2")))
    assert stray.problems == ("in Slack but not recorded as paged: i2",)


def test_a_sweep_is_judged_on_its_verdict_rows_and_findings() -> None:
    want = Scenario.model_validate(
        {
            "description": "t",
            "family": "f",
            "fleet": {"nodes": 2},
            "events": [
                {
                    "sweep": {
                        "checks": ["pairs"],
                        "verdict": "UNKNOWN",
                        "rows": {"node-1": {"pairs": "UNKNOWN"}},
                        "findings": [],
                    }
                }
            ],
        }
    )
    good = SweepSeen(exit_code=2, verdict="UNKNOWN", rows={("node-1", "pairs"): "UNKNOWN"})
    assert judge("s", want, Observed(frozenset(), frozenset(), {}, sweeps=(good,))).passed
    invented = replace(good, verdict="FAIL", findings=("node-1|node-2",))
    problems = judge("s", want, Observed(frozenset(), frozenset(), {}, sweeps=(invented,))).problems
    assert problems == ("sweep 1: verdict FAIL, expected UNKNOWN", "sweep 1: findings ['node-1|node-2'], expected []")
    missing = judge("s", want, Observed(frozenset(), frozenset(), {})).problems
    assert missing == ("0 sweep(s) ran, expected 1",)


def test_the_controller_must_be_up_for_what_needs_it_and_at_the_end(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("description: x\nfamily: f\nevents: [{at: 1, stop_controller: {}}]\n")
    with pytest.raises(ConfigError, match="down at the end"):
        load_scenario(bad)
    bad.write_text(
        "description: x\nfamily: f\nevents: [{at: 1, stop_controller: {}}, {at: 2, node: node-1, uncordon: {}}]\n"
    )
    with pytest.raises(ConfigError, match="uncordon at 2.0 s needs the controller"):
        load_scenario(bad)
    bad.write_text("description: x\nfamily: f\nevents: [{at: 1, start_controller: {}}]\n")
    with pytest.raises(ConfigError, match="already up"):
        load_scenario(bad)
    bad.write_text("description: x\nfamily: f\nevents: [{at: 1, node: node-1, sweep: {checks: [gpu_health]}}]\n")
    with pytest.raises(ConfigError, match="only a node's own events name a node"):
        load_scenario(bad)


def remediation_scenario(**expect: object) -> Scenario:
    return Scenario.model_validate(
        {
            "description": "t",
            "family": "remediation",
            "fleet": {"nodes": 3, "remedies": True},
            "controller": {"remediation": {"enabled": True}},
            "expect": expect,
        }
    )


def test_the_scorecard_counts_self_healed_faults_pages_and_time_back_in_service() -> None:
    back = {"node-1": "HEALTHY", "node-2": "HEALTHY"}
    healed = Observed(
        frozenset({"node-1", "node-2"}), frozenset(), back, back_in_service_s={"node-1": 4.0, "node-2": 8.0}
    )
    hands = Observed(
        frozenset({"node-3"}), frozenset({"node-3"}), {}, pages={"node-3": 1}, remedied=frozenset({"node-3"})
    )
    outcomes = [
        judge("a", remediation_scenario(quarantined=["node-1", "node-2"], health=back), healed),
        judge("b", remediation_scenario(quarantined=["node-3"], paged=["node-3"], remedied=["node-3"]), hands),
        judge("c", scenario(quarantined=["node-1"]), Observed(frozenset({"node-1"}), frozenset(), {})),  # not counted
    ]
    assert all(o.passed for o in outcomes)
    card = scorecard(outcomes)["remediation"]
    assert (card["scenarios"], card["faults"], card["self_healed"]) == (2, 3, 2)
    assert card["self_healed_share"] == round(2 / 3, 4) and card["pages_per_100_faults"] == 33.3
    assert (card["recoverable"], card["recoverable_self_healed_share"]) == (2, 1.0)  # node-3 needed hands
    assert card["back_in_service_s"] == {"n": 2, "p50": 4.0, "max": 8.0}


def test_a_repair_carried_out_where_none_was_expected_is_named() -> None:
    want = remediation_scenario(quarantined=["node-2"], remedied=[])
    outcome = judge("s", want, Observed(frozenset({"node-2"}), frozenset(), {}, remedied=frozenset({"node-2"})))
    assert not outcome.passed and "repairs carried out on ['node-2'], expected []" in outcome.problems


def test_remedies_need_the_controllers_remediation() -> None:
    with pytest.raises(ValueError, match="needs controller"):
        Scenario.model_validate({"description": "t", "family": "f", "fleet": {"remedies": True}})
    with pytest.raises(ValueError, match="need fleet.remedies"):
        Scenario.model_validate(
            {"description": "t", "family": "f", "events": [{"node": "node-1", "smi": {"reset_fails": [1]}}]}
        )


def test_a_node_found_silent_for_a_moment_is_named_though_it_is_healthy_at_the_end() -> None:
    want = scenario(went_unknown=["node-3"], health={"node-1": "HEALTHY"})
    healthy = {"node-1": "HEALTHY"}
    assert judge("s", want, Observed(frozenset(), frozenset(), healthy, went_unknown=frozenset({"node-3"}))).passed
    wrong = judge("s", want, Observed(frozenset(), frozenset(), healthy, went_unknown=frozenset({"node-1", "node-3"})))
    assert not wrong.passed
    assert "found silent (UNKNOWN) at some time: ['node-1', 'node-3'], expected ['node-3']" in wrong.problems


def test_a_pause_of_the_controller_names_no_node_and_needs_it_up() -> None:
    held = {"description": "t", "family": "f", "events": [{"at": 1.0, "pause_controller": {"seconds": 5}}]}
    assert Scenario.model_validate(held).events[0].kind == "pause_controller"
    with pytest.raises(ValueError, match="only a node's own events name a node"):
        Scenario.model_validate({**held, "events": [{"node": "node-1", "pause_controller": {"seconds": 5}}]})
    down = [{"at": 0.0, "stop_controller": {}}, {"at": 1.0, "pause_controller": {"seconds": 5}}]
    with pytest.raises(ValueError, match="needs the controller"):
        Scenario.model_validate({**held, "events": [*down, {"at": 2.0, "start_controller": {}}]})
