from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from vigil_core.log_tally import TalliedEvent, Tally, Unsaid


def test_past_the_rate_a_second_is_counted_and_said_once_with_a_few_names() -> None:
    tally = Tally(per_s=3, examples=2)
    seen = [tally.note(10.0 + i * 0.01, f"n{i}") for i in range(10)]
    assert [own for own, _ in seen] == [True] * 3 + [False] * 7
    assert all(left is None for _, left in seen)
    own, left = tally.note(11.0, "n10")  # the next second: its first line, and the last one's remainder
    assert own and left == Unsaid(7, ("n3", "n4"))
    assert tally.take() is None


@given(st.lists(st.floats(min_value=0, max_value=30, allow_nan=False), max_size=300), st.integers(1, 10))
def test_every_occurrence_is_said_alone_or_counted_once_and_alone_at_most_per_s_a_second(
    times: list[float], per_s: int
) -> None:
    tally, alone, counted = Tally(per_s=per_s), [], 0
    for i, now in enumerate(sorted(times)):
        own, left = tally.note(now, f"n{i}")
        alone += [now] if own else []
        counted += left.count if left is not None else 0
    counted += left.count if (left := tally.take()) is not None else 0
    assert len(alone) + counted == len(times)
    # Any span under a second overlaps at most two of the tally's seconds.
    assert all(sum(1 for t in alone if start <= t < start + 1.0) <= 2 * per_s for start in alone)


def test_a_busy_seconds_remainder_is_said_when_the_second_is_over_with_no_line_after_it() -> None:
    lines: list[tuple[str, dict[str, Any]]] = []
    clock = [100.0]

    async def burst() -> None:
        said = TalliedEvent(
            lambda event, **kw: lines.append((event, kw)), "agent_connected", per_s=2, clock=lambda: clock[0]
        )
        for i in range(5):
            said(f"n{i}", gpus=8)
        assert [e for e, _ in lines] == ["agent_connected", "agent_connected"]
        await asyncio.sleep(1.2)  # nothing more comes: the timer says the rest

    asyncio.run(burst())
    assert lines[2] == ("agent_connected_more", {"count": 3, "nodes": ["n2", "n3", "n4"]})
    assert lines[0] == ("agent_connected", {"node": "n0", "gpus": 8})


def test_without_an_event_loop_the_remainder_is_said_at_once() -> None:
    lines: list[str] = []
    said = TalliedEvent(lambda event, **kw: lines.append(f"{event} {kw}"), "agent_disconnected", per_s=1)
    said("a")
    said("b")
    assert lines == ["agent_disconnected {'node': 'a'}", "agent_disconnected_more {'count': 1, 'nodes': ['b']}"]
