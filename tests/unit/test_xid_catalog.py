"""The default policy holds to NVIDIA's Xid catalog code by code, and XID 154 is decided by the
recovery action its text names."""

from __future__ import annotations

from importlib.resources import files

import pytest

from controller.nodes.decide import decide
from controller.vocab.actions import OpenIncident, Page, PageUpdate, Quarantine, ResolveIncident
from controller.vocab.node_state import Health, NodeState
from controller.vocab.policy import Policy, Rule, Severity
from controller.vocab.xid_catalog import CATALOG, Bucket, Fix, parse_catalog
from vigil_core.recovery import RecoveryAction, recovery_action
from vigil_core.signals import GpuRef, Signal, SignalKind

POLICY = Policy()
GPU = GpuRef(2, "GPU-2222", "0000:3b:00")


def xid(code: int, at: float, message: str = "", seq: int = 1) -> Signal:
    return Signal("n1", SignalKind.XID, GPU, code, 0.0, message or f"Xid {code}", "kmsg", at, seq)


@pytest.mark.parametrize("code", sorted(CATALOG))
def test_every_catalog_code_has_the_default_rule_its_immediate_action_asks_for(code: int) -> None:
    entry, rule = CATALOG[code], POLICY.xid[code]
    assert f"NVIDIA: {entry.bucket.value}" in rule.remedy  # the bucket is said in the incident and the page
    if entry.fix is Fix.OUT_OF_SERVICE:
        assert rule.action is Severity.QUARANTINE
    elif entry.fix is Fix.APPLICATION:
        assert rule.application and rule.action is not Severity.QUARANTINE
    else:
        assert rule.action is Severity.RECORD and rule.escalate_after is None


def test_the_catalog_file_says_where_it_comes_from_and_holds_every_code_once() -> None:
    text = files("controller.vocab").joinpath("xid_catalog.csv").read_text()
    assert "docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html" in text and "2026-11-25" in text
    assert sorted(CATALOG) == list(range(1, 163))
    assert {CATALOG[c].bucket for c in (46, 62, 79, 119, 144, 151, 154)} == {
        Bucket.RESET_GPU,
        Bucket.RESTART_BM,
        Bucket.WORKFLOW_NVLINK5_ERR,
        Bucket.RESTART_VM,
        Bucket.XID_154_EVAL,
    }


def test_a_bad_catalog_row_is_named() -> None:
    with pytest.raises(ValueError, match="row 3: XID 7 twice"):
        parse_catalog("code,mnemonic,immediate_action\n7,A,IGNORE\n7,B,IGNORE\n")
    with pytest.raises(ValueError, match="row 2"):
        parse_catalog("code,mnemonic,immediate_action\n8,A,REBOOT_THE_MOON\n")


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", RecoveryAction.GPU_RESET),
        ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", RecoveryAction.NODE_REBOOT),
        ("GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)", RecoveryAction.SYSTEM_REBOOT),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)", RecoveryAction.GPU_RESET),
        ("GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", RecoveryAction.DRAIN_P2P),
        ("GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", RecoveryAction.DRAIN_AND_RESET),
        ("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", RecoveryAction.NONE),
        ("GPU recovery action changed from 0x0 to 0x6", RecoveryAction.BUS_RESET),
        ("GPU recovery action changed from 0x0 to 0x5", RecoveryAction.RECOVER_IMEX_DOMAIN),
        ("GPU recovery action changed from 0x0 (None) to 0x9 (Something New)", None),
        ("Xid 154", None),
    ],
)
def test_xid_154s_text_names_the_recovery_action(text: str, action: RecoveryAction | None) -> None:
    assert recovery_action(text) is action


def test_xid_154_acts_on_the_recovery_action_it_names() -> None:
    reboot = decide(
        NodeState("n1"), xid(154, 1.0, "changed from 0x0 (None) to 0x2 (Node Reboot Required)"), POLICY, 1.0, "i"
    )
    (quarantine,) = [a for a in reboot.actions if isinstance(a, Quarantine)]
    assert reboot.state.health is Health.UNHEALTHY and quarantine.remedy == "reboot the node"
    none_at_all = decide(
        NodeState("n1"), xid(154, 1.0, "changed from 0x1 (GPU Reset Required) to 0x0 (None)"), POLICY, 1.0, "i"
    )
    assert none_at_all.state.health is Health.HEALTHY and [type(a) for a in none_at_all.actions] == [OpenIncident]


