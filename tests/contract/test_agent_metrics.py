"""The agent's /metrics endpoint, scraped over HTTP."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from agent.config import AgentConfig
from agent.daemon import Agent
from tests.helpers import wait_until


def test_metrics_endpoint_serves_gpu_and_agent_metrics(tmp_path: Path) -> None:
    async def scenario() -> str:
        config = AgentConfig(
            plaintext=True,
            node="node-m",
            controller="127.0.0.1:1",
            spool=tmp_path / "s.db",
            metrics_port=0,
            metrics_address="127.0.0.1",
            gpu_backend="simulated",
            simulated_gpus=8,
            kernel_log_source="none",
            gpu_poll_s=0.05,
        )
        agent = Agent(config)
        agent.backend.inject_gpu_lost(7)  # type: ignore[attr-defined]
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        await wait_until(lambda: agent.metrics_port is not None and agent.gpu_collector.readings != [])
        body = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics").read().decode()
        )
        stop.set()
        await task
        return body

    families = {f.name: f for f in text_string_to_metric_families(asyncio.run(scenario()))}
    temps = families["vigil_gpu_temperature_celsius"].samples
    assert sorted(int(s.labels["gpu"]) for s in temps) == list(range(7))  # the lost GPU has no reading
    lost = {s.labels["gpu"]: s.value for s in families["vigil_gpu_lost"].samples}
    assert lost["7"] == 1 and lost["0"] == 0
    assert any(s.labels["kind"] == "GPU_LOST" for s in families["vigil_agent_signals"].samples)
    assert families["vigil_agent_controller_connected"].samples[0].value == 0  # nothing listens on port 1
