"""What lets one controller serve 100,000 nodes, held to its contract on both store backends:
commits made durable in groups off the event loop, a Hello that writes only what changed, silence
looked at by deadline, and the once-a-second work reading only the nodes it concerns."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from controller.act.actuators import NullPager
from controller.act.local_actuator import LocalActuator
from controller.compose import NodeRoute, node_route
from controller.nodes.guards.rules import GuardrailConfig
from controller.nodes.upkeep import SILENCE_BATCH
from controller.store import Store
from controller.vocab.node_state import Health
from controller.vocab.policy import Policy
from tests.helpers import wait_until
from vigil_core.signals import GpuRef, Signal, SignalKind


def route(store: Store, now: list[float]) -> NodeRoute:
    guard = GuardrailConfig(shared={"enabled": False}, breaker_max_fraction=1.0)  # type: ignore[arg-type]
    return node_route(store, Policy(), LocalActuator(store.db), NullPager(), clock=lambda: now[0], guardrails=guard)


def xid(node: str, code: int, at: float, seq: int) -> Signal:
    return Signal(node, SignalKind.XID, GpuRef(0, "GPU-0", "0000:18:00"), code, observed_at=at, seq=seq)


def test_many_commits_are_made_durable_by_one_flush(store_target: Path | str) -> None:
    async def scenario() -> None:
        store = Store(store_target)
        e = route(store, [1000.0])
        for i in range(20):
            e.engine.hello(f"n{i}", f"spool-{i}", 8)
            e.engine.receive(f"n{i}", [xid(f"n{i}", 63, 1000.0, 1)])  # recorded only
        flushes = store.group.flushes
        await asyncio.gather(*(e.engine.durable() for _ in range(20)))  # twenty acks waiting at once
        assert store.group.flushes - flushes <= 2  # the group: not one flush each
        assert store.db.lazy_commits >= 40
        assert len(store.incidents.list(limit=100)) == 20
        store.close()
        again = Store(store_target)  # committed, durable, read back by the next controller
        assert len(again.incidents.list(limit=100)) == 20
        again.close()

    asyncio.run(scenario())


def test_what_is_written_while_a_flush_runs_is_flushed_after_it_without_anyone_waiting(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = Store(tmp_path / "ctl.db")
        sync = store.db.inner.inner.sync  # type: ignore[attr-defined]

        def slow_sync() -> None:
            time.sleep(0.2)
            sync()

        store.db.inner.inner.sync = slow_sync  # type: ignore[attr-defined]
        store.records.set_metas({"a": "1"}, durable=False)
        store.group.soon()
        await asyncio.sleep(0.05)  # the first flush is under way
        store.records.set_metas({"b": "2"}, durable=False)  # the guard's windows, say: nobody awaits them
        store.group.soon()
        await wait_until(lambda: store.group.pending == 0, timeout=5, what="the second write flushed")
        assert store.group.flushes == 2
        store.close()

    asyncio.run(scenario())


def test_a_flush_that_fails_reaches_whoever_waits_for_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = Store(tmp_path / "ctl.db")
        e = route(store, [1000.0])
        e.engine.hello("n1", "spool-1", 8)

        def broken() -> None:
            raise sqlite3.OperationalError("disk I/O error")

        store.db.inner.inner.sync = broken  # type: ignore[attr-defined,method-assign]
        e.engine.receive("n1", [xid("n1", 63, 1000.0, 1)])
        with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
            await e.engine.durable()  # the gateway answers UNAVAILABLE: the agent keeps its spool
        assert store.health.problem  # and the store's health says so
        store.close()

    asyncio.run(scenario())


def hold_flushes(store: Store) -> threading.Event:
    """From now on the store's flush waits (in its own thread) until the event returned is set: the
    disk as slow as a whole fleet's writes make it."""
    sync, gate = store.db.inner.inner.sync, threading.Event()  # type: ignore[attr-defined]

    def held_sync() -> None:
        gate.wait(10)
        sync()

    store.db.inner.inner.sync = held_sync  # type: ignore[attr-defined]
    return gate


