"""An event loop's lateness, observed (``vigil_core.loop_lag``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from vigil_core.loop_lag import Lateness, loop_time, watch, within


def test_a_loop_held_busy_is_observed_as_late_by_as_long_and_an_idle_one_is_not() -> None:
    async def observed() -> list[float]:
        lags: list[float] = []
        watching = asyncio.create_task(watch(lags.append, interval_s=0.02))
        await asyncio.sleep(0.2)  # idle: each tick on time, give or take the scheduler
        idle = len(lags)
        time.sleep(0.3)  # the loop held, as by a long garbage collection
        await asyncio.sleep(0.1)
        watching.cancel()
        assert idle >= 3 and sorted(lags[:idle])[idle // 2] < 0.1, lags  # on time, but for the scheduler
        return lags[idle:]

    after = asyncio.run(observed())
    assert max(after) >= 0.25, after  # the tick due during the hold ran about 0.28 s late


def test_a_bound_kept_on_own_time_leaves_out_a_hold_and_one_on_the_loops_clock_does_not() -> None:
    async def outcomes() -> tuple[tuple[float, float], list[str | BaseException]]:
        lateness, loop = Lateness(), asyncio.get_running_loop()
        watching = asyncio.create_task(lateness.watch(interval_s=0.02))
        answers: list[asyncio.Future[str]] = [loop.create_future(), loop.create_future()]
        waits = [
            asyncio.create_task(within(answers[0], 0.2, lateness.own_time)),
            asyncio.create_task(within(answers[1], 0.2, loop_time)),
        ]
        await asyncio.sleep(0.05)  # both waiting
        own, plain = lateness.own_time(), loop.time()
        time.sleep(0.5)  # the loop held past both bounds
        held = (lateness.own_time() - own, loop.time() - plain)
        for answer in answers:  # the peer's answer, a moment after the loop runs again
            loop.call_later(0.05, answer.set_result, "hello")
        results = await asyncio.gather(*waits, return_exceptions=True)
        watching.cancel()
        return held, results

    (own, plain), results = asyncio.run(outcomes())
    assert own < 0.1 and plain >= 0.5, (own, plain)  # own time stood still while the loop was held
    assert results[0] == "hello" and isinstance(results[1], TimeoutError), results


def test_a_bound_on_own_time_still_ends_a_wait_for_what_never_comes() -> None:
    async def waited() -> tuple[float, bool]:
        lateness, loop = Lateness(), asyncio.get_running_loop()
        watching = asyncio.create_task(lateness.watch(interval_s=0.02))
        never: asyncio.Future[str] = loop.create_future()
        started = loop.time()
        with pytest.raises(TimeoutError):
            await within(never, 0.2, lateness.own_time)
        watching.cancel()
        return loop.time() - started, never.cancelled()

    took, cancelled = asyncio.run(waited())
    assert 0.2 <= took < 1.0 and cancelled, (took, cancelled)


def test_late_since_says_how_long_the_loop_was_held_after_a_time_and_a_hold_not_yet_ticked() -> None:
    async def held() -> tuple[float, float, float, float, float]:
        lateness = Lateness()
        watching = asyncio.create_task(lateness.watch(interval_s=0.02))
        await asyncio.sleep(0.1)
        before = time.time()
        time.sleep(0.3)  # held: no tick has run yet to say so
        pending = lateness.late_since(before)
        halfway = before + 0.15
        await asyncio.sleep(0.1)  # the late tick ran
        after = time.time()
        await asyncio.sleep(0.1)
        figures = (pending, lateness.late_since(before), lateness.late_since(halfway), lateness.late_since(after))
        watching.cancel()
        return (*figures, Lateness().late_since(before))

    pending, since_before, since_halfway, since_after, unwatched = asyncio.run(held())
    assert 0.25 <= pending <= 0.35 and 0.25 <= since_before <= 0.4, (pending, since_before)
    assert 0.1 <= since_halfway <= 0.25, since_halfway  # the part of the hold after that time
    assert since_after < 0.05 and unwatched == 0.0, (since_after, unwatched)
