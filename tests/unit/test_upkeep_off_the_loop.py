"""The upkeep's blocking database work runs off the event loop (``controller.nodes.upkeep``): the
database's size (on PostgreSQL a query), read every ``size_every_s``, a database that cannot say it
keeping the last one without stopping the other gauges; and retention's deletes."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from controller.act.actuators import NullPager
from controller.act.local_actuator import LocalActuator
from controller.compose import node_route
from controller.store import Store
from controller.vocab.policy import Policy


def test_the_database_size_is_read_off_the_loop_and_a_database_away_stops_no_other_gauge(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = Store(tmp_path / "ctl.db")
        e = node_route(store, Policy(), LocalActuator(store.db), NullPager())
        registry = e.metrics.registry
        reads: list[int] = []  # the threads that read the size
        away = False

        def size_bytes() -> int:
            reads.append(threading.get_ident())
            if away:
                raise ConnectionError("the database is away")
            return 12345

        store.db.size_bytes = size_bytes  # type: ignore[method-assign]
        e.upkeep.update_gauges()
        assert reads == []  # the once-a-second gauges never ask the database
        await e.upkeep.refresh_database_size()
        assert reads and reads[0] != threading.get_ident()  # asked in a thread, not on the loop
        assert registry.get_sample_value("vigil_controller_database_bytes") == 12345

        away = True
        await e.upkeep.refresh_database_size()
        e.upkeep.update_gauges()
        assert registry.get_sample_value("vigil_controller_database_bytes") == 12345  # the last one kept
        assert registry.get_sample_value("vigil_controller_connected_agents") == 0  # the others still set
        await e.shutdown()

    asyncio.run(scenario())


def test_retention_runs_in_a_thread_and_its_failures_are_still_counted(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = Store(tmp_path / "ctl.db")
        e = node_route(store, Policy(), LocalActuator(store.db), NullPager())
        ran: list[int] = []

        def retention() -> dict[str, int]:
            ran.append(threading.get_ident())
            if len(ran) == 1:
                raise OSError(28, "No space left on device")
            return {}

        e.upkeep.apply_retention = retention  # type: ignore[method-assign]
        e.tasks.base_s = 0.01  # the failed step's backoff, short for the test
        stop = asyncio.Event()
        watcher = asyncio.create_task(e.upkeep.watch(stop, every_s=0.01, retention_every_s=0.0))
        while len(ran) < 2:
            await asyncio.sleep(0.01)
        stop.set()
        await watcher
        assert threading.get_ident() not in ran  # never on the event loop's thread
        assert e.metrics.task_failures.labels("retention")._value.get() == 1
        await e.shutdown()

    asyncio.run(scenario())
