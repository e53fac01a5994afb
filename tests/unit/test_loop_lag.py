"""An event loop's lateness, observed (``vigil_core.loop_lag``)."""

from __future__ import annotations

import asyncio
import time

from vigil_core.loop_lag import watch


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
