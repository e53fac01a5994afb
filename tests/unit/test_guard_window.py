"""A guard's window (``controller.nodes.guards.window``, pure): what it holds is what the window's
definition says, whatever the order the clock gave, and its counts are the recount of it."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from controller.nodes.guards.window import GroupWindow, Window

# (key, when, then forget what was seen at or before this cutoff): the clock may step back.
steps = st.lists(st.tuples(st.sampled_from("abcdef"), st.floats(0, 100), st.floats(-50, 100)), max_size=40)


def _defined(seen: list[tuple[str, float]], first: bool) -> dict[str, float]:
    """Each key seen: when it was seen (its latest, or with ``first`` its earliest while it stayed
    in the window)."""
    at: dict[str, float] = {}
    for key, when in seen:
        if key in at and first:
            continue
        at[key] = when if key not in at else max(at[key], when)
    return at


@given(steps, st.booleans())
def test_a_window_holds_what_its_definition_says_oldest_first(
    script: list[tuple[str, float, float]], first: bool
) -> None:
    window: Window[str] = Window()
    kept: list[tuple[str, float]] = []  # what the definition remembers: every sighting still in the window
    for key, when, cutoff in script:
        window = window.after(cutoff).seen(key, when, first)
        kept = [(k, t) for k, t in kept if t > cutoff]
        if not (first and key in dict(kept)):
            kept.append((key, when))
        assert dict(window.at) == _defined(kept, first)
        times = list(window.at.values())
        assert times == sorted(times)  # oldest first, so forgetting reads only what it forgets


@given(
    st.lists(st.tuples(st.sampled_from("xyz"), st.sampled_from("abcd"), st.floats(0, 100)), max_size=40),
    st.floats(0, 100),
    st.booleans(),
)
def test_a_group_windows_counts_are_its_members_counted(
    script: list[tuple[str, str, float]], cutoff: float, first: bool
) -> None:
    grouped = GroupWindow()
    for group, member, when in script:
        grouped = grouped.seen(group, member, when, first)
    for window in (grouped, grouped.after(cutoff), GroupWindow.of(grouped.entries(), first)):
        assert dict(window.counts) == dict(Counter(g for g, _ in window.window))
        assert all(window.count(g) == len(window.members(g)) for g in "xyz")
    assert all(t > cutoff for _, _, t in grouped.after(cutoff).entries())


def test_a_change_leaves_the_window_it_came_from_as_it_was() -> None:
    before: Window[str] = Window().seen("a", 1.0).seen("b", 2.0)
    after = before.seen("a", 3.0).after(1.5)
    assert before.entries() == [("a", 1.0), ("b", 2.0)]  # a guard's state put back after a failed batch
    assert after.entries() == [("b", 2.0), ("a", 3.0)]
    assert before.after(0.5) is before  # nothing forgotten: nothing copied
