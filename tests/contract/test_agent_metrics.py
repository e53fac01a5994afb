"""The agent's /metrics endpoint, scraped over HTTP."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.config import AgentConfig
from agent.daemon import Agent
from agent.metrics import AgentMetrics
from tests.fakes.gpu_faults import GpuFaults
from tests.fakes.ib_sysfs import IbSysfs
from tests.helpers import start_controller, stop_controller, wait_until
from vigil_core.rank_progress import RankRecord, encode, file_name


def agent_config(tmp_path: Path, controller: str) -> AgentConfig:
    return AgentConfig(
        plaintext=True,
        node="node-m",
        controller=controller,
        spool=tmp_path / "s.db",
        metrics_port=0,
        metrics_address="127.0.0.1",
        gpu_backend="simulated",
        simulated_gpus=8,
        kernel_log_source="none",
        gpu_poll_s=0.05,
    )


async def scrape(agent: Agent) -> str:
    url = f"http://127.0.0.1:{agent.metrics_port}/metrics"
    return await asyncio.to_thread(lambda: urllib.request.urlopen(url).read().decode())


def connected(body: str) -> float:
    families = {f.name: f for f in text_string_to_metric_families(body)}
    [sample] = families["vigil_agent_controller_connected"].samples
    return sample.value


def test_metrics_endpoint_serves_gpu_and_agent_metrics(tmp_path: Path) -> None:
    async def scenario() -> str:
        agent = Agent(agent_config(tmp_path, "127.0.0.1:1"))
        GpuFaults(agent.backend).gpu_lost(7)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        lost = {"node": "node-m", "kind": "GPU_LOST"}

        def polled() -> bool:  # the first poll's readings and signal are in the registry
            counted = agent.metrics.registry.get_sample_value("vigil_agent_signals_total", lost)
            ticks = agent.metrics.registry.get_sample_value(
                "vigil_agent_event_loop_lag_seconds_count", {"node": "node-m"}
            )
            polled = agent.metrics_port is not None and agent.metrics.readings.gpus != [] and counted == 1
            return polled and (ticks or 0) >= 1  # and the loop's lateness watched

        await wait_until(polled, what="the first GPU poll in the metrics")
        body = await scrape(agent)
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
    assert families["vigil_agent_spool_faults_waiting"].samples[0].value == 1  # the lost GPU's, unacknowledged
    lag = {s.name: s.value for s in families["vigil_agent_event_loop_lag_seconds"].samples if not s.labels.get("le")}
    assert lag["vigil_agent_event_loop_lag_seconds_count"] >= 1


def link_samples(body: str) -> dict[tuple[str, str], float]:
    """The link's series, and the faults waiting for it: (name, port label or "") -> value."""
    return {
        (s.name, s.labels.get("port", "")): s.value
        for f in text_string_to_metric_families(body)
        if f.name.startswith(("vigil_agent_controller_", "vigil_agent_spool_faults"))
        for s in f.samples
        if not s.name.endswith("_created")
    }


async def scraped_until(
    agent: Agent, condition: Callable[[dict[tuple[str, str], float]], bool], timeout_s: float = 20.0
) -> dict[tuple[str, str], float]:
    """Scrape the agent until its link's series meet ``condition``; those series."""
    deadline = time.monotonic() + timeout_s
    while not condition(link := link_samples(await scrape(agent))):
        assert time.monotonic() < deadline, f"the agent's series never met the condition: {link}"
        await asyncio.sleep(0.05)
    return link


def test_the_connected_gauge_is_the_links_state_at_the_scrape(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "c.db")
        agent = Agent(agent_config(tmp_path, f"127.0.0.1:{controller.port}"))
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            await wait_until(lambda: agent.metrics_port is not None and agent.link.connected, what="the link up")
            body = await scrape(agent)
            assert connected(body) == 1
            link = link_samples(body)
            assert link[("vigil_agent_controller_sessions_total", "main")] == 1
            assert link[("vigil_agent_controller_sessions_total", "urgent")] == 0
            assert link[("vigil_agent_controller_streams_total", "")] == 1
            assert link[("vigil_agent_controller_failed_sessions", "")] == 0
            assert link[("vigil_agent_spool_faults_waiting", "")] == 0
            await stop_controller(controller)
            await wait_until(lambda: agent.link.attempt >= 2, what="two sessions failed with nothing listening")
            body = await scrape(agent)
            assert connected(body) == 0
            link = link_samples(body)
            assert link[("vigil_agent_controller_failed_sessions", "")] >= 2  # what an alert on the node can see
            assert link[("vigil_agent_controller_sessions_total", "main")] == 1
            GpuFaults(agent.backend).gpu_lost(3)  # a fault while nothing listens: it waits, and says so
            await scraped_until(agent, lambda link: link[("vigil_agent_spool_faults_waiting", "")] == 1)
            controller = await start_controller(tmp_path / "c.db", port=controller.port)
            back = await scraped_until(agent, lambda link: link[("vigil_agent_spool_faults_waiting", "")] == 0)
            assert back[("vigil_agent_controller_failed_sessions", "")] == 0
            assert back[("vigil_agent_controller_sessions_total", "main")] == 2
            await stop_controller(controller)
        finally:
            stop.set()
            await task

    asyncio.run(scenario())


