"""A relay's room for Hellos at the controller and its queue of agents (``controller.relay.hello_room``), pure."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from controller.relay.hello_room import GROWTH, MAX_ROOM, HelloRoom


def test_hellos_go_on_while_there_is_room_and_the_rest_are_queued_in_order() -> None:
    room = HelloRoom[str](min_waiting=1, room=2)
    assert room.size == 2
    assert room.say("a") and room.say("b") and room.waiting == 2
    assert not room.say("c") and not room.say("d") and room.queued == 2
    assert not room.say("c") and room.queued == 2  # said again while queued: one place in the queue
    assert room.answered(0.0, 0.1) == ["c"]  # a place came free: the first queued is called
    assert not room.say("e")  # a newcomer does not take the place kept for "c", nor pass "d"
    assert room.say("c") and room.waiting == 2 and room.queued == 2
    assert room.dropped() == ["d"]  # given up at the controller: its place free all the same
    assert room.answered(0.0, 0.1) == ["e"]


def test_an_agent_that_leaves_queued_is_skipped_and_one_that_leaves_called_frees_its_place() -> None:
    room = HelloRoom[str](min_waiting=1, room=1)
    assert room.say("a") and not room.say("b") and not room.say("c") and not room.say("d")
    assert room.left("b") == [] and room.queued == 2
    assert room.answered(0.0, 0.1) == ["c"]  # "b" left: skipped
    assert room.left("c") == ["d"]  # called, gone before its Hello: the place goes to the next


def test_a_fleet_asked_again_after_the_controller_is_back_is_called_as_far_as_the_room_goes() -> None:
    room = HelloRoom[int](min_waiting=3, room=1)
    called = [key for agent in range(10) for key in room.queue(agent)]
    assert called == [0, 1, 2] and room.queued == 7
    assert all(room.say(agent) for agent in called) and room.waiting == 3
    assert room.answered(0.0, 0.1) == [3]


def test_agents_with_faults_waiting_are_called_before_the_others_in_the_order_they_said_so() -> None:
    room = HelloRoom[str](min_waiting=1, room=1)
    assert room.say("a")
    assert not room.say("b") and not room.say("c") and not room.say("d")
    assert not room.say("e", urgent=True)  # queued (no place), but ahead of b, c and d
    assert room.hurry("c") == [] and room.queued_urgent == 2  # c's fault came while it waited
    assert room.hurry("c") == [] and room.hurry("zz") == [] and room.queued_urgent == 2  # once; not queued: nothing
    assert room.answered(0.0, 0.1) == ["e"]
    assert room.say("e")
    assert not room.say("f", urgent=True)  # behind c, the urgent one before it; never past a kept place
    assert room.answered(0.0, 0.1) == ["c"] and room.say("c")
    assert room.answered(0.0, 0.1) == ["f"] and room.say("f")
    assert room.answered(0.0, 0.1) == ["b"] and room.say("b")
    assert room.answered(0.0, 0.1) == ["d"]  # c's first place in the queue was skipped
    assert room.queued == 0 and room.queued_urgent == 0


def test_a_fleet_asked_again_calls_its_agents_with_faults_first() -> None:
    room = HelloRoom[int](min_waiting=2, room=1)
    called = [key for agent in range(6) for key in room.queue(agent, urgent=agent in (3, 5))]
    assert called == [0, 1] and room.queued_urgent == 2
    assert all(room.say(agent) for agent in called)
    assert room.answered(0.0, 0.1) == [3] and room.dropped() == [5]
    assert room.say(3) and room.say(5) and room.left(4) == []  # 4 gone while queued: skipped when its turn comes
    assert room.answered(0.0, 0.1) == [2] and room.answered(0.0, 0.1) == []


def test_the_room_never_falls_under_the_least_and_a_hello_that_cannot_be_queued_goes_on_anyway() -> None:
    room = HelloRoom[str](min_waiting=3, room=0.1)
    assert room.size == 3
    assert [room.say(k) for k in "abcd"] == [True, True, True, False]
    room.send_anyway()
    assert room.waiting == 4
    assert room.answered(0.0, 0.1) == []  # still over the room: nobody called yet
    assert room.answered(0.0, 0.1) == ["d"]


def answers(room: HelloRoom[int], start_s: float, seconds: float, per_s: int, waited_s: float, queued: bool) -> None:
    """The controller answers ``per_s`` Hellos a second for ``seconds``, each after ``waited_s``;
    with an agent queued all along, or none."""
    agents = iter(range(10**9))
    for i in range(int(seconds * per_s) + 1):
        if queued:
            while room.say(next(agents)):  # the room full, one queued
                pass
        for called in room.answered(start_s + i / per_s, waited_s):
            room.say(called)


def test_hellos_that_wait_past_the_wait_shrink_the_room_in_proportion_and_not_under_the_least() -> None:
    room = HelloRoom[int](wait_s=2.0, min_waiting=10, room=1000)
    answers(room, 0.0, 1.0, 100, waited_s=4.0, queued=True)
    assert room.size == 500  # waited twice as long as it should: half the room
    answers(room, 1.01, 1.0, 100, waited_s=3.0, queued=True)
    assert room.size == 333
    answers(room, 2.02, 1.0, 100, waited_s=100.0, queued=True)
    assert room.size == 166  # never less than half at once
    answers(room, 3.03, 10.0, 100, waited_s=100.0, queued=True)
    assert room.size == 10


def test_the_room_grows_while_agents_are_queued_and_the_hellos_wait_less_than_the_wait() -> None:
    room = HelloRoom[int](wait_s=2.0, min_waiting=10, room=100)
    answers(room, 0.0, 1.0, 100, waited_s=0.5, queued=True)
    assert room.size == int(100 * GROWTH)
    answers(room, 1.01, 3.0, 100, waited_s=0.5, queued=True)
    assert room.size == int(100 * GROWTH**4)
    quiet = HelloRoom[int](wait_s=2.0, min_waiting=10, room=100)
    answers(quiet, 0.0, 3.0, 100, waited_s=0.5, queued=False)  # nobody queued: no cause to grow
    assert quiet.size == 100
    big = HelloRoom[int](room=MAX_ROOM)
    answers(big, 0.0, 2.0, 10, waited_s=0.1, queued=True)
    assert big.size == MAX_ROOM


def test_the_time_without_the_controller_is_not_a_span_of_answers() -> None:
    room = HelloRoom[int](wait_s=2.0, min_waiting=1, room=100)
    answers(room, 0.0, 0.5, 100, waited_s=0.5, queued=True)  # half a span
    room.lost()  # 30 s without the controller; the Hellos at it dropped
    room.answered(30.5, 40.0)  # the first answer after: a span starts, nothing measured
    assert room.size == 100
    unsaid = HelloRoom[int](wait_s=2.0, min_waiting=1, room=100)
    answers(unsaid, 0.0, 0.5, 100, waited_s=0.5, queued=True)
    unsaid.answered(30.5, 40.0)  # without the loss said, one span from 0 to 30.5 s
    assert unsaid.size != 100


steps = st.lists(
    st.tuples(
        st.sampled_from(
            ["say", "say_urgent", "queue", "queue_urgent", "hurry", "answered", "refused", "dropped", "left", "lost"]
            + ["anyway"]
        ),
        st.integers(0, 20),
        st.floats(0, 3),
    ),
    max_size=300,
)


@given(steps=steps, size=st.floats(0, 20), wait=st.floats(0.001, 3), least=st.integers(1, 8))
def test_the_room_the_queue_and_the_calls_stay_sound_whatever_happens(
    steps: list[tuple[str, int, float]], size: float, wait: float, least: int
) -> None:
    room = HelloRoom[int](wait_s=wait, min_waiting=least, room=size)
    # The model: who was called; who waits, in what order: those with faults waiting, then the others.
    now, called, urgent, others = 0.0, set[int](), list[int](), list[int]()

    def enqueue(agent: int, hurried: bool) -> None:
        if agent in urgent or agent in called:
            return
        if hurried:
            if agent in others:
                others.remove(agent)
            urgent.append(agent)
        elif agent not in others:
            others.append(agent)

    for what, agent, step in steps:
        now += step
        before_waiting = room.waiting
        out: list[int] = []
        queued = urgent + others
        if what in ("say", "say_urgent"):
            was_called = agent in called
            went = room.say(agent, urgent=what == "say_urgent")
            if was_called:
                assert went  # its place was kept
                called.discard(agent)
            elif went:  # nobody it would wait behind, and a place free
                assert not (urgent if what == "say_urgent" else queued)
                assert before_waiting + len(called) < room.size
            else:
                enqueue(agent, what == "say_urgent")
        elif what in ("queue", "queue_urgent"):
            enqueue(agent, what == "queue_urgent")
            out = room.queue(agent, urgent=what == "queue_urgent")
        elif what == "hurry":
            if agent in others:
                enqueue(agent, True)
            out = room.hurry(agent)
        elif what in ("answered", "refused"):
            out = room.answered(now, waited_s=step * (2 if what == "refused" else 1))
        elif what == "dropped":
            out = room.dropped()
        elif what == "left":
            called.discard(agent)
            for lane in (urgent, others):
                if agent in lane:
                    lane.remove(agent)
            out = room.left(agent)
        elif what == "lost":
            room.lost()
        else:
            room.send_anyway()
        # Those called are the first queued, those with faults waiting first, in order, and only while a
        # place is free for them.
        queued = urgent + others
        assert out == queued[: len(out)]
        del urgent[: len(out)]
        del others[: max(0, len(out) - len(queued) + len(others))]
        queued = urgent + others
        called |= set(out)
        assert room.queued == len(queued) and room.queued_urgent == len(urgent)
        assert room.waiting >= 0 and least <= room.size <= MAX_ROOM
        if queued:  # nobody waits in the queue while a place is free
            assert room.waiting + len(called) >= room.size
