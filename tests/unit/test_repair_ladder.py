"""The remediation ladder and a repair's way up it: pure, tested like ``decide``."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from controller.repairs.config import RemediationConfig
from controller.repairs.ladder import ORDER, Fault, Step, first_step, plan_ladder, rule_ladder
from controller.repairs.repair import (
    UNJUDGED_TRIES,
    Phase,
    Stops,
    certified,
    certifying,
    done_as_of,
    hands_summary,
    held_down,
    not_certified,
    open_repair,
    reboot_done,
    refusal,
    resumed,
    settled,
    start,
    step_done,
    step_result,
    timed_out,
)
from controller.vocab.policy import Policy
from controller.vocab.xid_catalog import BUCKETS, CATALOG, Fix
from vigil_core.signals import SignalKind

XID = SignalKind.XID
BUS = "0000:18:00"


def xid154(now: str) -> Fault:
    return Fault(XID, 154, f"GPU recovery action changed from 0x0 (None) to {now}", BUS)


@pytest.mark.parametrize(
    ("said", "step"),
    [
        ("0x1 (GPU Reset Required)", Step.GPU_RESET),
        ("0x2 (Node Reboot Required)", Step.REBOOT),
        ("0x3 (Drain P2P)", Step.RECHECK),
        ("0x4 (Drain and Reset)", Step.GPU_RESET),
        ("0x6 (Bus Reset)", Step.BUS_RESET),
        ("0x7 (System Reboot)", Step.REBOOT),
        ("0x5 (Recover IMEX Domain)", Step.REPLACE),
        ("0x0 (None)", Step.RECHECK),
        ("0x63 (Something new)", Step.REPLACE),
    ],
)
def test_the_driver_s_recovery_action_picks_the_first_rung(said: str, step: Step) -> None:
    assert first_step(xid154(said)) is step


def test_every_catalog_code_that_takes_a_node_out_has_a_rung_that_follows_its_bucket() -> None:
    wanted = {"RESET_GPU": Step.GPU_RESET, "RESTART_BM": Step.REBOOT, "CONTACT_SUPPORT": Step.REPLACE}
    for code, entry in CATALOG.items():
        if entry.fix is not Fix.OUT_OF_SERVICE:
            continue
        step = first_step(Fault(XID, code))
        assert step in ORDER, code
        if code != 64 and entry.bucket.value in wanted:
            assert step is wanted[entry.bucket.value], (code, entry.bucket)
    assert {b for b, (fix, _) in BUCKETS.items() if fix is Fix.OUT_OF_SERVICE}  # the table is not empty


def test_a_failed_row_remap_and_a_code_no_catalog_has_need_hands() -> None:
    assert first_step(Fault(XID, 64)) is Step.REPLACE
    assert first_step(Fault(XID, 4000)) is Step.REPLACE
    assert first_step(Fault(SignalKind.ROW_REMAP_PENDING)) is Step.GPU_RESET
    assert first_step(Fault(SignalKind.GPU_LOST)) is Step.REBOOT


def test_the_ladder_starts_at_the_highest_first_rung_and_ends_with_replace() -> None:
    assert plan_ladder([Fault(XID, 48, gpu=BUS)]) == (Step.GPU_RESET, Step.BUS_RESET, Step.REBOOT, Step.REPLACE)
    assert plan_ladder([Fault(XID, 48, gpu=BUS), Fault(XID, 79)]) == (Step.REBOOT, Step.REPLACE)
    assert plan_ladder([]) == (Step.REPLACE,)
    without_bus = (Step.RECHECK, Step.GPU_RESET, Step.REBOOT, Step.REPLACE)
    assert plan_ladder([Fault(XID, 95)], without_bus) == (Step.GPU_RESET, Step.REBOOT, Step.REPLACE)


def test_the_policy_file_gives_a_code_or_a_kind_a_ladder_of_its_own() -> None:
    policy = Policy.model_validate(
        {
            "xid": {79: {"action": "quarantine", "ladder": ["bus_reset", "reboot"]}},
            "kinds": {"ECC_DBE": {"action": "quarantine", "ladder": ["replace"]}},
        }
    )
    own = rule_ladder(policy)
    assert plan_ladder([Fault(XID, 79)], ORDER, own) == (Step.BUS_RESET, Step.REBOOT, Step.REPLACE)
    assert plan_ladder([Fault(SignalKind.ECC_DBE)], ORDER, own) == (Step.REPLACE,)
    assert plan_ladder([Fault(XID, 48)], ORDER, own)[0] is Step.GPU_RESET  # the rest keep the driver's word
    with pytest.raises(ValidationError, match="mildest first"):
        Policy.model_validate({"xid": {79: {"action": "quarantine", "ladder": ["reboot", "gpu_reset"]}}})


@pytest.mark.parametrize(
    ("section", "words"),
    [
        ({"steps": ["reboot", "gpu_reset"]}, "mildest first"),
        ({"steps": []}, "at least one rung"),
        ({"timeouts_s": {"reboot": 0}}, "positive"),
        ({"reboot": {"executor": "command"}}, "needs reboot.command"),
        ({"certify": {"checks": ["matmul"]}}, "always runs gpu_health"),
        ({"certify": {"checks": ["gpu_health", "nope"]}}, "no check named nope"),
        ({"steps": ["reset"]}, "steps"),
    ],
)
def test_a_bad_remediation_section_is_refused_by_name(section: dict[str, object], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        RemediationConfig.model_validate(section)


CONFIG = RemediationConfig(enabled=True, settle_s=5.0, workload_wait_s=100.0, hold_down_s=60.0)


def test_a_reset_that_works_settles_is_certified_and_released() -> None:
    r = open_repair("node-1", "inc-1", [Fault(XID, 48, gpu=BUS)], CONFIG, now=0.0)
    assert (r.phase, r.step, r.gpus) == (Phase.WAITING, Step.GPU_RESET, (BUS,))
    r = start(r, Stops(), CONFIG, now=1.0)
    assert (r.phase, r.attempt) == (Phase.RUNNING, 1)
    r = step_done(r, ok=True, busy=False, detail="reset", now=2.0)
    assert r.phase is Phase.SETTLING and not settled(r, CONFIG, 6.0) and settled(r, CONFIG, 7.0)
    r = certified(certifying(r, 7.0), passed=True, detail="all checks OK", now=9.0)
    assert r.phase is Phase.HOLDING and r.tried == ("GPU reset: done", "certified: all checks OK")
    assert held_down(r, last_fault_at=1.0, config=CONFIG, now=68.0) is r  # quiet, but not long enough yet
    r = held_down(r, last_fault_at=1.0, config=CONFIG, now=69.0)
    assert r.phase is Phase.RELEASED


def test_a_fault_during_the_hold_down_climbs_the_ladder_instead_of_releasing() -> None:
    r = open_repair("node-1", "inc-1", [Fault(XID, 48, gpu=BUS)], CONFIG, now=0.0)
    r = step_done(start(r, Stops(), CONFIG, 1.0), ok=True, busy=False, detail="reset", now=2.0)
    r = certified(certifying(r, 7.0), passed=True, detail="all checks OK", now=9.0)
    r = held_down(r, last_fault_at=30.0, config=CONFIG, now=31.0)
    assert (r.phase, r.step) == (Phase.WAITING, Step.BUS_RESET) and "a fault again 28 s after the GPU reset" in r.tried[
        -1
    ]


def test_a_fault_while_the_node_settles_or_is_certified_is_not_forgotten() -> None:
    r = open_repair("node-1", "inc-1", [Fault(XID, 48, gpu=BUS)], CONFIG, now=0.0)
    r = step_done(start(r, Stops(), CONFIG, 1.0), ok=True, busy=False, detail="reset", now=2.0)
    r = certified(certifying(r, 7.0), passed=True, detail="all checks OK", now=9.0)  # a fault came at 5.0
    r = held_down(r, last_fault_at=5.0, config=CONFIG, now=70.0)
    assert (r.phase, r.step) == (Phase.WAITING, Step.BUS_RESET)


def test_a_reboot_is_done_as_of_the_nodes_new_boot_so_a_fault_at_boot_climbs() -> None:
    # XID 79: the reboot asked at 100; the node booted at 130 (its clock), logged XID 79 again at 131,
    # and its agent said Hello at 135; the controller's tick saw it back at 136.
    asked = start(open_repair("node-1", "inc-1", [Fault(XID, 79)], CONFIG, 0.0), Stops(), CONFIG, 100.0)
    assert asked.step is Step.REBOOT and asked.phase is Phase.RUNNING
    assert reboot_done(asked, connected=True, connected_at=99.0, booted_at=130.0, now=136.0) is asked  # before the ask
    assert reboot_done(asked, connected=False, connected_at=135.0, booted_at=130.0, now=136.0) is asked
    # Back without a new boot (its connection lost and found, the node up since 10): not the reboot.
    assert reboot_done(asked, connected=True, connected_at=135.0, booted_at=10.0, now=136.0) is asked
    done = reboot_done(asked, connected=True, connected_at=135.0, booted_at=130.0, now=136.0)
    assert done.phase is Phase.SETTLING and done.repaired_at == 130.0 and done.tried[-1] == "node reboot: done"
    held = certified(certifying(done, 142.0), passed=True, detail="all checks OK", now=143.0)
    climbed = held_down(held, last_fault_at=131.0, config=CONFIG, now=144.0)  # observed after the boot
    assert climbed.phase is Phase.HANDS and "a fault again 1 s after the node reboot" in climbed.tried[-1]
    # Done as of the Hello's tick when the agent does not say when its node booted (an older agent).
    unsaid = reboot_done(asked, connected=True, connected_at=135.0, booted_at=0.0, now=136.0)
    assert unsaid.phase is Phase.SETTLING and unsaid.repaired_at == 136.0
    # A node clock a little behind the controller's still counts as a new boot.
    assert reboot_done(asked, True, 135.0, 100.0 - 59.0, 136.0).phase is Phase.SETTLING


def test_a_reset_is_done_as_of_when_the_node_finished_it_so_a_fault_right_after_climbs() -> None:
    # The reset finished on the node at 8.0 (its clock); XID 48 again at 9.0; the answer read at 10.0.
    running = start(open_repair("node-1", "inc-1", [Fault(XID, 48, gpu=BUS)], CONFIG, 0.0), Stops(), CONFIG, 1.0)
    done = done_as_of(step_done(running, ok=True, busy=False, detail="reset", now=10.0), finished_at=8.0)
    assert done.phase is Phase.SETTLING and done.repaired_at == 8.0
    held = certified(certifying(done, 16.0), passed=True, detail="all checks OK", now=17.0)
    climbed = held_down(held, last_fault_at=9.0, config=CONFIG, now=18.0)
    assert (climbed.phase, climbed.step) == (Phase.WAITING, Step.BUS_RESET)
    assert "a fault again 1 s after the GPU reset" in climbed.tried[-1]
    # Not said (0), or a step not done (failed: the next rung already): as it was.
    assert done_as_of(step_done(running, True, False, "reset", 10.0), 0.0).repaired_at == 10.0
    failed = step_done(running, ok=False, busy=False, detail="nvidia-smi: reset failed", now=10.0)
    assert done_as_of(failed, 8.0) is failed


def test_a_reset_refused_by_a_busy_gpu_waits_for_the_job_then_runs() -> None:
    r = start(open_repair("node-1", "inc-1", [Fault(XID, 48, gpu=BUS)], CONFIG, 0.0), Stops(), CONFIG, 1.0)
    r = step_done(r, ok=False, busy=True, detail="pid 4242 uses 0000:18:00", now=2.0)
    assert r.phase is Phase.WAITING and r.step is Step.GPU_RESET and "4242" in r.waiting_for
    r = start(r, Stops(jobs=frozenset({"train"})), CONFIG, 3.0)
    assert r.phase is Phase.WAITING and "train" in r.waiting_for
    r = start(r, Stops(), CONFIG, 4.0)
    assert (r.phase, r.attempt) == (Phase.RUNNING, 2)


def test_a_reset_that_fails_climbs_to_the_next_rung_and_a_timeout_does_too() -> None:
    r = start(open_repair("node-1", "inc-1", [Fault(XID, 48, gpu=BUS)], CONFIG, 0.0), Stops(), CONFIG, 1.0)
    r = step_done(r, ok=False, busy=False, detail="nvidia-smi: reset failed", now=2.0)
    assert (r.phase, r.step) == (Phase.WAITING, Step.BUS_RESET)
    r = start(r, Stops(), CONFIG, 3.0)
    assert timed_out(r, CONFIG, 3.0 + 299) is r
    r = timed_out(r, CONFIG, 3.0 + 300)
    assert (r.phase, r.step) == (Phase.WAITING, Step.REBOOT)
    assert "no answer within 300 s" in r.tried[-1]


def test_a_node_that_fails_certification_is_never_released_and_ends_with_hands() -> None:
    r = open_repair("node-1", "inc-1", [Fault(XID, 79)], CONFIG, 0.0)
    assert r.step is Step.REBOOT
    r = step_done(start(r, Stops(), CONFIG, 1.0), ok=True, busy=False, detail="rebooted", now=2.0)
    r = certified(certifying(r, 8.0), passed=False, detail="7 of 8 GPUs", now=9.0)
    assert r.phase is Phase.HANDS and r.step is Step.REPLACE
    assert "certification failed: 7 of 8 GPUs" in hands_summary(r)


def test_a_certification_that_could_not_judge_the_node_runs_again_and_counts_as_failed_only_in_a_row() -> None:
    r = open_repair("node-1", "inc-1", [Fault(XID, 79)], CONFIG, 0.0)
    r = step_done(start(r, Stops(), CONFIG, 1.0), ok=True, busy=False, detail="rebooted", now=2.0)
    why = "pairs UNKNOWN: not measured: node-7: rank 0 could not listen on node-7:26000 (port taken)"
    once = not_certified(certifying(r, 8.0), why, now=9.0)
    assert once.phase is Phase.SETTLING and once.step is Step.REBOOT and once.since == 9.0  # not the next rung
    assert once.waiting_for.startswith("certification again: pairs UNKNOWN")
    assert not settled(once, CONFIG, 13.0) and settled(once, CONFIG, 14.0)  # after the settling time again
    passed = certified(certifying(once, 14.0), passed=True, detail="all checks OK", now=15.0)
    assert passed.phase is Phase.HOLDING  # judged this time: the tries before it are no failure
    again = once
    for i in range(UNJUDGED_TRIES - 1):
        again = not_certified(certifying(again, 20.0 + i), why, now=21.0 + i)
    assert again.phase is Phase.HANDS and again.step is Step.REPLACE  # the reboot's rung is done with
    assert f"certification could not judge the node {UNJUDGED_TRIES} times: pairs UNKNOWN" in hands_summary(again)
    # Only the tries in a row count: one said before another step's word is not among them.
    later = replace(once, tried=(*once.tried, "reboot: done"))
    for i in range(UNJUDGED_TRIES - 1):
        later = not_certified(certifying(later, 60.0 + i), why, now=61.0 + i)
    assert later.phase is Phase.SETTLING
    assert not_certified(once, why, now=50.0) is once  # only a repair being certified


def test_a_repeat_offender_goes_straight_to_hands() -> None:
    r = open_repair("node-1", "inc-1", [Fault(XID, 48)], CONFIG, now=10 * 86400.0, repaired_at=[9e5, 9.5e5, 9.9e5])
    assert r.phase is Phase.HANDS and "repeat offender" in r.tried[0]
    old = open_repair("node-1", "inc-1", [Fault(XID, 48)], CONFIG, now=10 * 86400.0, repaired_at=[1.0, 2.0, 3.0])
    assert old.phase is Phase.WAITING


def test_a_workload_that_never_leaves_calls_for_hands_after_its_wait() -> None:
    r = open_repair("node-1", "inc-1", [Fault(XID, 48)], CONFIG, 0.0)
    stays = Stops(jobs=frozenset({"train"}))
    assert start(r, stays, CONFIG, 99.0).phase is Phase.WAITING
    r = start(r, stays, CONFIG, 100.0)
    assert r.phase is Phase.HANDS and "waited 100 s" in r.tried[-1]


@pytest.mark.parametrize(
    ("stops", "words"),
    [
        (Stops(labels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-required"}), "owner: label"),
        (Stops(labels={"vigil.dev/maintenance": "true"}), "owner: label"),
        (Stops(others="cordoned by kubectl-cordon"), "owner: cordoned"),
        (Stops(storm="circuit breaker tripped"), "storm"),
        (Stops(domain_busy="vigil.dev/rack=r1"), "cap: 1 repair"),
        (Stops(started_last_hour=10), "cap: 10 repairs"),
    ],
)
def test_a_node_that_is_not_ours_to_touch_waits_and_is_never_paged_for_it(stops: Stops, words: str) -> None:
    r = open_repair("node-1", "inc-1", [Fault(XID, 48)], CONFIG, 0.0)
    assert refusal(stops, Step.GPU_RESET, CONFIG).startswith(words)
    later = start(r, stops, CONFIG, 10_000.0)
    assert later.phase is Phase.WAITING and later.waiting_for.startswith(words)


def test_an_upgrade_that_is_done_holds_nothing_and_replace_is_never_held() -> None:
    done = Stops(labels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"})
    assert refusal(done, Step.GPU_RESET, CONFIG) == ""
    assert refusal(Stops(storm="breaker"), Step.REPLACE, CONFIG) == ""


def test_how_a_step_ended_is_named_for_the_metrics() -> None:
    waiting = open_repair("node-1", "inc-1", [Fault(XID, 48, gpu=BUS)], CONFIG, 0.0)
    running = start(waiting, Stops(), CONFIG, 1.0)
    assert step_result(waiting, running) == ""
    assert step_result(running, step_done(running, ok=True, busy=False, detail="", now=2.0)) == "done"
    assert step_result(running, step_done(running, ok=False, busy=True, detail="pid 1", now=2.0)) == "refused"
    assert step_result(running, step_done(running, ok=False, busy=False, detail="x", now=2.0)) == "failed"
    assert step_result(running, timed_out(running, CONFIG, 1e6)) == "failed"


def test_a_repair_read_back_after_a_restart_asks_a_lost_reset_again_and_keeps_waiting_for_a_reboot() -> None:
    reset = start(open_repair("node-1", "inc-1", [Fault(XID, 48, gpu=BUS)], CONFIG, 0.0), Stops(), CONFIG, 1.0)
    again = resumed(reset, now=50.0)
    assert (again.phase, again.step, again.since) == (Phase.WAITING, Step.GPU_RESET, 50.0)
    assert "answer lost with the controller's restart" in again.tried[-1]
    reboot = start(open_repair("node-1", "inc-2", [Fault(XID, 79)], CONFIG, 0.0), Stops(), CONFIG, 1.0)
    assert resumed(reboot, now=50.0) is reboot  # its node's agent saying hello ends it, as before
    certifying_now = certifying(step_done(reset, ok=True, busy=False, detail="", now=2.0), 8.0)
    assert resumed(certifying_now, now=50.0).phase is Phase.SETTLING
