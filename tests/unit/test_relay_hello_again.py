"""When a relay keeps an agent's call for a Hello again (``controller.relay.server``), pure."""

from __future__ import annotations

import grpc
from hypothesis import given
from hypothesis import strategies as st

from controller.relay.server import hello_again_in, hello_of
from controller.relay.uplink import Lost
from protos.vigil.v1 import agent_pb2, relay_pb2

EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
codes = st.sampled_from([code.value[0] for code in grpc.StatusCode])


def test_a_lost_controller_or_a_later_turn_keeps_the_call_of_an_agent_that_can_say_hello_again() -> None:
    assert hello_again_in(Lost("the relay lost the controller"), resumable=True) == 0
    assert hello_again_in(relay_pb2.StreamEnd(code=EXHAUSTED, retry_after_ms=750), resumable=True) == 750
    # Exhausted without a turn (a node over its message rate) ends the call, as does any other end.
    assert hello_again_in(relay_pb2.StreamEnd(code=EXHAUSTED, details="too many messages"), resumable=True) is None
    unavailable = grpc.StatusCode.UNAVAILABLE.value[0]
    assert hello_again_in(relay_pb2.StreamEnd(code=unavailable, details="store down"), resumable=True) is None


@given(code=codes, retry_ms=st.integers(0, 10**6), lost=st.booleans())
def test_an_agent_that_cannot_say_hello_again_always_has_its_call_ended(code: int, retry_ms: int, lost: bool) -> None:
    ended = Lost("x") if lost else relay_pb2.StreamEnd(code=code, retry_after_ms=retry_ms)
    assert hello_again_in(ended, resumable=False) is None


@given(code=codes, retry_ms=st.integers(0, 10**6))
def test_only_a_turn_given_to_a_hello_is_waited_for(code: int, retry_ms: int) -> None:
    kept = hello_again_in(relay_pb2.StreamEnd(code=code, retry_after_ms=retry_ms), resumable=True)
    assert kept == (retry_ms if code == EXHAUSTED and retry_ms > 0 else None)


def test_only_a_hello_is_read_as_one() -> None:
    hello = agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="node-a", resumable=True)).SerializeToString()
    beat = agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(sent_at=1.0)).SerializeToString()
    read = hello_of(hello)
    assert read is not None and read.node == "node-a" and read.resumable
    assert hello_of(beat) is None and hello_of(b"\xff\xff not a message") is None
