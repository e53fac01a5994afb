"""A relay's room for Hellos at the controller and its queue of agents (``controller.relay.turns``), pure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.relay.turns import MIN_RATE_PER_S, HelloRoom


def test_hellos_go_on_while_there_is_room_and_the_rest_are_queued_in_order() -> None:
    room = HelloRoom[str](wait_s=2.0, min_waiting=1, rate_per_s=1.0)  # room for 2
    assert room.size == 2
    assert room.say("a") and room.say("b") and room.waiting == 2
    assert not room.say("c") and not room.say("d") and room.queued == 2
    assert not room.say("c") and room.queued == 2  # said again while queued: one place in the queue
    assert room.answered(0.0, taken=True) == ["c"]  # a place came free: the first queued is called
    assert not room.say("e")  # a newcomer does not take the place kept for "c", nor pass "d"
    assert room.say("c") and room.waiting == 2 and room.queued == 2
    assert room.dropped() == ["d"]  # given up at the controller: its place free all the same
    assert room.answered(0.0, taken=True) == ["e"]


def test_an_agent_that_leaves_queued_is_skipped_and_one_that_leaves_called_frees_its_place() -> None:
    room = HelloRoom[str](wait_s=1.0, min_waiting=1, rate_per_s=1.0)
    assert room.say("a") and not room.say("b") and not room.say("c") and not room.say("d")
    assert room.left("b") == [] and room.queued == 2
    assert room.answered(0.0, taken=True) == ["c"]  # "b" left: skipped
    assert room.left("c") == ["d"]  # called, gone before its Hello: the place goes to the next


def test_a_fleet_asked_again_after_the_controller_is_back_is_called_as_far_as_the_room_goes() -> None:
    room = HelloRoom[int](wait_s=1.0, min_waiting=3, rate_per_s=1.0)
    called = [key for agent in range(10) for key in room.queue(agent)]
    assert called == [0, 1, 2] and room.queued == 7
    assert all(room.say(agent) for agent in called) and room.waiting == 3
    assert room.answered(0.0, taken=True) == [3]


def test_the_room_never_falls_under_the_least_and_a_hello_that_cannot_be_queued_goes_on_anyway() -> None:
    room = HelloRoom[str](wait_s=0.01, min_waiting=3, rate_per_s=10.0)
    assert room.size == 3
    assert [room.say(k) for k in "abcd"] == [True, True, True, False]
    room.send_anyway()
    assert room.waiting == 4
    assert room.answered(0.0, taken=False) == []  # still over the room: nobody called yet
    assert room.answered(0.0, taken=False) == ["d"]


def busy_for(room: HelloRoom[int], start_s: float, seconds: float, per_s: int) -> None:
    """The controller takes ``per_s`` Hellos a second for ``seconds``, agents queued all along."""
    agents = iter(range(10**9))
    while room.say(next(agents)):  # the room filled, one queued
        pass
    for i in range(int(seconds * per_s) + 1):
        for called in room.answered(start_s + i / per_s, taken=True):
            assert room.say(called)
        room.say(next(agents))  # another comes: queued


def test_the_rate_is_what_the_controller_took_while_agents_were_queued() -> None:
    room = HelloRoom[int](wait_s=0.01, min_waiting=1, rate_per_s=400.0)
    busy_for(room, 0.0, 4.0, 100)
    assert 100 <= room.rate_per_s < 130  # halfway each second from 400: 250, 175, 137.5, 118.75
    busy_for(room, 4.0, 16.0, 100)
    assert room.rate_per_s == pytest.approx(100, rel=0.01)


def test_a_quiet_span_only_raises_the_rate_and_refusals_do_not_count() -> None:
    room = HelloRoom[int](rate_per_s=400.0)
    for i in range(21):  # 10 a second, with room to spare
        assert room.say(i)
        room.answered(i / 10, taken=True)
    assert room.rate_per_s == 400.0
    busy = HelloRoom[int](rate_per_s=10.0, min_waiting=1000)
    for i in range(2001):  # 1,000 a second, none queued
        busy.say(i)
        busy.answered(i / 1000, taken=True)
    assert busy.rate_per_s == pytest.approx(1000, rel=0.01)
    refused = HelloRoom[int](wait_s=0.01, min_waiting=1, rate_per_s=100.0)
    refused.say(0)
    for i in range(1, 1001):  # refusals only, agents queued: nothing measured
        refused.say(i)
        for called in refused.answered(i / 100, taken=False):
            refused.say(called)
    assert refused.rate_per_s == 100.0


def test_the_time_without_the_controller_is_not_measured_as_a_rate_of_nothing() -> None:
    room = HelloRoom[int](wait_s=0.01, min_waiting=1, rate_per_s=100.0)
    busy_for(room, 0.0, 0.5, 100)  # half a span, busy
    room.lost()  # 30 s without the controller
    room.dropped()
    room.answered(30.5, taken=True)  # the first answer after it starts a span: nothing measured over the 30 s
    assert room.rate_per_s == 100.0
    unsaid = HelloRoom[int](wait_s=0.01, min_waiting=1, rate_per_s=100.0)
    busy_for(unsaid, 0.0, 0.5, 100)
    unsaid.dropped()
    unsaid.answered(30.5, taken=True)  # without the loss said: 51 taken in 30.5 s, busy
    assert unsaid.rate_per_s < 55


def test_a_controller_that_takes_next_to_nothing_still_leaves_the_least_rate() -> None:
    room = HelloRoom[int](wait_s=0.01, min_waiting=1, rate_per_s=100.0)
    busy_for(room, 0.0, 60.0, 1)
    assert room.rate_per_s == MIN_RATE_PER_S


steps = st.lists(
    st.tuples(
        st.sampled_from(["say", "queue", "answered", "refused", "dropped", "left", "lost", "anyway"]),
        st.integers(0, 20),
        st.floats(0, 3),
    ),
    max_size=300,
)


@given(steps=steps, rate=st.floats(MIN_RATE_PER_S, 5000), wait=st.floats(0.001, 1), least=st.integers(1, 8))
def test_the_room_the_queue_and_the_calls_stay_sound_whatever_happens(
    steps: list[tuple[str, int, float]], rate: float, wait: float, least: int
) -> None:
    room = HelloRoom[int](wait_s=wait, min_waiting=least, rate_per_s=rate)
    now, called, queued = 0.0, set[int](), list[int]()  # the model: who was called, who waits in what order
    for what, agent, step in steps:
        now += step
        before_waiting = room.waiting
        out: list[int] = []
        if what == "say":
            was_called, was_queued = agent in called, agent in queued
            went = room.say(agent)
            if was_called:
                assert went  # its place was kept
                called.discard(agent)
            elif went:
                assert not queued and before_waiting + len(called) < room.size
            elif not was_queued:
                queued.append(agent)
        elif what == "queue":
            if agent not in called and agent not in queued:
                queued.append(agent)
            out = room.queue(agent)
        elif what in ("answered", "refused"):
            out = room.answered(now, taken=what == "answered")
        elif what == "dropped":
            out = room.dropped()
        elif what == "left":
            called.discard(agent)
            if agent in queued:
                queued.remove(agent)
            out = room.left(agent)
        elif what == "lost":
            room.lost()
        else:
            room.send_anyway()
        # Those called are the first queued, in order, and only while a place is free for them.
        assert out == queued[: len(out)]
        del queued[: len(out)]
        called |= set(out)
        assert room.queued == len(queued)
        assert room.waiting >= 0 and room.rate_per_s >= MIN_RATE_PER_S
        if queued:  # nobody waits in the queue while a place is free
            assert room.waiting + len(called) >= room.size
