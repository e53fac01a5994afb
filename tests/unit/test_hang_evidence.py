"""A hung job's wavefront joined with its nodes' own signals: who may be blamed, and on what."""

from __future__ import annotations

import pytest

from controller.jobs.hang_evidence import NodeFault, fault_of, hang_blame, is_evidence
from controller.jobs.stacks import HangClass, RankPlace, Wavefront
from vigil_core.signals import SignalKind

NODES = ("node-a", "node-b", "node-c")
SINCE = 1000.0  # the job's last step


def wave(verdict: HangClass, *culprits: str) -> Wavefront:
    places = tuple(RankPlace(i, n, verdict is not HangClass.HOST, False, "train.py:9 in main", False) for i, n in
                   enumerate(culprits))  # fmt: skip
    return Wavefront(verdict, places, 2)


LINK = NodeFault("node-b", SignalKind.NVLINK_ERRORS, 4, SINCE - 5)
PORT = NodeFault("node-c", SignalKind.IB_PORT_FLAP, 1, SINCE + 3)


@pytest.mark.parametrize("verdict", [HangClass.APPLICATION, HangClass.IO])
def test_a_rank_stuck_in_its_own_code_or_a_read_blames_no_node_whatever_the_nodes_say(verdict: HangClass) -> None:
    blame = hang_blame(wave(verdict, "node-b"), NODES, [LINK, PORT], SINCE, 60)
    assert blame.nodes == () and "not the hardware" in blame.why


@pytest.mark.parametrize("verdict", [HangClass.COLLECTIVE, HangClass.ALIKE, HangClass.UNKNOWN, None])
def test_every_rank_in_a_collective_or_no_stacks_blames_each_node_with_evidence(verdict: HangClass | None) -> None:
    w = wave(verdict) if verdict is not None else None
    blame = hang_blame(w, NODES, [LINK, PORT], SINCE, 60)
    assert blame.nodes == ("node-b", "node-c")
    assert "node-b: NVLINK_ERRORS 4" in blame.why and "node-c: IB_PORT_FLAP 1" in blame.why


def test_a_rank_that_does_not_answer_blames_only_its_own_node_and_only_with_evidence() -> None:
    assert hang_blame(wave(HangClass.HOST, "node-b"), NODES, [LINK, PORT], SINCE, 60).nodes == ("node-b",)
    assert hang_blame(wave(HangClass.HOST, "node-a"), NODES, [LINK, PORT], SINCE, 60).nodes == ()


def test_evidence_from_long_before_the_hang_or_of_another_node_is_none() -> None:
    old = NodeFault("node-b", SignalKind.NVLINK_ERRORS, 4, SINCE - 61)
    elsewhere = NodeFault("node-z", SignalKind.IB_PORT_DOWN, 1, SINCE)
    blame = hang_blame(None, NODES, [old, elsewhere], SINCE, 60)
    assert blame.nodes == () and "nothing taken out of service" in blame.why


@pytest.mark.parametrize(
    ("kind", "code", "evidence"),
    [
        (SignalKind.XID, 79, True),  # the catalog: out of service
        (SignalKind.XID, 154, True),  # a recovery action
        (SignalKind.XID, 999, True),  # in no catalog: unknown, not known harmless
        (SignalKind.XID, 43, False),  # the application's (a teardown)
        (SignalKind.XID, 13, False),
        (SignalKind.XID, 92, False),  # the catalog says ignore
        (SignalKind.SXID_NONFATAL, 12028, True),
        (SignalKind.COLLECTOR_HUNG, 0, True),  # a wedged driver
        (SignalKind.DISK_FULL, 0, False),  # not the hardware a collective runs on
        (SignalKind.CHECK_FAILED, 0, False),
    ],
)
def test_what_counts_as_evidence(kind: SignalKind, code: int, evidence: bool) -> None:
    assert is_evidence(NodeFault("n", kind, code, 0.0)) is evidence


def test_an_incidents_key_reads_as_a_fault_and_a_key_it_cannot_read_as_none() -> None:
    assert fault_of("n", "GPU-1234|XID|79", 5.0) == NodeFault("n", SignalKind.XID, 79, 5.0)
    assert fault_of("n", "node|IB_PORT_FLAP|", 5.0) == NodeFault("n", SignalKind.IB_PORT_FLAP, 0, 5.0)
    assert fault_of("n", "0000:3b:00|NOT_A_KIND|1", 5.0) is None
    assert fault_of("n", "garbage", 5.0) is None
    assert fault_of("n", "gpu|XID|x", 5.0) is None
