"""``vigil agent``: wires the collectors, the spool, the controller link and ``/metrics``."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable

import structlog
from prometheus_client import start_http_server

from agent.backend import GpuBackend
from agent.config import AgentConfig
from agent.gpu_collector import GpuCollector
from agent.kernel_log import FileTail, KernelLogCollector
from agent.link import ControllerLink
from agent.local_checks import LocalChecks
from agent.metrics import AgentMetrics
from agent.simulated import SimulatedBackend
from agent.spool import Spool
from protos.codec import gpu_to_proto
from protos.vigil.v1 import agent_pb2
from vigil import __version__
from vigil.signals import Signal
from vigil.waiting import wait_event

log = structlog.get_logger(__name__)


def make_backend(config: AgentConfig) -> GpuBackend:
    return SimulatedBackend(config.node, config.simulated_gpus)


class Agent:
    def __init__(
        self, config: AgentConfig, backend: GpuBackend | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.config = config
        self.backend = backend or make_backend(config)
        self.spool = Spool(config.spool)
        self.metrics = AgentMetrics(config.node)
        self.gpu_collector = GpuCollector(config.node, self.backend, clock, config.throttle_report_s)
        self.kernel_log = (
            KernelLogCollector(config.node, FileTail(config.kernel_log).read_lines, self.backend.gpus(), clock)
            if config.kernel_log
            else None
        )
        self.link = ControllerLink(
            config.controller,
            self.spool,
            self._hello,
            LocalChecks(config.node, self.backend).run,
            heartbeat_s=config.heartbeat_s,
        )
        self.metrics_port: int | None = None

    def _hello(self) -> agent_pb2.Hello:
        return agent_pb2.Hello(
            node=self.config.node,
            agent_version=__version__,
            gpu_backend=self.backend.name,
            gpus=[gpu_to_proto(g) for g in self.backend.gpus()],
            last_acked_seq=self.spool.acked_seq,
            spool_id=self.spool.spool_id,
        )

    def record(self, signals: list[Signal]) -> None:
        """Spool first, then wake the link: nothing is sent that is not on disk."""
        for s in self.spool.append(signals):
            self.metrics.signals.labels(self.config.node, s.kind.value).inc()
            log.info("signal", node=s.node, seq=s.seq, kind=s.kind.value, code=s.code, gpu=s.gpu.index, source=s.source)
        if signals:
            self.link.notify()

    async def _poll_gpus(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                signals = await asyncio.to_thread(self.gpu_collector.collect)
            except Exception:  # a failing backend must not stop the kernel-log path or the link
                log.exception("gpu_poll_failed", node=self.config.node)
                await wait_event(stop, self.config.gpu_poll_s)
                continue
            self.metrics.poll_seconds.labels(self.config.node).set(time.monotonic() - started)
            self.metrics.observe_readings(self.gpu_collector.readings)
            self.record(signals)
            self.metrics.spooled.labels(self.config.node).set(self.spool.count())
            self.metrics.connected.labels(self.config.node).set(1 if self.link.connected else 0)
            await wait_event(stop, self.config.gpu_poll_s)

    async def _tail_kernel_log(self, stop: asyncio.Event, collector: KernelLogCollector) -> None:
        unparsed = 0
        while not stop.is_set():
            self.record(collector.collect())
            if collector.unparsed_lines > unparsed:
                self.metrics.unparsed.labels(self.config.node).inc(collector.unparsed_lines - unparsed)
                unparsed = collector.unparsed_lines
            await wait_event(stop, self.config.kernel_log_poll_s)

    async def run(self, stop: asyncio.Event) -> None:
        if self.config.metrics_port is not None:
            server, _ = start_http_server(
                self.config.metrics_port, self.config.metrics_address, registry=self.metrics.registry
            )
            self.metrics_port = server.server_port
        log.info(
            "agent_started",
            node=self.config.node,
            backend=self.backend.name,
            gpus=len(self.backend.gpus()),
            controller=self.config.controller,
            metrics_port=self.metrics_port,
            spool_id=self.spool.spool_id,
        )
        tasks = [asyncio.create_task(self._poll_gpus(stop)), asyncio.create_task(self.link.run(stop))]
        if self.kernel_log is not None:
            tasks.append(asyncio.create_task(self._tail_kernel_log(stop, self.kernel_log)))
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            self.spool.close()


def run_agent(config: AgentConfig) -> None:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await Agent(config).run(stop)

    asyncio.run(main())