def test_a_later_154_that_says_none_clears_what_an_earlier_one_raised() -> None:
    odd = decide(NodeState("n1"), xid(154, 1.0, "changed from 0x0 (None) to 0x9 (Something New)"), POLICY, 1.0, "inc-a")
    assert odd.state.health is Health.SUSPECT and any(isinstance(a, Page) for a in odd.actions)
    cleared = decide(
        odd.state, xid(154, 5.0, "changed from 0x9 (Something New) to 0x0 (None)", seq=2), POLICY, 5.0, "b"
    )
    assert cleared.state.health is Health.HEALTHY
    resolve, note = cleared.actions
    assert isinstance(resolve, ResolveIncident) and resolve.incident_id == "inc-a"
    assert isinstance(note, PageUpdate) and note.resolve and "XID 154: none" in note.text


def test_a_154_that_says_none_leaves_a_node_out_of_service_to_its_release_checks() -> None:
    raised = decide(
        NodeState("n1"), xid(154, 1.0, "changed from 0x0 (None) to 0x1 (GPU Reset Required)"), POLICY, 1.0, "a"
    )
    after = decide(
        raised.state, xid(154, 9.0, "changed from 0x1 (GPU Reset Required) to 0x0 (None)", seq=2), POLICY, 9.0, "b"
    )
    assert after.state.health is Health.UNHEALTHY
    assert not any(isinstance(a, (ResolveIncident, Quarantine, Page)) for a in after.actions)


def test_a_code_in_no_catalog_stays_suspect_and_paged_and_a_policy_file_still_overrides_a_code() -> None:
    unknown = decide(NodeState("n1"), xid(4000, 1.0), POLICY, 1.0, "i")
    assert unknown.state.health is Health.SUSPECT and any(isinstance(a, Page) for a in unknown.actions)
    quiet = Policy(xid={62: Rule(action=Severity.RECORD)})
    assert decide(NodeState("n1"), xid(62, 1.0), quiet, 1.0, "i").state.health is Health.HEALTHY
    assert quiet.xid[79].action is Severity.QUARANTINE  # the others stay as the catalog has them


def test_nvmls_recovery_action_is_said_as_xid_154_says_it_and_decided_the_same_way() -> None:
    from agent.faults import FaultState, diff_faults, fault_state
    from gpus.backend import GpuReading

    before = fault_state(GpuReading(gpu=GPU, recovery_action=0), None)
    assert diff_faults("n1", GPU, None, before, 1.0) == []  # none at the first look: nothing to say
    now = fault_state(GpuReading(gpu=GPU, recovery_action=2), before)
    (signal,) = diff_faults("n1", GPU, before, now, 2.0)
    assert (signal.kind, signal.code) == (SignalKind.XID, 154) and recovery_action(
        signal.message
    ) is RecoveryAction.NODE_REBOOT
    decided = decide(NodeState("n1"), signal, POLICY, 2.0, "i")
    assert decided.state.health is Health.UNHEALTHY
    unknown = fault_state(GpuReading(gpu=GPU, recovery_action=None), now)  # the field not read this time
    assert unknown == now and diff_faults("n1", GPU, now, unknown, 3.0) == []
    back = fault_state(GpuReading(gpu=GPU, recovery_action=0), now)
    (cleared,) = diff_faults("n1", GPU, now, back, 4.0)
    assert recovery_action(cleared.message) is RecoveryAction.NONE
    assert FaultState.from_json(back.to_json()) == back


def test_the_agents_spool_keeps_every_xid_the_default_policy_quarantines_on() -> None:
    from vigil_core.signals import QUARANTINE_XIDS

    quarantines = {code for code, rule in POLICY.xid.items() if rule.action is Severity.QUARANTINE}
    assert quarantines | {154} == QUARANTINE_XIDS  # 154: by the recovery action it names


def test_what_the_agent_writes_for_nvmls_recovery_action_reads_back_as_that_action() -> None:
    from vigil_core.recovery import recovery_line

    for number, action in enumerate(RecoveryAction):
        assert recovery_action(recovery_line(0, number)) is action
    assert recovery_action(recovery_line(0, 9)) is None  # a number this Vigil does not know: SUSPECT, paged
