"""A relay's room for Hellos at the controller and its queue of agents (``controller.relay.hello_room``), pure."""

from __future__ import annotations

from collections import deque

from hypothesis import given
from hypothesis import strategies as st

from controller.relay.hello_room import GROWTH, MAX_ROOM, HelloRoom


def test_hellos_go_on_while_there_is_room_and_the_rest_are_queued_in_order() -> None:
    room = HelloRoom[str](min_waiting=1, room=2)
    assert room.size == 2
    assert room.say("a") and room.say("b") and room.waiting == 2
    assert not room.say("c") and not room.say("d") and room.queued == 2
    assert not room.say("c") and room.queued == 2  # said again while queued: one place in the queue
    assert room.answered("a", 0.0, 0.1) == ["c"]  # a place came free: the first queued is called
    assert not room.say("e")  # a newcomer does not take the place kept for "c", nor pass "d"
    assert room.say("c") and room.waiting == 2 and room.queued == 2
    assert room.dropped("b") == ["d"]  # given up at the controller: its place free all the same
    assert room.answered("c", 0.0, 0.1) == ["e"]


def test_an_agent_that_leaves_queued_is_skipped_and_one_that_leaves_called_frees_its_place() -> None:
    room = HelloRoom[str](min_waiting=1, room=1)
    assert room.say("a") and not room.say("b") and not room.say("c") and not room.say("d")
    assert room.left("b") == [] and room.queued == 2
    assert room.answered("a", 0.0, 0.1) == ["c"]  # "b" left: skipped
    assert room.left("c") == ["d"]  # called, gone before its Hello: the place goes to the next


def test_a_fleet_asked_again_after_the_controller_is_back_is_called_as_far_as_the_room_goes() -> None:
    room = HelloRoom[int](min_waiting=3, room=1)
    called = [key for agent in range(10) for key in room.queue(agent)]
    assert called == [0, 1, 2] and room.queued == 7
    assert all(room.say(agent) for agent in called) and room.waiting == 3
    assert room.answered(0, 0.0, 0.1) == [3]


def test_a_fault_s_hello_goes_on_past_a_full_room_in_a_lane_of_its_own() -> None:
    room = HelloRoom[str](min_waiting=1, room=2)
    assert room.say("a") and room.say("b") and not room.say("c")  # the fleet's lane full, c queued
    assert room.say("e", urgent=True) and room.say("f", urgent=True)  # the urgent lane's two places
    assert room.waiting == 4 and room.waiting_urgent == 2
    assert not room.say("g", urgent=True) and room.queued_urgent == 1  # both lanes full: queued first
    assert room.answered("a", 0.0, 0.1) == ["g"]  # the fleet's lane's place goes to the fault first
    assert room.say("g") and room.waiting_urgent == 2  # in the fleet's lane's place it was called to
    assert room.answered("e", 0.0, 0.1) == []  # the urgent lane's place: only for a fault
    assert room.say("h", urgent=True) and room.waiting_urgent == 2
    assert room.answered("g", 0.0, 0.1) == ["c"]


def test_agents_with_faults_waiting_are_called_before_the_others_in_the_order_they_said_so() -> None:
    room = HelloRoom[str](min_waiting=1, room=1)
    assert room.say("a")
    assert not room.say("b") and not room.say("c") and not room.say("d")
    assert room.say("e", urgent=True)  # the urgent lane's place: no fleet fills it
    assert not room.say("f", urgent=True)  # both lanes full: queued, ahead of b, c and d
    assert room.hurry("c") == [] and room.queued_urgent == 2  # c's fault came while it waited
    assert room.hurry("c") == [] and room.hurry("zz") == [] and room.queued_urgent == 2  # once; not queued: nothing
    assert room.answered("e", 0.0, 0.1) == ["f"] and room.say("f")
    assert not room.say("g", urgent=True)  # behind c, the urgent one before it; never past a kept place
    assert room.answered("a", 0.0, 0.1) == ["c"] and room.say("c")
    assert room.answered("f", 0.0, 0.1) == ["g"] and room.say("g")
    assert room.answered("c", 0.0, 0.1) == ["b"] and room.say("b")
    assert room.answered("b", 0.0, 0.1) == ["d"]  # c's first place in the queue was skipped
    assert room.queued == 0 and room.queued_urgent == 0


def test_a_fleet_asked_again_calls_its_agents_with_faults_first() -> None:
    room = HelloRoom[int](min_waiting=2, room=1)
    called = [key for agent in range(8) for key in room.queue(agent, urgent=agent in (5, 6, 7))]
    assert called == [0, 1, 5, 6] and room.queued_urgent == 1  # the urgent lane's two places to 5 and 6
    assert all(room.say(agent) for agent in called)
    assert room.answered(0, 0.0, 0.1) == [7] and room.dropped(5) == []  # 7 before 2; no fault left queued
    assert room.say(7) and room.left(3) == []  # 3 gone while queued: skipped when its turn comes
    assert room.answered(1, 0.0, 0.1) == [2] and room.answered(7, 0.0, 0.1) == [4]


