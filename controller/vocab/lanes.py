"""A relay's lanes: an agent's message carrying a signal the controller's policy may act on goes to
the controller before the backlog of everything else (record-only signals, heartbeats). The relay
cannot ask the policy; the controller tells it, first on its stream, what the policy only records
(``RelayDown.lanes``: ``Policy.record_only``), and the relay reads each signal batch's kinds and
codes against that. A Hello that says faults wait in its agent's spool (``Hello.urgent_waiting``)
goes first too: those faults come right after its answer, and a fleet's thousands of Hellos after
a failover would otherwise stand before it. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError

from controller.vocab.policy import RecordOnly
from protos.vigil.v1 import agent_pb2, common_pb2, relay_pb2
from vigil_core.signals import SignalKind

SIGNALS_TAG = b"\x1a"  # AgentMessage field 3 (signals), length-delimited: a signal batch's first byte
HELLO_TAG = b"\x0a"  # AgentMessage field 1 (hello), length-delimited: a Hello's first byte
# A relay's second stream to the controller, for the agent streams whose Hello says faults wait,
# says so in this metadata key (value ``URGENT``): the controller's logs name the lane.
LANE_KEY, URGENT = "vigil-relay-lane", "urgent"
_KNOWN_KINDS = frozenset(common_pb2.SignalKind.values()) - {common_pb2.SIGNAL_KIND_UNSPECIFIED}


def kind_number(kind: SignalKind) -> common_pb2.SignalKind:
    """A kind's number on the wire."""
    number: common_pb2.SignalKind = getattr(common_pb2, kind.value)  # the enum's value, as the stubs type it
    return number


def lanes_message(record_only: RecordOnly) -> relay_pb2.Lanes:
    """The controller's word to a relay."""
    return relay_pb2.Lanes(
        record_only_xids=sorted(record_only.xids),
        acting_xids=sorted(record_only.acting_xids),
        record_only_kinds=sorted(map(kind_number, record_only.kinds)),
        acting_kinds=sorted(map(kind_number, record_only.acting_kinds)),
        unlisted_record_only=record_only.unlisted,
    )


@dataclass(frozen=True, slots=True)
class Lanes:
    """What the relay was told, as the wire's numbers: which signals only get recorded."""

    xids: frozenset[int]
    acting_xids: frozenset[int]
    kinds: frozenset[int]
    acting_kinds: frozenset[int]
    unlisted: bool

    @classmethod
    def from_message(cls, lanes: relay_pb2.Lanes) -> Lanes:
        return cls(
            frozenset(lanes.record_only_xids),
            frozenset(lanes.acting_xids),
            frozenset(lanes.record_only_kinds),
            frozenset(lanes.acting_kinds),
            lanes.unlisted_record_only,
        )

    def may_act(self, kind: int, code: int) -> bool:
        """As ``RecordOnly.may_act``; a kind this relay does not know may act."""
        if kind not in _KNOWN_KINDS:
            return True
        if kind == common_pb2.XID:
            return code in self.acting_xids or (code not in self.xids and not self.unlisted)
        return kind in self.acting_kinds or (kind not in self.kinds and not self.unlisted)

    def urgent(self, raw: bytes) -> bool:
        """Whether an agent's message (as it came) carries a signal that may act, or is a Hello that
        says faults wait behind it. Only a signal batch or a Hello can (told by its first byte,
        without decoding anything else); one that does not decode counts as urgent, as at the
        controller (its refusal comes as soon)."""
        if raw[:1] == HELLO_TAG:
            try:
                return agent_pb2.AgentMessage.FromString(raw).hello.urgent_waiting > 0
            except DecodeError:
                return True
        if raw[:1] != SIGNALS_TAG:
            return False
        try:
            batch = agent_pb2.AgentMessage.FromString(raw).signals
        except DecodeError:
            return True
        return any(self.may_act(s.kind, s.code) for s in batch.signals)
