"""A relay's Hellos to the controller and the turns it gives the rest (``controller.relay.turns``), pure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.relay.turns import MAX_TURN_S, MIN_RATE_PER_S, HelloTurns


def test_as_many_hellos_go_on_as_the_controller_answers_in_the_wait_and_the_rest_get_turns_in_order() -> None:
    turns = HelloTurns(wait_s=2.0, min_waiting=1, rate_per_s=5.0)  # room for 10
    assert turns.room == 10
    assert all(turns.admit(0.0) for _ in range(10)) and turns.waiting == 10
    assert not turns.admit(0.0)
    # One after another at the rate: 0.2 s apart, from now.
    assert [turns.turn_s(0.0) for _ in range(3)] == pytest.approx([0.0, 0.2, 0.4])
    assert turns.turn_s(0.1) == pytest.approx(0.5)  # still after those given before


def test_a_new_hello_comes_after_the_turns_given_before_it_and_one_back_at_its_turn_goes_on() -> None:
    turns = HelloTurns(wait_s=1.0, min_waiting=2, rate_per_s=1.0)
    assert turns.admit(0.0) and turns.admit(0.0) and not turns.admit(0.0)
    assert turns.turn_s(0.0) == 0.0 and turns.turn_s(0.0) == pytest.approx(1.0)  # turns up to 2.0 s taken
    turns.answered(0.5)
    # Room for one now: an agent back at its turn takes it, a new one waits behind the turns given.
    assert not turns.admit(0.6)
    assert turns.admit(0.6, returning=True) and turns.waiting == 2
    turns.answered(2.5)
    assert turns.admit(2.5)  # no turn still to come: a new Hello goes on


def test_the_room_never_falls_under_the_least_and_a_hello_that_cannot_be_given_a_turn_goes_on_anyway() -> None:
    turns = HelloTurns(wait_s=0.01, min_waiting=3, rate_per_s=10.0)
    assert turns.room == 3
    assert [turns.admit(0.0) for _ in range(4)] == [True, True, True, False]
    turns.send_anyway()
    assert turns.waiting == 4


def busy_for(turns: HelloTurns, start_s: float, seconds: float, per_s: int) -> None:
    """The controller answers ``per_s`` Hellos a second for ``seconds``, with more always turned away."""
    while turns.admit(start_s):  # the room filled
        pass
    for i in range(int(seconds * per_s) + 1):
        now = start_s + i / per_s
        turns.answered(now)
        while turns.admit(now):  # as many as there is room for
            pass


def test_the_rate_is_what_the_controller_answered_while_hellos_were_turned_away() -> None:
    turns = HelloTurns(wait_s=0.01, min_waiting=1, rate_per_s=400.0)
    busy_for(turns, 0.0, 4.0, 100)
    assert 100 <= turns.rate_per_s < 130  # halfway each second from 400: 250, 175, 137.5, 118.75
    busy_for(turns, 4.0, 16.0, 100)
    assert turns.rate_per_s == pytest.approx(100, rel=0.01)


def test_a_quiet_second_only_raises_the_rate() -> None:
    turns = HelloTurns(rate_per_s=400.0)
    for i in range(21):  # 10 answers a second, with room to spare
        turns.admit(i / 10)
        turns.answered(i / 10)
    assert turns.rate_per_s == 400.0
    busy = HelloTurns(rate_per_s=10.0, min_waiting=1000)
    for i in range(2001):  # 1,000 a second, never turned away
        busy.admit(i / 1000)
        busy.answered(i / 1000)
    assert busy.rate_per_s == pytest.approx(1000, rel=0.01)


def test_the_time_without_the_controller_is_not_measured_as_a_rate_of_nothing() -> None:
    turns = HelloTurns(wait_s=0.01, min_waiting=1, rate_per_s=100.0)
    busy_for(turns, 0.0, 0.5, 100)  # half a span, busy
    turns.lost()  # 30 s without the controller: its waiting Hello dropped
    turns.dropped()
    assert turns.waiting == 0
    assert turns.admit(30.5)
    turns.answered(30.5)  # the first answer after it starts a span: nothing measured over the 30 s
    assert turns.rate_per_s == 100.0
    # Without the loss said, the same would have been measured as 101 answers in 30.5 s, busy.
    unsaid = HelloTurns(wait_s=0.01, min_waiting=1, rate_per_s=100.0)
    busy_for(unsaid, 0.0, 0.5, 100)
    unsaid.dropped()
    unsaid.admit(30.5)
    unsaid.answered(30.5)
    assert unsaid.rate_per_s < 55


def test_a_controller_that_answers_next_to_nothing_still_gives_turns_at_the_least_rate() -> None:
    turns = HelloTurns(wait_s=0.01, min_waiting=1, rate_per_s=100.0)
    busy_for(turns, 0.0, 60.0, 1)
    assert turns.rate_per_s == MIN_RATE_PER_S


events = st.lists(
    st.tuples(st.sampled_from(["admit", "return", "turn", "answered", "dropped", "lost"]), st.floats(0, 5)),
    max_size=200,
)


@given(events=events, rate=st.floats(MIN_RATE_PER_S, 5000), wait=st.floats(0.01, 10), least=st.integers(1, 100))
def test_the_count_and_the_turns_stay_sound_whatever_happens(
    events: list[tuple[str, float]], rate: float, wait: float, least: int
) -> None:
    turns = HelloTurns(wait_s=wait, min_waiting=least, rate_per_s=rate)
    now, last_turn_at = 0.0, 0.0
    for what, step in events:
        now += step
        if what in ("admit", "return"):
            before = turns.waiting
            if turns.admit(now, returning=what == "return"):
                assert before < turns.room
        elif what == "turn":
            turn = turns.turn_s(now)
            assert 0 <= turn <= MAX_TURN_S
            assert now + turn >= last_turn_at - 1e-9 or turn == MAX_TURN_S  # never before one given earlier
            last_turn_at = now + turn
        elif what == "answered":
            turns.answered(now)
        elif what == "dropped":
            turns.dropped()
        else:
            turns.lost()
        assert turns.waiting >= 0 and turns.rate_per_s >= MIN_RATE_PER_S
