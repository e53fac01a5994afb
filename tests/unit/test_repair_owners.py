"""A waiting repair's reading of who else holds its node: it serves the tick after the one that asked
for it, however late the repairs' ticks run (a loaded controller), never turning stale before it is
used; one reading at a time per node; the API server away is said, not taken for "nobody"."""

from __future__ import annotations

import asyncio
import threading

import pytest

from controller.repairs.owners import BEING_READ, OwnerReadings, fresh
from tests.fakes.clock import ManualClock
from vigil_core.supervise import Tasks


class Owners:
    """The cluster as the actuator reads it: who holds each node; counts the reads; a read can be held."""

    def __init__(self, held: dict[str, str] | None = None, fails: bool = False) -> None:
        self.held = held or {}
        self.fails = fails
        self.reads: list[str] = []
        self.release = threading.Event()
        self.release.set()

    def held_by_others(self, node: str) -> str:
        self.reads.append(node)
        self.release.wait(5.0)
        if self.fails:
            raise ConnectionError("the API server is away")
        return self.held.get(node, "")

    def set_labels(self, node: str, labels: dict[str, str | None]) -> dict[str, str | None]:
        return {}

    def operand_pods(self, node: str) -> list[str]:
        return []


async def settle() -> None:
    """Let the reading's thread and task finish."""
    for _ in range(20):
        await asyncio.sleep(0.01)


def test_a_reading_is_fresh_when_taken_since_the_tick_before() -> None:
    assert fresh(10.0, 10.0) and fresh(12.5, 10.0)
    assert not fresh(9.9, 10.0) and not fresh(None, 10.0)


async def asked_then_told(owners: Owners, late_s: float = 1.0) -> tuple[OwnerReadings, ManualClock, str]:
    """One tick asks who holds node-a; the reading comes back; the next tick, ``late_s`` after the
    first, is told: returns what it was told."""
    clock = ManualClock(1000.0)
    readings = OwnerReadings(owners, Tasks(), clock)
    readings.tick(clock.now)
    assert readings.held_by_others("node-a") == BEING_READ
    await settle()
    clock.now += late_s
    readings.tick(clock.now)
    return readings, clock, readings.held_by_others("node-a")


@pytest.mark.asyncio
async def test_late_ticks_still_use_the_reading_they_asked_for() -> None:
    # The next tick runs 3 s after the last, later than any bound of a few seconds on a reading's
    # age: the reading asked on one tick answers the next, and the repair may start.
    owners = Owners()
    _, _, told = await asked_then_told(owners, late_s=3.0)
    assert told == "" and owners.reads == ["node-a"]


@pytest.mark.asyncio
async def test_a_reading_answers_one_round_only_then_the_cluster_is_read_again() -> None:
    owners = Owners({"node-a": "a person drained it"})
    readings, clock, told = await asked_then_told(owners)
    assert told == "a person drained it"
    clock.now += 1.0
    readings.tick(clock.now)  # the reading was taken before the last tick: read again
    assert readings.held_by_others("node-a") == BEING_READ
    await settle()
    assert owners.reads == ["node-a", "node-a"]


@pytest.mark.asyncio
async def test_a_slow_reading_serves_the_tick_after_it_came_back_and_is_asked_once() -> None:
    clock, owners = ManualClock(1000.0), Owners()
    owners.release.clear()
    readings = OwnerReadings(owners, Tasks(), clock)
    readings.tick(clock.now)
    assert readings.held_by_others("node-a") == BEING_READ
    await settle()
    clock.now += 1.0
    readings.tick(clock.now)
    assert readings.held_by_others("node-a") == BEING_READ  # still being read: not asked twice
    clock.now += 0.5
    owners.release.set()  # it comes back during this tick's wait
    await settle()
    clock.now += 0.5
    readings.tick(clock.now)
    assert readings.held_by_others("node-a") == ""
    assert owners.reads == ["node-a"]


@pytest.mark.asyncio
async def test_a_cluster_that_cannot_be_read_is_said_and_keeps_the_repair_waiting() -> None:
    _, _, told = await asked_then_told(Owners(fails=True))
    assert told.startswith("cannot read the node") and "API server is away" in told