def test_a_hello_s_answer_waits_for_its_own_node_s_batches_on_disk_and_for_no_other_node_s_writes(
    store_target: Path | str,
) -> None:
    async def scenario() -> None:
        store = Store(store_target)
        e = route(store, [1000.0])
        gate = hold_flushes(store)
        e.engine.hello("faulty", "spool-f", 8)
        e.engine.receive("faulty", [xid("faulty", 63, 1000.0, 1)])  # recorded, not on disk yet
        assert e.engine.hello("faulty", "spool-f", 8) == 1  # its agent, back, may drop seq 1 ...
        waits = asyncio.ensure_future(e.engine.hello_durable("faulty"))  # ... once it is on disk
        for i in range(50):
            e.engine.hello(f"n{i}", f"spool-{i}", 8)  # a fleet saying Hello, written behind
        await asyncio.wait_for(e.engine.hello_durable("n7"), 2)  # a fresh node: nothing of its to wait for
        await asyncio.sleep(0.1)
        assert not waits.done()
        gate.set()
        await asyncio.wait_for(waits, 5)
        gate.clear()
        for i in range(50, 100):
            e.engine.hello(f"n{i}", f"spool-{i}", 8)
        assert e.engine.hello("faulty", "spool-f", 8) == 1  # again: its batch is on disk, the fleet's not
        await asyncio.wait_for(e.engine.hello_durable("faulty"), 2)
        assert store.group.pending > 0
        gate.set()
        await e.engine.durable()
        store.close()

    asyncio.run(scenario())


def test_a_reconnecting_agent_writes_nothing_unless_something_changed(store_target: Path | str) -> None:
    async def scenario() -> None:
        store = Store(store_target)
        e = route(store, [1000.0])
        e.engine.hello("n1", "spool-1", 8)
        written = store.db.lazy_commits
        e.engine.disconnected("n1")
        e.engine.hello("n1", "spool-1", 8)  # a controller restart: 100,000 of these at once
        assert store.db.lazy_commits == written
        e.engine.hello("n1", "spool-2", 8)  # a new spool is news
        assert store.db.lazy_commits == written + 1
        e.engine.hello("n1", "spool-2", 6)  # so are two GPUs less (a fault, decided and recorded too)
        assert store.db.lazy_commits > written + 1
        await e.wait_for_actions()
        store.close()

    asyncio.run(scenario())


def test_silence_is_looked_at_by_deadline_not_by_scanning_the_fleet(tmp_path: Path) -> None:
    now = [1000.0]
    store = Store(tmp_path / "ctl.db")
    e = route(store, now)
    timeout = Policy().heartbeat_timeout_s
    for node in ("quiet", "gone", "steady"):
        e.engine.hello(node, f"spool-{node}", 8, idle_heartbeat_s=0.0 if node == "steady" else 60.0)
        e.engine.connected(node)  # its stream open, as the gateway says once the Hello is written
    e.upkeep.check_silence()
    now[0] += 10
    e.engine.disconnected("gone")
    now[0] += timeout + 1  # past the timeout: the closed stream's node is silent, the quiet one is not
    assert sorted(e.upkeep.check_silence()) == ["gone", "steady"]
    health = {n: e.fleet.nodes[n].state.health for n in ("quiet", "gone", "steady")}
    assert health == {"quiet": Health.HEALTHY, "gone": Health.UNKNOWN, "steady": Health.UNKNOWN}
    now[0] += 180  # three idle heartbeats with nothing heard: an agent stuck with its connection up
    assert e.upkeep.check_silence() == ["quiet"]
    e.engine.hello("quiet", "spool-quiet", 8, idle_heartbeat_s=60.0)
    assert e.fleet.nodes["quiet"].state.health is Health.HEALTHY
    assert e.fleet.count(Health.UNKNOWN) == 2 and e.fleet.in_health(Health.HEALTHY) == ["quiet"]
    assert len(e.fleet.due(now[0] + 1e6)) <= 3  # about one deadline per node, whatever happened
    store.close()


def test_a_whole_fleet_due_at_once_is_looked_at_a_batch_at_a_time_with_the_loop_free_between(tmp_path: Path) -> None:
    """A new leader's fleet is due all at once (each node it loaded is looked at): the event loop runs
    between batches of ``SILENCE_BATCH``, so the returning agents' Hellos wait behind no whole pass."""

    async def scenario() -> None:
        now = [1000.0]
        store = Store(tmp_path / "ctl.db")
        e = route(store, now)
        nodes = [f"n{i}" for i in range(2 * SILENCE_BATCH + 500)]
        for node in nodes:
            e.engine.hello(node, f"spool-{node}", 8)
            e.engine.disconnected(node)
        now[0] += Policy().heartbeat_timeout_s + 1  # every node silent at once
        assert len(e.upkeep.check_silence()) == SILENCE_BATCH and e.fleet.has_due(now[0])
        seen, stop = [], asyncio.Event()

        async def beside() -> None:  # another task on the loop: what it sees between its turns
            while not stop.is_set():
                seen.append(e.fleet.count(Health.UNKNOWN))
                if seen[-1] == len(nodes):
                    stop.set()
                await asyncio.sleep(0)

        await asyncio.wait_for(asyncio.gather(e.upkeep.watch(stop, every_s=60.0), beside()), 30)
        assert {2 * SILENCE_BATCH, len(nodes)} <= set(seen)  # the last batch came after a turn of the loop
        store.close()

    asyncio.run(scenario())
