"""Application XIDs on most of a job's nodes: the job's own crash (``controller.app_faults``)."""

from __future__ import annotations

from controller.app_faults import AppFaultConfig, AppFaults, JobMembership, job_crashed
from controller.decide import decide
from controller.node_state import Health, NodeState
from controller.policy import Policy
from vigil_core.signals import GpuRef, Signal, SignalKind

NODES = ("n1", "n2", "n3", "n4")
CFG = AppFaultConfig(window_s=60.0, fraction=0.5)


def xid(node: str, code: int, at: float) -> Signal:
    return Signal(node, SignalKind.XID, GpuRef(0, "GPU-0", "0000:18:00"), code, observed_at=at, seq=1)


def test_more_than_half_of_the_jobs_nodes_within_the_window_is_the_jobs_crash() -> None:
    assert not job_crashed(NODES, {"n1": 100.0, "n2": 100.0}, 100.0, CFG)  # half is not more than half
    assert job_crashed(NODES, {"n1": 100.0, "n2": 100.0, "n3": 101.0}, 101.0, CFG)
    assert not job_crashed(NODES, {"n1": 10.0, "n2": 10.0, "n3": 101.0}, 101.0, CFG)  # two are too old
    assert not job_crashed(("n1",), {"n1": 100.0}, 100.0, CFG)  # a one-node job: judged node by node


def test_only_application_xids_of_a_known_job_count_and_the_job_is_paged_once() -> None:
    membership = JobMembership()
    membership.set("train", NODES)
    faults, policy = AppFaults(membership, CFG), Policy()
    assert faults.crash_of(xid("n1", 79, 100.0), policy, 100.0) == ("", None)  # hardware: never the job's
    assert faults.crash_of(xid("n1", 13, 100.0), policy, 100.0) == ("", None)
    assert faults.crash_of(xid("n2", 31, 100.5), policy, 100.5) == ("", None)
    job, page = faults.crash_of(xid("n3", 13, 101.0), policy, 101.0)
    assert job == "train" and page is not None and page.node == "" and "3 of its 4 nodes" in page.summary
    assert faults.crash_of(xid("n4", 13, 101.2), policy, 101.2) == ("train", None)  # paged already
    membership.forget("train")
    assert faults.crash_of(xid("n4", 13, 102.0), policy, 102.0) == ("", None)


def test_an_application_xid_of_a_crashed_job_is_recorded_without_action() -> None:
    policy, state = Policy(), NodeState("n1")
    for i, at in enumerate((10.0, 10.1)):
        state = decide(state, xid("n1", 13, at), policy, at, f"inc-{i}", job_fault="train").state
    d = decide(state, xid("n1", 13, 10.2), policy, 10.2, "inc-2", job_fault="train")
    assert d.state.health is Health.HEALTHY and all(a.__class__.__name__ != "Page" for a in d.actions)
    alone = decide(state, xid("n1", 13, 10.2), policy, 10.2, "inc-2")
    assert alone.state.health is Health.SUSPECT  # the same third XID 13 without the job's crash
    hardware = decide(NodeState("n1"), xid("n1", 79, 10.0), policy, 10.0, "inc-h", job_fault="train")
    assert hardware.state.health is Health.UNHEALTHY  # job_fault never hides a hardware XID
