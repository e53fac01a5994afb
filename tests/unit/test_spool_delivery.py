"""Nothing the spool's bound does is silent: every observation written is either committed by the
controller exactly once or counted as dropped, whatever the order of appends, sends, deliveries,
acknowledgements, broken streams and agent restarts.

The link here is driven step by step the way ``agent.link.ControllerLink`` drives the spool (``take``
after what this stream sent, ``ack`` on the controller's word, everything unacknowledged sent again
on a new stream); the controller keeps what ``controller.nodes.engine.Engine.receive`` keeps (a batch
committed once per seq, replays ignored).
"""

from __future__ import annotations

import tempfile
from collections import deque
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from agent.spool import Spool
from vigil_core.signals import GpuRef, Signal, SignalKind

# A few faults that repeat (merged past the bound), one the policy quarantines on (kept longest),
# and low-severity ones (dropped first).
FAULTS = [
    (SignalKind.XID, 0, 45),
    (SignalKind.XID, 1, 45),
    (SignalKind.XID, 0, 13),
    (SignalKind.XID, 2, 79),
    (SignalKind.THROTTLE, 0, 8),
    (SignalKind.THROTTLE, 3, 8),
]


def observation(fault: int, count: int, at: float) -> Signal:
    kind, gpu, code = FAULTS[fault]
    first = at - 1.0 if count > 1 else 0.0
    return Signal(
        "n1", kind, GpuRef(gpu, f"GPU-{gpu}", ""), code, 1.0, "x", "kmsg", at, count=count, first_observed_at=first
    )


class Controller:
    """What the controller keeps of one spool: each seq committed once."""

    def __init__(self) -> None:
        self.last_seq = 0
        self.committed = 0  # observations, a signal counting as many as it stands for

    def receive(self, batch: list[Signal]) -> int:
        for s in batch:
            if s.seq > self.last_seq:
                self.committed += s.count
                self.last_seq = s.seq
        return self.last_seq


class SpoolDelivery(RuleBasedStateMachine):
    @initialize(bound=st.integers(2, 8))
    def open(self, bound: int) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.path = Path(self.dir.name) / "spool.db"
        self.bound = bound
        self.spool = Spool(self.path, max_signals=bound, node="n1")
        self.controller = Controller()
        self.written = 0
        self.clock = 0.0
        self.connected = False
        self.sent_upto = 0
        self.in_flight: deque[list[Signal]] = deque()  # batches on the wire, not yet read
        self.acks: deque[int] = deque()  # the controller's acks on their way back

    def teardown(self) -> None:
        if not hasattr(self, "spool"):
            return
        # Everything still waiting is delivered: then the books must balance exactly.
        self.disconnect(delivered=0)
        self.connect()
        while self.spool.count():
            self.send(limit=7)
            while self.in_flight:
                self.deliver()
            while self.acks:
                self.ack()
        assert self.controller.committed + self.spool.dropped_total == self.written
        self.spool.close()
        self.dir.cleanup()

    @rule(faults=st.lists(st.tuples(st.integers(0, len(FAULTS) - 1), st.integers(1, 5)), min_size=1, max_size=12))
    def write(self, faults: list[tuple[int, int]]) -> None:
        signals = []
        for fault, count in faults:
            self.clock += 1.0
            signals.append(observation(fault, count, self.clock))
            self.written += count
        self.spool.append(signals)

    @precondition(lambda self: not self.connected)
    @rule()
    def connect(self) -> None:
        """Hello: the controller says what it holds, the agent drops it and sends the rest again."""
        self.spool.ack(self.controller.last_seq)
        self.connected, self.sent_upto = True, self.spool.acked_seq

    @precondition(lambda self: self.connected)
    @rule(limit=st.integers(1, 6))
    def send(self, limit: int) -> None:
        batch = [stored.signal() for stored in self.spool.take(after_seq=self.sent_upto, limit=limit)]
        if batch:
            self.in_flight.append(batch)
            self.sent_upto = batch[-1].seq

    @precondition(lambda self: self.in_flight)
    @rule()
    def deliver(self) -> None:
        self.acks.append(self.controller.receive(self.in_flight.popleft()))

    @precondition(lambda self: self.acks)
    @rule()
    def ack(self) -> None:
        self.spool.ack(self.acks.popleft())

    @precondition(lambda self: self.connected)
    @rule(delivered=st.integers(0, 3))
    def disconnect(self, delivered: int) -> None:
        """The stream breaks: some batches on the wire got through, their acks are lost."""
        for _ in range(min(delivered, len(self.in_flight))):
            self.controller.receive(self.in_flight.popleft())
        self.in_flight.clear()
        self.acks.clear()
        self.connected = False

    @rule()
    def restart(self) -> None:
        """The agent process stops and starts again on the same spool."""
        if self.connected:
            self.disconnect(delivered=0)
        self.spool.close()
        self.spool = Spool(self.path, max_signals=self.bound, node="n1")

    @invariant()
    def books_balance(self) -> None:
        """Committed + counted drops + what the spool still holds beyond the controller = written."""
        if not hasattr(self, "spool"):
            return
        held = sum(s.count for s in self.spool.pending(after_seq=self.controller.last_seq, limit=1_000_000))
        assert self.controller.committed + self.spool.dropped_total + held == self.written


TestSpoolDelivery = SpoolDelivery.TestCase
TestSpoolDelivery.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_a_repeat_past_the_bound_never_merges_into_a_signal_already_sent(tmp_path: Path) -> None:
    """The measured loss: a sent XID 45 with count 1, then repeats past the bound; the controller
    acknowledges the sent copy, and the repeats must still be there (merged into an unsent copy)."""
    spool = Spool(tmp_path / "s.db", max_signals=3)
    spool.append([observation(0, 1, 1.0)])
    (sent,) = spool.take(after_seq=0)
    spool.append([observation(0, 1, 2.0 + i) for i in range(10)])  # over the bound: merged
    assert spool.ack(sent.seq) == 1
    (rest,) = spool.pending(after_seq=sent.seq)
    assert (rest.count, spool.dropped_total) == (10, 0)


def test_what_an_earlier_process_may_have_sent_is_never_merged_into(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", max_signals=3)
    spool.append([observation(0, 1, 1.0)])
    spool.close()
    again = Spool(tmp_path / "s.db", max_signals=3)
    again.append([observation(0, 1, 2.0 + i) for i in range(10)])
    first, merged = again.pending(after_seq=0)
    assert (first.count, merged.count) == (1, 10)


def test_drops_are_counted_durably_and_logged(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    spool = Spool(tmp_path / "s.db", max_signals=4)
    with capture_logs() as logs:
        spool.append([observation(4 + i % 2, 1, float(i)) for i in range(3)] + [observation(2, 1, 9.0)])
        spool.append(
            [Signal("n1", SignalKind.THROTTLE, GpuRef(10 + i), 8, 1.0, "t", "gpu", 10.0 + i) for i in range(6)]
        )
    assert spool.dropped_total > 0 and spool.dropped_faults == 0  # only throttles went
    assert [e["event"] for e in logs] == ["spool_dropped"] and logs[0]["log_level"] == "warning"
    total = spool.dropped_total
    spool.close()
    assert Spool(tmp_path / "s.db", max_signals=4).dropped_total == total


def test_what_the_agent_dropped_while_the_spool_failed_is_counted_at_the_next_write(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db")
    spool.append([observation(2, 1, 1.0)], lost={"XID": 5, "THROTTLE": 2})
    assert (spool.dropped_total, spool.dropped_faults) == (7, 5)
