from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from controller.nodes.guards.rules import (
    Admission,
    BreakerState,
    GuardrailConfig,
    TokenBucket,
    admit_quarantine,
    breaker_limit,
    with_adopted,
)

Plain = tuple[float | None, tuple[tuple[str, float], ...], tuple[str, ...]]  # tripped at, every (node, when), held


def test_limit_is_the_smaller_of_count_and_fraction() -> None:
    cfg = GuardrailConfig(breaker_max_nodes=20, breaker_max_fraction=0.05)
    assert breaker_limit(2000, cfg) == 20
    assert breaker_limit(100, cfg) == 5
    assert breaker_limit(4, cfg) == 1  # never zero: one bad node in a tiny cluster is still handled


def test_breaker_trips_past_the_limit_and_holds_until_resumed() -> None:
    cfg = GuardrailConfig(breaker_max_nodes=2, breaker_max_fraction=1.0, breaker_window_s=60)
    state = BreakerState()
    verdicts = []
    for i, node in enumerate(["a", "b", "c", "d"]):
        state, verdict = admit_quarantine(state, node, 10, cfg, 100.0 + i)
        verdicts.append(verdict)
    assert verdicts == [Admission.GO, Admission.GO, Admission.TRIP, Admission.HOLD]
    assert state.held == ("c", "d") and state.tripped_at == 102.0
    state, verdict = admit_quarantine(state, "e", 10, cfg, 10_000.0)  # long after: still paused
    assert verdict is Admission.HOLD


def test_the_window_slides() -> None:
    cfg = GuardrailConfig(breaker_max_nodes=2, breaker_max_fraction=1.0, breaker_window_s=60)
    state = BreakerState()
    for t, node in ((0.0, "a"), (30.0, "b"), (61.0, "c"), (95.0, "d")):
        state, verdict = admit_quarantine(state, node, 10, cfg, t)
        assert verdict is Admission.GO, node
    state, verdict = admit_quarantine(state, "e", 10, cfg, 100.0)
    assert verdict is Admission.TRIP


def test_the_same_node_again_does_not_count_twice() -> None:
    cfg = GuardrailConfig(breaker_max_nodes=1, breaker_max_fraction=1.0)
    state, first = admit_quarantine(BreakerState(), "a", 10, cfg, 0.0)
    state, again = admit_quarantine(state, "a", 10, cfg, 1.0)
    assert (first, again) == (Admission.GO, Admission.GO)


@given(
    st.lists(st.tuples(st.sampled_from("abcdefghij"), st.floats(0, 1000)), max_size=60),
    st.integers(1, 5),
    st.floats(1, 500),
)
def test_never_more_than_the_limit_go_within_any_window(
    events: list[tuple[str, float]], limit: int, window: float
) -> None:
    cfg = GuardrailConfig(breaker_max_nodes=limit, breaker_max_fraction=1.0, breaker_window_s=window)
    state, gone = BreakerState(), []
    for node, t in sorted(events, key=lambda e: e[1]):
        state, verdict = admit_quarantine(state, node, 10, cfg, t)
        if verdict is Admission.GO:
            gone.append((node, t))
    for _, t in gone:
        inside = {n for n, u in gone if t - window < u <= t}
        assert len(inside) <= limit


def test_token_bucket_spreads_a_burst() -> None:
    bucket = TokenBucket(rate=10.0, burst=5)
    waits = [bucket.reserve(0.0) for _ in range(8)]
    assert waits[:5] == [0.0] * 5
    assert [round(w, 6) for w in waits[5:]] == [0.1, 0.2, 0.3]  # queued behind each other, not all at 0.1
    assert bucket.reserve(10.0) == 0.0  # refilled


def test_a_new_leader_counts_the_adopted_quarantines() -> None:
    cfg = GuardrailConfig(breaker_max_nodes=2, breaker_max_fraction=1.0, breaker_window_s=60)
    state = with_adopted(BreakerState(), [("a", 950.0), ("b", 990.0), ("old", 100.0)], cfg, 1000.0)
    assert set(state.recent) == {"a", "b"}  # the old one is outside the window
    state, verdict = admit_quarantine(state, "c", 10, cfg, 1000.0)
    assert verdict is Admission.TRIP  # no fresh allowance after a failover


def _admit_by_definition(
    state: Plain, node: str, fleet_size: int, config: GuardrailConfig, now: float
) -> tuple[Plain, Admission]:
    """The breaker as its window defines it, written plainly (every quarantine kept while in the
    window, the nodes counted anew each time): what the faster code must answer."""
    tripped_at, recent, held = state
    recent = tuple((n, t) for n, t in recent if t > now - config.breaker_window_s)
    if tripped_at is not None:
        return (tripped_at, recent, held if node in held else (*held, node)), Admission.HOLD
    nodes_in_window = {n for n, _ in recent}
    if node not in nodes_in_window and len(nodes_in_window) >= breaker_limit(fleet_size, config):
        return (now, recent, (node,)), Admission.TRIP
    return (None, (*recent, (node, now)), held), Admission.GO


@given(
    st.lists(st.tuples(st.sampled_from("abcdefghij"), st.floats(-20, 100)), max_size=60),
    st.integers(1, 6),
    st.floats(1, 200),
)
def test_the_breaker_answers_what_its_window_defines_whatever_the_clock_did(
    steps: list[tuple[str, float]], limit: int, window: float
) -> None:
    cfg = GuardrailConfig(breaker_max_nodes=limit, breaker_max_fraction=1.0, breaker_window_s=window)
    fast, plain = BreakerState(), (None, (), ())
    now = 1000.0
    for node, step in steps:  # a negative step: the clock stepped back
        now += step
        fast, said = admit_quarantine(fast, node, 10, cfg, now)
        plain, meant = _admit_by_definition(plain, node, 10, cfg, now)
        assert said is meant and (fast.tripped_at, fast.held) == (plain[0], plain[2])
        assert set(fast.recent) == {n for n, _ in plain[1]}