def test_the_links_counts_are_exported_as_they_are_at_the_scrape() -> None:
    """Sessions split by the port they began on, and each count under its own series."""
    link = SimpleNamespace(
        streams=9, connections=5, urgent_sessions=2, resumed=3, unanswered=4, attempt=6, left_for_urgent=1
    )
    metrics = AgentMetrics("node-m")
    metrics.link_known(link)
    link.connections += 1  # read at the scrape, not when registered
    assert link_samples(generate_latest(metrics.registry).decode()) == {
        ("vigil_agent_controller_streams_total", ""): 9,
        ("vigil_agent_controller_sessions_total", "main"): 4,
        ("vigil_agent_controller_sessions_total", "urgent"): 2,
        ("vigil_agent_controller_sessions_resumed_total", ""): 3,
        ("vigil_agent_controller_left_for_urgent_total", ""): 1,
        ("vigil_agent_controller_failed_sessions", ""): 6,
        ("vigil_agent_controller_hellos_unanswered", ""): 4,
    }


def test_xids_are_counted_per_gpu_and_code_and_every_gpu_has_a_last_xid_series_from_the_start(
    tmp_path: Path,
) -> None:
    """A Prometheus-only shop alerts per GPU and per code: the first XID of a GPU shows as a change
    of its last-XID timestamp (a series present, at 0, before any XID)."""

    async def scenario() -> tuple[str, str]:
        agent = Agent(agent_config(tmp_path, "127.0.0.1:1"))
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        await wait_until(lambda: agent.metrics_port is not None, what="/metrics served")
        before = await scrape(agent)
        faults = GpuFaults(agent.backend)
        faults.xid(3, 79, "GPU has fallen off the bus.")
        faults.xid(5, 13)
        faults.xid(5, 13)

        def counted() -> bool:
            value = agent.metrics.registry.get_sample_value(
                "vigil_gpu_xid_errors_total",
                {"node": "node-m", "gpu": "5", "uuid": agent.backend.gpus()[5].uuid, "code": "13"},
            )
            return value == 2

        await wait_until(counted, what="both XID 13 counted")
        after = await scrape(agent)
        stop.set()
        await task
        return before, after

    before, after = asyncio.run(scenario())
    first = {f.name: f for f in text_string_to_metric_families(before)}
    assert sorted(int(s.labels["gpu"]) for s in first["vigil_gpu_last_xid_timestamp_seconds"].samples) == list(range(8))
    assert all(s.value == 0 for s in first["vigil_gpu_last_xid_code"].samples)
    assert "vigil_gpu_xid_errors" not in first or not first["vigil_gpu_xid_errors"].samples
    families = {f.name: f for f in text_string_to_metric_families(after)}
    errors = {
        (s.labels["gpu"], s.labels["code"]): s.value
        for s in families["vigil_gpu_xid_errors"].samples
        if s.name.endswith("_total")
    }
    assert errors == {("3", "79"): 1, ("5", "13"): 2}
    last = {s.labels["gpu"]: s.value for s in families["vigil_gpu_last_xid_code"].samples}
    assert (last["3"], last["5"], last["0"]) == (79, 13, 0)
    stamped = {s.labels["gpu"]: s.value for s in families["vigil_gpu_last_xid_timestamp_seconds"].samples}
    assert stamped["3"] > 0 and stamped["0"] == 0


