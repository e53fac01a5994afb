"""The wire's edge: what an agent may send, and what the controller takes."""

from __future__ import annotations

import pytest

from protos.codec import BadSignal, signal_from_proto, signal_problem, signal_to_proto
from vigil_core.signals import GpuRef, Signal, SignalKind


def test_a_signal_the_wire_cannot_carry_is_named() -> None:
    assert "64 bits" in signal_problem(Signal("n", SignalKind.XID, code=2**64))
    assert "count" in signal_problem(Signal("n", SignalKind.XID, code=79, count=0))
    assert "finite" in signal_problem(Signal("n", SignalKind.XID, code=79, observed_at=float("inf")))
    assert "GPU index" in signal_problem(Signal("n", SignalKind.XID, GpuRef(5000), code=79))
    assert signal_problem(Signal("n", SignalKind.XID, code=2**63 - 1)) == ""


def test_lone_surrogates_are_replaced_not_fatal() -> None:
    signal = Signal(
        "n", SignalKind.XID, GpuRef(0, "GPU-\ud800"), 79, message="bad \ud800 line", source="j\udcff", seq=1
    )
    assert signal_problem(signal) == ""
    back = signal_from_proto(type(signal_to_proto(signal)).FromString(signal_to_proto(signal).SerializeToString()))
    assert back.message == "bad \ufffd line" and back.gpu.uuid == "GPU-\ufffd"


def test_a_folded_storm_crosses_the_wire_with_its_count_and_times() -> None:
    storm = Signal("n", SignalKind.XID, code=45, observed_at=9.0, seq=3, count=1200, first_observed_at=2.0)
    assert signal_from_proto(signal_to_proto(storm)) == storm
    older_agent = signal_to_proto(Signal("n", SignalKind.XID, code=45, observed_at=9.0, seq=4))
    older_agent.ClearField("count")
    assert signal_from_proto(older_agent).count == 1  # 0 on the wire: an agent that does not fold
    wild = signal_to_proto(storm)
    wild.count = -5
    with pytest.raises(BadSignal, match="count"):
        signal_from_proto(wild)
