"""The agent's /metrics against real Prometheus tools: `promtool check metrics` lints the names,
and a real Prometheus server (Debian's `prometheus` package) scrapes a running agent."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.daemon import Agent
from gpus.simulated import SimulatedBackend
from tests.fakes.gpu_faults import GpuFaults
from tests.helpers import free_port, poll_until, wait_until
from vigil_core.signals import THROTTLE_HW_THERMAL

pytestmark = pytest.mark.e2e
NO_PROMETHEUS = "needs Debian's prometheus package (apt-get install prometheus; .ci/run installs it)"


@asynccontextmanager
async def running_agent(tmp: Path) -> AsyncIterator[Agent]:
    config = AgentConfig(
        plaintext=True,
        node="node-p",
        controller="127.0.0.1:1",  # no controller: /metrics does not depend on one
        gpu_backend="simulated",
        simulated_gpus=8,
        kernel_log_source="none",
        checkpoint_path=tmp,
        spool=tmp / "s.db",
        metrics_port=0,
        metrics_address="127.0.0.1",
        gpu_poll_s=0.1,
        host_poll_s=0.1,
    )
    agent = Agent(config)
    backend = agent.backend
    assert isinstance(backend, SimulatedBackend)
    GpuFaults(backend).throttle(3, THROTTLE_HW_THERMAL)
    GpuFaults(backend).nvlink_errors(1, 4)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await wait_until(lambda: agent.metrics_port is not None and agent.metrics.readings.host is not None)
    try:
        yield agent
    finally:
        stop.set()
        await task


def scrape(port: int) -> str:
    return str(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode())


@pytest.mark.skipif(shutil.which("promtool") is None, reason=NO_PROMETHEUS)
def test_promtool_finds_nothing_to_lint(tmp_path: Path) -> None:
    async def scenario() -> str:
        async with running_agent(tmp_path) as agent:
            assert agent.metrics_port is not None
            return await asyncio.to_thread(scrape, agent.metrics_port)

    body = asyncio.run(scenario())
    for family in ("vigil_gpu_ecc_errors_total", "vigil_gpu_nvlink_errors_total", "vigil_host_memory_available_bytes"):
        assert family in body
    lint = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert lint.stdout.strip() == "" and lint.stderr.strip() == ""


def query(port: int, promql: str) -> list[dict[str, object]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        data = json.load(urllib.request.urlopen(url, timeout=2))
    except OSError:
        return []
    return list(data["data"]["result"]) if data.get("status") == "success" else []


@pytest.mark.skipif(shutil.which("prometheus") is None, reason=NO_PROMETHEUS)
@pytest.mark.timeout(90)
def test_a_real_prometheus_scrapes_the_agent(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running_agent(tmp_path) as agent:
            config = tmp_path / "prometheus.yml"
            config.write_text(
                "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                "scrape_configs:\n"
                f"  - job_name: vigil-agent\n    static_configs: [{{targets: ['127.0.0.1:{agent.metrics_port}']}}]\n"
            )
            port = free_port()
            log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 (outlives this block: the server writes it)
            server = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                up = await asyncio.to_thread(
                    poll_until, lambda: query(port, 'up{job="vigil-agent"} == 1'), 60, "prometheus to scrape the agent"
                )
                assert up
                temps = await asyncio.to_thread(
                    poll_until, lambda: query(port, "vigil_gpu_temperature_celsius"), 30, "GPU temperatures"
                )
                assert sorted(int(r["metric"]["gpu"]) for r in temps) == list(range(8))  # type: ignore[index]
                hot = query(port, 'vigil_gpu_clocks_event_active{reason="hardware thermal"} == 1')
                assert [r["metric"]["gpu"] for r in hot] == ["3"]  # type: ignore[index]
                nvlink = query(port, "sum by (gpu) (vigil_gpu_nvlink_errors_total) > 0")
                assert [r["metric"]["gpu"] for r in nvlink] == ["1"]  # type: ignore[index]
            finally:
                server.terminate()
                server.wait(10)

    asyncio.run(scenario())
