"""The Slurm actuator's decisions, without Slurm: Vigil's drain reason, whose drain a reason is,
when a node may be drained, resumed or repaired, and which nodes a selector picks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.act.slurm.plans import (
    AlreadyOurs,
    Drain,
    DrainKind,
    HeldByOther,
    SlurmAnswerError,
    SlurmJob,
    SlurmNode,
    classify,
    drain_reason,
    held_by_others,
    matches,
    parse_jobs,
    parse_nodes,
    parse_show_node,
    plan_quarantine,
    plan_release,
    reason_class,
    vigil_drain,
)


def node(
    state: str = "IDLE", *flags: str, reason: str = "", by: str = "", partitions: tuple[str, ...] = ()
) -> SlurmNode:
    return SlurmNode("gpu-01", state, frozenset(flags), reason, by, 0.0, partitions)


@given(
    incident=st.text(st.characters(codec="ascii", exclude_characters="\n\r"), min_size=1, max_size=60),
    reason=st.text(max_size=300),
)
def test_vigils_reason_names_its_incident_whatever_the_incident_and_reason(incident: str, reason: str) -> None:
    written = drain_reason(incident, reason)
    assert vigil_drain(written) == (incident, reason_class(reason))
    assert ":" not in reason_class(reason) and len(reason_class(reason)) <= 48


@pytest.mark.parametrize(
    "reason",
    ["", "vigil", "vigil:", "vigil:nocolon", "Vigil:inc:x", " vigil:inc:x", "not responding", "vigil-ish:inc:x"],
)
def test_other_reasons_are_not_vigils(reason: str) -> None:
    assert vigil_drain(reason) is None


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("vigil:gpu-01-a1-7:xid-79", DrainKind.VIGIL),
        ("Not responding", DrainKind.NODE),  # Slurm's own
        ("Kill task failed", DrainKind.NODE),
        ("Node unexpectedly rebooted boot=1795000000 last response=1795000100", DrainKind.NODE),
        ("Low RealMemory (reported:100 < 100.00% of configured:200)", DrainKind.NODE),
        ("NHC: check_hw_gpu: GPU 3 missing", DrainKind.NODE),  # LBNL NHC
        ("aznhc: IB link flapping on mlx5_2", DrainKind.NODE),
        ("XID 48 DBE on GPU 0", DrainKind.NODE),
        ("prolog error", DrainKind.NODE),
        ("[node_problem] GPU fell off the bus", DrainKind.NODE),  # soperator's tags
        ("[user_problem] job 1234 filled /tmp", DrainKind.USER),
        ("user problem: stale processes from job 88", DrainKind.USER),
        ("bad DIMM, RMA 4411", DrainKind.PERSON),
        ("maintenance window 2026-12-01", DrainKind.PERSON),
        ("", DrainKind.PERSON),
    ],
)
def test_whose_problem_a_drain_says_it_is(reason: str, kind: DrainKind) -> None:
    assert classify(node("IDLE", "DRAIN", reason=reason)) is kind


def test_a_quarantine_drains_a_node_in_service_whatever_it_runs() -> None:
    for state in ("IDLE", "ALLOCATED", "MIXED", "DOWN"):
        plan = plan_quarantine(node(state), "inc-1", "XID 79: fell off the bus")
        assert plan == Drain("vigil:inc-1:xid-79-fell-off-the-bus")


def test_a_drained_node_is_left_to_whoever_drained_it() -> None:
    assert plan_quarantine(node("IDLE", "DRAIN", reason="vigil:inc-0:xid-79"), "inc-1", "x") == AlreadyOurs("inc-0")
    held = plan_quarantine(node("ALLOCATED", "DRAIN", reason="RMA 12", by="alice"), "inc-1", "x")
    assert isinstance(held, HeldByOther) and "'RMA 12' by alice, person" in held.why


def test_only_vigils_own_drain_is_resumed() -> None:
    assert plan_release(node("IDLE", "DRAIN", reason="vigil:inc-1:xid-79")) is None
    assert plan_release(node("DOWN", "DRAIN", reason="vigil:inc-1:xid-79")) is None
    assert "drained by someone else" in (plan_release(node("IDLE", "DRAIN", reason="Kill task failed")) or "")
    assert "not drained" in (plan_release(node("IDLE")) or "")
    assert "not drained" in (plan_release(node("DOWN", reason="Not responding")) or "")  # down, not drained


def test_a_repair_waits_for_drain_and_idle_and_for_vigils_drain() -> None:
    ours = "vigil:inc-1:xid-79"
    assert held_by_others(node("IDLE", "DRAIN", reason=ours)) == ""
    assert held_by_others(node("DOWN", "DRAIN", reason=ours)) == ""
    for busy in (node("ALLOCATED", "DRAIN", reason=ours), node("MIXED", "DRAIN", reason=ours)):
        assert "a job still runs on it" in held_by_others(busy)
    assert "a job still runs" in held_by_others(node("IDLE", "DRAIN", "COMPLETING", reason=ours))
    assert "drained by someone else" in held_by_others(node("IDLE", "DRAIN", reason="hands on, do not touch"))


def test_selectors_pick_by_partition_feature_and_state() -> None:
    n = SlurmNode("gpu-01", "IDLE", frozenset({"DRAIN"}), partitions=("gpu", "debug"), features=("h100", "ib"))
    assert matches(n, "partition=gpu") and matches(n, "partition=debug,feature=h100") and matches(n, "state=drain")
    assert not matches(n, "partition=cpu") and not matches(n, "partition=gpu,feature=a100")
    for bad, said in (
        ("pool=h100", "knows partition"),
        ("partition", "expected partition=P"),
        ("feature=", "expected"),
    ):
        with pytest.raises(ValueError, match=said):
            matches(n, bad)


def test_sinfos_answer_is_read_and_its_errors_are_said() -> None:
    doc = {
        "errors": [],
        "nodes": [
            {
                "name": "gpu-03",
                "state": "allocated",
                "state_flags": ["DRAIN"],
                "reason": "nhc: disk full",
                "reason_set_by_user": "root",
                "reason_changed_at": 1795715671,
                "partitions": ["gpu"],
                "active_features": "h100,ib",
            }
        ],
    }
    (n,) = parse_nodes(doc)
    assert (n.state, n.describe(), n.busy, n.drained, n.features) == (
        "ALLOCATED", "ALLOCATED+DRAIN", True, True, ("h100", "ib"))  # fmt: skip
    with pytest.raises(SlurmAnswerError, match="Unable to contact slurm controller"):
        parse_nodes({"errors": [{"error": "Unable to contact slurm controller", "errno": 1}], "nodes": []})
    with pytest.raises(SlurmAnswerError, match="not a node list"):
        parse_nodes({"nodes": [{"state": "idle"}]})


def test_the_json_of_slurm_23_and_later_is_read_too() -> None:
    """``scontrol --json`` and slurmrestd (data_parser v0.0.41, as Slurm 24.11.5 wrote it): the state
    one list, numbers as {set, number}, features a list; jobs with their nodes one by one."""
    doc = {
        "errors": [],
        "warnings": [],
        "nodes": [
            {
                "name": "gpu-02",
                "state": ["IDLE", "DRAIN"],
                "reason": "vigil:inc-1:xid-79",
                "reason_set_by_user": "root",
                "reason_changed_at": {"set": True, "infinite": False, "number": 1795750879},
                "partitions": ["gpu"],
                "features": ["h100"],
                "active_features": ["h100", "ib"],
            },
            {"name": "gpu-03", "state": ["MIXED", "COMPLETING"], "reason_changed_at": {"set": False, "number": 7}},
        ],
    }
    drained, finishing = parse_nodes(doc)
    assert (drained.state, drained.flags, drained.reason_at, drained.features) == (
        "IDLE", frozenset({"DRAIN"}), 1795750879.0, ("h100", "ib"))  # fmt: skip
    assert (finishing.describe(), finishing.busy, finishing.drained, finishing.reason_at) == (
        "MIXED+COMPLETING", True, False, 0.0)  # fmt: skip
    allocation = [{"index": 0, "name": "gpu-01"}, {"index": 1, "name": "gpu-02"}]
    jobs = {
        "errors": [],
        "jobs": [
            {
                "job_id": 1,
                "job_state": ["RUNNING"],
                "nodes": "gpu-[01-02]",
                "job_resources": {"nodes": {"allocation": allocation}},
            },
            {"job_id": 2, "job_state": "PENDING", "nodes": "", "job_resources": {"nodes": "gpu-01"}},  # 22.05's
        ],
    }
    assert parse_jobs(jobs) == [
        SlurmJob("1", "RUNNING", "gpu-[01-02]", ("gpu-01", "gpu-02")), SlurmJob("2", "PENDING", "", ())]  # fmt: skip
    with pytest.raises(SlurmAnswerError, match="Failure to query node gpu-09"):
        parse_nodes({"errors": [{"description": "Failure to query node gpu-09", "error": "No error"}], "nodes": []})
    with pytest.raises(SlurmAnswerError, match="not a job list"):
        parse_jobs({"jobs": [{"job_state": "RUNNING"}]})


# What scontrol show node -o NAME printed on Slurm 22.05.8 (the tests' private cluster).
DRAINING = (
    "NodeName=gpu-03 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 CPUEfctv=1 CPUTot=1 CPULoad=3.53 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=localhost "
    "Port=16823 Version=22.05.8 OS=Linux 6.18.44-fc-v782 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=100 AllocMem=100 "
    "FreeMem=21796 Sockets=1 Boards=1 State=ALLOCATED+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
    "MCS_label=N/A Partitions=gpu  BootTime=2026-11-25T19:21:49 SlurmdStartTime=2026-11-26T17:54:25 "
    "LastBusyTime=2026-11-26T17:54:25 CfgTRES=cpu=1,mem=100M,billing=1 AllocTRES=cpu=1,mem=100M CapWatts=n/a "
    "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
    "Reason=nhc: disk full, see /var/log/nhc.log [root@2026-11-26T17:54:31]\n"
)


def test_scontrols_one_line_node_is_read_with_its_reason_whole() -> None:
    n = parse_show_node(DRAINING, lambda text: {"2026-11-26T17:54:31": 1795715671.0}[text])
    assert (n.name, n.describe(), n.busy, n.drained, n.partitions, n.features) == (
        "gpu-03", "ALLOCATED+DRAIN", True, True, ("gpu",), ())  # fmt: skip
    assert (n.reason, n.reason_by, n.reason_at) == ("nhc: disk full, see /var/log/nhc.log", "root", 1795715671.0)
    idle = DRAINING.split(" Reason=")[0].replace("ALLOCATED+DRAIN", "IDLE").replace("(null) Gres", "h100,ib Gres")
    n = parse_show_node(idle, float)
    assert (n.describe(), n.reason, n.reason_by, n.features) == ("IDLE", "", "", ("h100", "ib"))
    ours = DRAINING.replace("nhc: disk full, see /var/log/nhc.log", "vigil:gpu-03-ab12cd-4:xid-79-a=b")
    assert vigil_drain(parse_show_node(ours, lambda _: 0.0).reason) == ("gpu-03-ab12cd-4", "xid-79-a=b")
    with pytest.raises(SlurmAnswerError, match="not a node"):
        parse_show_node("Node gpu-99 not found", float)
