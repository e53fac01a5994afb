"""Hellos paced while a fleet reconnects at once (``controller.edge.hello_pacing``)."""

from __future__ import annotations

import heapq

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from controller.edge.hello_pacing import SLOT_KEPT_S, HelloPacing, turn_ms


def test_a_stampede_is_admitted_a_burst_at_once_then_one_turn_each_at_the_rate() -> None:
    pacing = HelloPacing(per_s=100, burst=10)
    waits = {f"n{i}": pacing.ask(f"n{i}", now=0.0) for i in range(50)}
    assert sum(w == 0 for w in waits.values()) == 10
    turns = sorted(w for w in waits.values() if w > 0)
    assert turns == pytest.approx([0.01 * k for k in range(1, 41)])  # one rate interval apart
    assert pacing.waiting == 40
    # Each comes back at its turn: admitted without waiting again, whoever else asks meanwhile.
    for node, wait in sorted(waits.items(), key=lambda kv: kv[1]):
        if wait > 0:
            assert pacing.ask("newcomer-" + node, now=wait) > 0  # a newcomer waits behind the turns
            assert pacing.ask(node, now=wait) == 0.0
    assert pacing.waiting == 40  # the newcomers' turns now


def test_one_that_comes_back_early_keeps_its_turn_and_one_that_never_comes_loses_it() -> None:
    pacing = HelloPacing(per_s=10, burst=1)
    assert pacing.ask("a", 0.0) == 0.0
    turn = pacing.ask("b", 0.0)
    assert turn == pytest.approx(0.1)
    assert pacing.ask("b", 0.02) == pytest.approx(turn - 0.02)  # the same turn, not a later one
    assert pacing.ask("c", 0.0) == pytest.approx(0.2)
    assert pacing.waiting == 2
    assert pacing.ask("d", SLOT_KEPT_S + 1.0) == 0.0  # the schedule long free again
    assert pacing.waiting == 0  # b's and c's turns, never taken, given up


@settings(max_examples=300, deadline=None)
@example(400.0, 1, [(0.0, 0)] * 5)  # a turn shorter than the early allowance: never taken at once
@given(
    st.floats(1, 1000),
    st.integers(1, 50),
    st.lists(st.tuples(st.floats(0, 20), st.integers(0, 200)), min_size=1, max_size=400),
)
def test_admissions_never_outrun_the_rate_and_every_turn_is_honoured(
    per_s: float, burst: int, asks: list[tuple[float, int]]
) -> None:
    """Hellos at any times (a node may ask again while it waits); each node turned away comes back
    at its turn. In any span of T seconds at most burst + rate·T are admitted (+1: the span's ends),
    and a node back at its turn is always admitted."""
    pacing = HelloPacing(per_s, burst)
    events = [(at, 0, f"n{who}") for at, who in asks]  # (when, 1 for a return at its turn, node)
    heapq.heapify(events)
    admitted: list[float] = []
    while events:
        at, returning, node = heapq.heappop(events)
        wait = pacing.ask(node, at)
        if returning:
            assert wait == 0.0, (node, at)
        if wait == 0.0:
            admitted.append(at)
            events = [e for e in events if not (e[2] == node and e[1])]  # in: no return to make
            heapq.heapify(events)
        elif not any(n == node and r for _, r, n in events):  # one return scheduled per node
            heapq.heappush(events, (at + wait, 1, node))
    for i, start in enumerate(admitted):
        for j in range(i, len(admitted)):
            assert j - i + 1 <= burst + per_s * (admitted[j] - start) + 1 + 1e-6


@given(wait_s=st.floats(min_value=0, max_value=3600, exclude_min=True))
@example(wait_s=0.0004)  # under a millisecond: said as 0 once, which is no turn at all
def test_a_turn_on_the_wire_is_never_zero_nor_earlier_than_given(wait_s: float) -> None:
    said = turn_ms(wait_s)
    assert said >= 1 and said / 1000 >= wait_s and said - wait_s * 1000 < 1 + 1e-6
