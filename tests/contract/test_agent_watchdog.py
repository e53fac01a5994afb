"""A hung collector, end to end on loopback: the agent reports COLLECTOR_HUNG, the controller makes
the node UNKNOWN (not HEALTHY), and both recover when the driver answers again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from agent.config import AgentConfig
from agent.daemon import Agent
from agent.watchdog import GuardedWorker, Watchdog
from controller.vocab.node_state import Health
from gpus.simulated import SimulatedBackend
from tests.fakes.gpu_faults import GpuFaults
from tests.helpers import start_controller, stop_controller, wait_until
from vigil_core.signals import SignalKind


def test_guarded_worker_reports_a_hang_without_starting_another_call() -> None:
    async def scenario() -> None:
        worker = GuardedWorker("probe", deadline_s=0.05)
        calls = []

        def slow() -> int:
            calls.append(1)
            time.sleep(0.3)
            return 7

        assert await worker.call(slow) == (False, None) and worker.hung
        assert await worker.call(slow) == (False, None) and len(calls) == 1  # no pile-up
        await asyncio.sleep(0.35)
        assert await worker.call(lambda: 8) == (True, 7) and not worker.hung  # the late result, not lost
        assert await worker.call(lambda: 8) == (True, 8)

    asyncio.run(scenario())


def test_watchdog_reports_transitions_only() -> None:
    dog = Watchdog("n1", clock=lambda: 10.0)
    first = dog.report("gpu-poll", True, 5.0)
    assert [(s.kind, s.code, s.source) for s in first] == [(SignalKind.COLLECTOR_HUNG, 1, "gpu-poll")]
    assert dog.report("gpu-poll", True, 5.0) == [] and dog.hung == ["gpu-poll"]
    assert [s.code for s in dog.report("gpu-poll", False, 5.0)] == [0]
    assert dog.report("gpu-poll", False, 5.0) == []


def test_a_wedged_gpu_makes_the_node_unknown_until_it_answers(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        config = AgentConfig(
            plaintext=True,
            node="node-w",
            controller=f"127.0.0.1:{controller.port}",
            gpu_backend="simulated",
            simulated_gpus=4,
            kernel_log_source="none",
            spool=tmp_path / "s.db",
            metrics_port=None,
            gpu_poll_s=0.05,
            collector_deadline_s=0.3,
            heartbeat_s=0.1,
        )
        agent = Agent(config)
        backend = agent.backend
        assert isinstance(backend, SimulatedBackend)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))

        def health() -> Health | None:
            entry = controller.engine.fleet.nodes.get("node-w")
            return entry.state.health if entry else None

        await wait_until(lambda: health() is Health.HEALTHY, what="node registered")
        GpuFaults(backend).hang(2)
        await wait_until(lambda: health() is Health.UNKNOWN, timeout=10, what="node UNKNOWN")
        assert agent.metrics.readings.gpus == []  # no stale GPU values on /metrics
        await asyncio.sleep(0.5)  # heartbeats keep coming; the node must stay UNKNOWN
        assert health() is Health.UNKNOWN
        backend.release_hangs()
        await wait_until(lambda: health() is not Health.UNKNOWN, timeout=10, what="node back")
        assert health() is Health.SUSPECT  # a hang was paged once; a person clears it
        # A fault that the stuck call itself comes back with is delivered, not dropped as late.
        GpuFaults(backend).hang(2)
        await wait_until(lambda: health() is Health.UNKNOWN, timeout=10, what="UNKNOWN again")
        GpuFaults(backend).row_remap(3, pending=True)  # GPU 3 is read after the stuck GPU 2
        backend.release_hangs()
        await wait_until(lambda: health() in (Health.UNHEALTHY, Health.QUARANTINED), timeout=10, what="quarantine")
        stop.set()
        await task
        await stop_controller(controller)

    asyncio.run(scenario())