def test_the_room_never_falls_under_the_least_and_a_hello_that_cannot_be_queued_goes_on_anyway() -> None:
    room = HelloRoom[str](min_waiting=3, room=0.1)
    assert room.size == 3
    assert [room.say(k) for k in "abcd"] == [True, True, True, False]
    room.send_anyway()
    assert room.waiting == 4
    assert room.answered("a", 0.0, 0.1) == []  # still over the room: nobody called yet
    assert room.answered("b", 0.0, 0.1) == ["d"]


def answers(room: HelloRoom[int], start_s: float, seconds: float, per_s: int, waited_s: float, queued: bool) -> None:
    """The controller answers ``per_s`` Hellos a second for ``seconds``, each after ``waited_s``;
    with an agent queued all along, or none."""
    agents, at = iter(range(10**9)), deque[int]()
    for i in range(int(seconds * per_s) + 1):
        if queued:
            while room.say(agent := next(agents)):  # the room full, one queued
                at.append(agent)
        for called in room.answered(at.popleft() if at else -1, start_s + i / per_s, waited_s):
            assert room.say(called)
            at.append(called)


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
    room.answered(-1, 30.5, 40.0)  # the first answer after: a span starts, nothing measured
    assert room.size == 100
    unsaid = HelloRoom[int](wait_s=2.0, min_waiting=1, room=100)
    answers(unsaid, 0.0, 0.5, 100, waited_s=0.5, queued=True)
    unsaid.answered(-1, 30.5, 40.0)  # without the loss said, one span from 0 to 30.5 s
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
    # The model: each Hello at the controller and each place kept, with its lane (True: the urgent
    # lane's); who waits, in what order: those with faults waiting, then the others.
    now, at, called, urgent, others = 0.0, dict[int, bool](), dict[int, bool](), list[int](), list[int]()
    anyway = iter(range(-1, -(10**6), -1))  # Hellos sent whatever the room: keys no agent has

    def free(lane: bool) -> int:
        return room.size - sum(1 for v in at.values() if v == lane) - sum(1 for v in called.values() if v == lane)

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
        out: list[int] = []
        if what in ("say", "say_urgent"):
            if agent in at:
                continue  # one Hello at a time: the next comes after its answer
            hurried = what == "say_urgent"
            lanes = [True, False] if hurried else [False]
            free_lane = next((lane for lane in lanes if free(lane) > 0), None)
            if agent in called:
                expected: bool | None = called.pop(agent)  # its kept place
            elif (not urgent if hurried else not (urgent or others)) and free_lane is not None:
                expected = free_lane  # nobody it would wait behind, and a place free
            else:
                expected = None
            went = room.say(agent, urgent=hurried)
            assert went == (expected is not None)
            if expected is not None:
                at[agent] = expected
            else:
                enqueue(agent, hurried)
        elif what in ("queue", "queue_urgent"):
            if agent in at:
                continue
            enqueue(agent, what == "queue_urgent")
            out = room.queue(agent, urgent=what == "queue_urgent")
        elif what == "hurry":
            if agent in others:
                enqueue(agent, True)
            out = room.hurry(agent)
        elif what in ("answered", "refused", "dropped"):
            if not at:
                continue
            key = sorted(at)[agent % len(at)]
            del at[key]
            if what == "dropped":
                out = room.dropped(key)
            else:
                out = room.answered(key, now, waited_s=step * (2 if what == "refused" else 1))
        elif what == "left":
            if agent in at:  # the relay gives up its Hello at the controller first
                del at[agent]
                room.dropped(agent)
            called.pop(agent, None)
            for lane in (urgent, others):
                if agent in lane:
                    lane.remove(agent)
            out = room.left(agent)
        elif what == "lost":
            room.lost()
        else:
            room.send_anyway()
            at[next(anyway)] = False
        # Those called: the urgent lane's places to those with faults waiting, then the other lane's
        # to them first and then to the rest, each in turn, only while a place is free for them.
        expected_out: list[int] = []
        for lane in (True, False):
            while free(lane) > 0 and (urgent if lane else (urgent or others)):
                key = (urgent if lane or urgent else others).pop(0)
                called[key] = lane
                expected_out.append(key)
        assert out == expected_out or what in ("say", "say_urgent", "lost", "anyway") and not expected_out
        assert room.queued == len(urgent) + len(others) and room.queued_urgent == len(urgent)
        assert room.waiting == len(at) and room.waiting_urgent == sum(at.values())
        assert least <= room.size <= MAX_ROOM
