"""Others' drains read from the scheduler: each reported once, again only when drained anew, kept
across a restart (the store), and retried where no agent has said hello yet."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.act.actuators import ForeignDrain
from controller.nodes.found import Found, Outcome, Result, Source
from controller.nodes.scheduler_drains import SchedulerDrains, describe, new_drains, still_drained
from controller.store import Store
from vigil_core.signals import SignalKind


def drain(node: str, at: float, reason: str = "NHC: GPU 3 missing", kind: str = "node_problem") -> ForeignDrain:
    return ForeignDrain(node, reason, "root", at, kind, "IDLE+DRAIN")


def test_a_drain_is_new_once_and_again_when_drained_anew() -> None:
    a, b = drain("gpu-01", 100.0), drain("gpu-02", 200.0)
    assert new_drains([a, b], {}) == [a, b]
    assert new_drains([a, b], {"gpu-01": 100.0}) == [b]
    assert new_drains([drain("gpu-01", 150.0)], {"gpu-01": 100.0}) == [drain("gpu-01", 150.0)]  # drained anew
    assert still_drained({"gpu-01": 100.0, "gpu-02": 200.0}, [a]) == {"gpu-01": 100.0}  # gpu-02 was resumed


def test_the_signal_keeps_the_reason_who_and_whose_problem() -> None:
    text = describe(
        ForeignDrain("gpu-01", "[user_problem] job 88 filled /tmp", "alice", 1.0, "user_problem", "MIXED+DRAIN")
    )
    assert (
        text == "drained in Slurm by alice: '[user_problem] job 88 filled /tmp' (user_problem); the node is MIXED+DRAIN"
    )


class Drained:
    def __init__(self, drains: list[ForeignDrain]) -> None:
        self.drains = drains

    def foreign_drains(self) -> list[ForeignDrain]:
        return self.drains


class Engine:
    """The entry point's side of it: what was filed, and which nodes it knows."""

    def __init__(self, known: set[str]) -> None:
        self.known, self.filed = known, list[Found]()

    def found(self, fault: Found) -> Outcome:
        if fault.node not in self.known:
            return Outcome(Result.UNKNOWN_NODE)
        self.filed.append(fault)
        return Outcome(Result.NOT_QUARANTINED, f"{fault.node}-{fault.key}")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(tmp_path / "ctl.db")
    yield opened
    opened.close()


def test_each_drain_is_filed_once_across_a_restart(store: Store) -> None:
    engine = Engine({"gpu-01", "gpu-02"})
    drains = [drain("gpu-01", 100.0), drain("gpu-02", 200.0, "Kill task failed")]
    assert SchedulerDrains(Drained(drains), engine.found, store.records, 30).take(drains) == 2
    (first, second) = engine.filed
    assert (first.node, first.key, first.source, first.kind) == (
        "gpu-01",
        "drain-100",
        Source.SCHEDULER,
        SignalKind.SCHEDULER_DRAIN,
    )
    assert "'Kill task failed'" in second.reason
    again = SchedulerDrains(Drained(drains), engine.found, store.records, 30)
    assert again.take(drains) == 0 and len(engine.filed) == 2  # a new leader reads what was reported
    assert again.take([drain("gpu-02", 300.0, "hands on")]) == 1 and engine.filed[-1].key == "drain-300"


def test_a_drain_on_a_node_without_an_agent_yet_is_filed_once_it_has_one(store: Store) -> None:
    engine = Engine(set())
    drains = [drain("gpu-07", 100.0)]
    reader = SchedulerDrains(Drained(drains), engine.found, store.records, 30)
    assert reader.take(drains) == 0 and reader.waiting == {"gpu-07": 100.0}  # counted while it waits
    engine.known.add("gpu-07")
    assert reader.take(drains) == 1 and reader.take(drains) == 0
    assert reader.waiting == {}


class Unreachable:
    def foreign_drains(self) -> list[ForeignDrain]:
        raise OSError("slurmctld: connection refused")


def test_a_failed_reading_is_said_until_one_works(store: Store) -> None:
    reader = SchedulerDrains(Unreachable(), Engine(set()).found, store.records, 0.01)

    async def watch_a_while() -> None:
        stop = asyncio.Event()
        watching = asyncio.create_task(reader.watch(stop))
        await asyncio.sleep(0.05)
        assert reader.up is False
        reader._source = Drained([])  # slurmctld is back
        await asyncio.sleep(0.05)
        stop.set()
        await watching

    asyncio.run(watch_a_while())
    assert reader.up is True