def test_infiniband_ports_are_watched_by_the_running_agent_and_shown_in_its_metrics(tmp_path: Path) -> None:
    """The real collector on a fixture sysfs tree: a port down past the transport timeout is one
    IB_PORT_DOWN signal, and every port's state, rate, down time and counters are in /metrics."""
    ib = IbSysfs(tmp_path / "sys")
    # mlx5_0 sits on GPU 0's PCIe switch; mlx5_1 on a switch of its own (it serves no GPU in particular).
    switch = ("0000:15:01.0", "0000:16:00.0")
    ib.add_port("mlx5_0", 1, "0000:19:00.0", bridges=(*switch, "0000:17:10.0"))
    ib.add_gpu("0000:18:00.0", (*switch, "0000:17:08.0"))
    ib.add_gpu("0000:2a:00.0", ("0000:27:01.0", "0000:28:00.0", "0000:29:08.0"))
    ib.add_port("mlx5_1", 1, "0000:3d:00.0", link_layer="Ethernet", rate="200 Gb/sec (4X HDR)")
    config = agent_config(tmp_path, "127.0.0.1:1").model_copy(
        update={"ib_sysfs_root": ib.root, "ib_poll_s": 0.05, "ib_transport_timeout_s": 0.3}
    )

    async def scenario() -> str:
        agent = Agent(config)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        await wait_until(lambda: agent.metrics.readings.ib, what="the first InfiniBand poll")
        ib.set_up("mlx5_1", 1, False)
        down = {"node": "node-m", "kind": "IB_PORT_DOWN"}
        await wait_until(
            lambda: agent.metrics.registry.get_sample_value("vigil_agent_signals_total", down) == 1,
            what="the port down past the transport timeout",
        )
        body = await scrape(agent)
        stop.set()
        await task
        return body

    families = {f.name: f for f in text_string_to_metric_families(asyncio.run(scenario()))}
    up = {s.labels["hca"]: s.value for s in families["vigil_ib_port_up"].samples}
    assert up == {"mlx5_0": 1.0, "mlx5_1": 0.0}
    serves = {s.labels["hca"]: s.labels["gpu"] for s in families["vigil_ib_port_up"].samples}
    assert serves == {"mlx5_0": "0", "mlx5_1": ""}  # from the PCIe tree
    rate = {s.labels["hca"]: s.value for s in families["vigil_ib_port_rate_gbps"].samples}
    assert rate == {"mlx5_0": 400.0, "mlx5_1": 200.0}
    down_s = {s.labels["hca"]: s.value for s in families["vigil_ib_port_down_seconds"].samples}
    assert down_s["mlx5_0"] == 0 and down_s["mlx5_1"] >= 0.3
    roce = {s.labels["counter"] for s in families["vigil_ib_port_counter"].samples if s.labels["hca"] == "mlx5_1"}
    assert {"out_of_sequence", "symbol_error"} <= roce


def test_the_agent_tells_the_controller_what_it_could_not_parse_and_which_jobs_run_here(tmp_path: Path) -> None:
    """A sample of unparsed driver lines reaches the controller (a metric and a log line, so the fleet
    sees what it misses), and so do the job ids of the node's processes (a fake /proc)."""
    kmsg = tmp_path / "k.kmsg"
    kmsg.write_text("")
    proc = tmp_path / "proc"
    environs = {
        "101": b"PATH=/bin\0VIGIL_JOB_ID=llm-7\0VIGIL_NODE=node-m\0",
        "102": b"VIGIL_JOB_ID=elsewhere\0VIGIL_NODE=node-z\0",
        "103": b"HOME=/root\0",
    }
    for pid, environ in environs.items():
        (proc / pid).mkdir(parents=True)
        (proc / pid / "environ").write_bytes(environ)
    progress = tmp_path / "progress"  # the ranks' progress records, as their hooks write them
    progress.mkdir()
    mine = RankRecord("llm-7", 3, "node-m", 120, "exchange", round(time.time(), 3))  # as written: ms
    (progress / file_name("llm-7", 3)).write_bytes(encode(mine))
    (progress / file_name("llm-7", 4)).write_bytes(encode(RankRecord("llm-7", 4, "node-z", 1, "compute", time.time())))

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "c.db")
        config = agent_config(tmp_path, f"127.0.0.1:{controller.port}").model_copy(
            update={
                "kernel_log_source": "file",
                "kernel_log": kmsg,
                "heartbeat_s": 0.2,
                "proc_root": proc,
                "jobs_scan_s": 0.1,
                "progress_dir": progress,
            }  # fmt: skip
        )
        agent = Agent(config)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            await wait_until(lambda: agent.link.connected, what="the link up")
            with open(kmsg, "a") as f:
                f.write("3,1,1,-;NVRM: Xid (PCI:0000:3b:00): seventy-nine, some driver we do not know\n")
            gauge = controller.engine.metrics.agent_unparsed_lines.labels("node-m")
            await wait_until(lambda: gauge._value.get() == 1, what="the controller counting the unparsed line")
            await wait_until(lambda: controller.engine.fleet.runs_job("node-m", "llm-7"), what="the job seen")
            assert not controller.engine.fleet.runs_job("node-m", "elsewhere")  # another node's rank
            await wait_until(lambda: bool(controller.engine.fleet.ranks("node-m")), what="the ranks' progress")
            assert controller.engine.fleet.ranks("node-m") == (mine,)  # not the record naming node-z
            unreadable = agent.metrics.rank_records.labels("node-m", "unreadable")._value.get()
            assert (agent.metrics.rank_records.labels("node-m", "read")._value.get(), unreadable) == (1, 1)
        finally:
            stop.set()
            await task
            await stop_controller(controller)

    asyncio.run(scenario())
