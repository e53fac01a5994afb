"""The urgent lane's rule, on a clock the test moves: a record waits while any urgent part runs, and
after a burst until none has begun for ``quiet_s``; the record of the last urgent part begun goes at
once; no record waits past ``longest_s``."""

from __future__ import annotations

import asyncio

from controller.nodes.actions.urgent import UrgentLane
from tests.fakes.clock import ManualClock


def test_a_lone_urgent_part_may_record_as_soon_as_it_ends() -> None:
    lane = UrgentLane(quiet_s=1.0, clock=ManualClock(100.0))
    ticket = lane.begin()
    assert not lane.may_record(ticket)
    lane.end()
    assert lane.may_record(ticket)


def test_a_burst_records_once_no_urgent_part_runs_and_none_began_for_the_quiet_time() -> None:
    clock = ManualClock(100.0)
    lane = UrgentLane(quiet_s=1.0, clock=clock)
    first, second = lane.begin(), lane.begin()
    lane.end()
    assert not lane.may_record(first) and not lane.may_record(second)  # one still runs
    clock.now += 0.5
    lane.end()
    assert lane.may_record(second)  # the last begun: nothing follows it
    assert not lane.may_record(first)  # others began after it: the burst may go on
    clock.now += 0.49
    assert not lane.may_record(first)
    clock.now += 0.02
    assert lane.may_record(first)
    third = lane.begin()  # a new urgent part holds every record back again
    assert not lane.may_record(first) and not lane.may_record(third)


def test_no_record_waits_past_the_longest_time() -> None:
    async def scenario() -> None:
        lane = UrgentLane(quiet_s=60.0, longest_s=0.05)
        first = lane.begin()
        lane.begin()  # never ends
        lane.end()
        await asyncio.wait_for(lane.after_urgent(first), 5.0)  # the bound, not the quiet minute

    asyncio.run(scenario())


def test_a_waiting_record_goes_when_the_burst_ends() -> None:
    async def scenario() -> None:
        lane = UrgentLane(quiet_s=0.05, longest_s=60.0)
        first, _ = lane.begin(), lane.begin()
        lane.end()
        waiting = asyncio.ensure_future(lane.after_urgent(first))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # the second urgent part still runs
        lane.end()
        await asyncio.wait_for(waiting, 5.0)  # quiet for 0.05 s, then it goes

    asyncio.run(scenario())
