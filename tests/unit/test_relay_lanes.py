"""A relay's lanes (``controller.vocab.lanes``): what it is told of the policy, read back, says of
every signal what the policy itself says (``Policy.may_act``), so the relay's first lane carries
exactly the signals the controller's own lane would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.vocab.lanes import HELLO_TAG, SIGNALS_TAG, Lanes, kind_number, lanes_message
from controller.vocab.policy import Policy, Rule, Severity
from controller.vocab.xid_catalog import RECOVERY_XID
from protos.vigil.v1 import agent_pb2, common_pb2
from vigil_core.signals import GpuRef, Signal, SignalKind

rules = st.builds(Rule, action=st.sampled_from(list(Severity)), escalate_after=st.one_of(st.none(), st.integers(1, 5)))
kinds = st.sampled_from(list(SignalKind))
codes = st.one_of(st.integers(1, 200), st.just(RECOVERY_XID), st.integers(1000, 65535))


@settings(max_examples=300, deadline=None)
@given(
    xid=st.dictionaries(st.integers(1, 200), rules, max_size=20),
    kind_rules=st.dictionaries(kinds, rules, max_size=8),
    unknown=rules,
    signal=st.tuples(kinds, codes, st.sampled_from(["", "Recovery action changed to 0x1 (GPU Reset Required)"])),
)
def test_the_relay_reads_a_signal_as_the_policy_does(
    xid: dict[int, Rule], kind_rules: dict[SignalKind, Rule], unknown: Rule, signal: tuple[SignalKind, int, str]
) -> None:
    policy = Policy(xid=xid, kinds=kind_rules, unknown_xid=unknown)
    lanes = Lanes.from_message(lanes_message(policy.record_only()))
    kind, code, message = signal
    seen = Signal("n", kind, GpuRef(0, "GPU-0"), code, 0.0, message, "test", 1.0, seq=1)
    if kind is SignalKind.XID and code == RECOVERY_XID:  # its rule hangs on its message: counted as acting
        assert lanes.may_act(kind_number(kind), code)
    else:
        assert lanes.may_act(kind_number(kind), code) == policy.may_act(seen)
    assert policy.record_only().may_act(kind, code) == lanes.may_act(kind_number(kind), code)


def test_a_batch_is_urgent_when_one_signal_may_act_and_what_does_not_decode_is_urgent_too() -> None:
    lanes = Lanes.from_message(lanes_message(Policy().record_only()))

    def batch(*codes: int, kind: int = common_pb2.XID) -> bytes:
        msg = agent_pb2.SignalBatch()
        for i, code in enumerate(codes):
            msg.signals.add(node="n", kind=kind, code=code, observed_at=1.0, seq=i + 1)  # type: ignore[arg-type]
        return agent_pb2.AgentMessage(signals=msg).SerializeToString()

    assert not lanes.urgent(batch(63, 63)) and lanes.urgent(batch(63, 79))
    assert lanes.urgent(batch(5, kind=999))  # a kind this relay does not know may act
    assert lanes.urgent(b"\x1a\x05\xff\xff")  # a signal batch that does not decode
    beat = agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(sent_at=1.0)).SerializeToString()
    hello = agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="n")).SerializeToString()
    assert not lanes.urgent(beat) and not lanes.urgent(hello) and not lanes.urgent(b"")


@settings(max_examples=200, deadline=None)
@given(
    body=st.sampled_from(["hello", "heartbeat", "signals", "check_result"]),
    seq=st.integers(0, 2**40),
    text=st.text(max_size=30),
    signals=st.integers(0, 3),
)
def test_a_messages_first_byte_says_whether_it_is_a_signal_batch(body: str, seq: int, text: str, signals: int) -> None:
    """What the relay and the controller read without decoding (``SIGNALS_TAG``) is what decoding says."""
    msg = agent_pb2.AgentMessage()
    if body == "hello":
        msg.hello.node, msg.hello.last_acked_seq = text, seq
    elif body == "heartbeat":
        msg.heartbeat.sent_at, msg.heartbeat.spooled = float(seq), seq
    elif body == "check_result":
        msg.check_result.reason = text
    else:
        msg.signals.SetInParent()
        for i in range(signals):
            msg.signals.signals.add(node=text, kind=common_pb2.XID, code=seq % 200, seq=i + 1)
    raw = msg.SerializeToString()
    assert (raw[:1] == SIGNALS_TAG) == (agent_pb2.AgentMessage.FromString(raw).WhichOneof("body") == "signals")


def test_a_hello_that_says_faults_wait_goes_first_and_no_other_hello_does() -> None:
    lanes = Lanes.from_message(lanes_message(Policy().record_only()))
    urgent = agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="n1", urgent_waiting=2)).SerializeToString()
    plain = agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="n1", resumable=True)).SerializeToString()
    assert urgent[:1] == plain[:1] == HELLO_TAG
    assert lanes.urgent(urgent) and not lanes.urgent(plain)
    assert lanes.urgent(HELLO_TAG + b"\xff")  # not a message: as urgent as its refusal
