"""``vigil agent``: wires the collectors, the watchdog, the spool, the controller link and ``/metrics``.

Every collector (``agent.collectors``: one interface, poll → signals and cursors, show → metrics)
runs in its own asyncio task, driven alike. Blocking ones (the GPU poll, the dcgm-exporter scrape,
host statistics) run in a worker thread under the watchdog; the kernel log and the NVML event queue
are non-blocking and are read on the event loop every ``kernel_log_poll_s``, since they are the
fast path from a fault to the controller. Everything a collector reports goes
through ``record``: XIDs reported by a second source are dropped, repeats of one fault are folded
into a count (``agent.storm``), signals that could not go on the wire are refused alone, then the
signals and the collectors' cursors are committed to the spool in one transaction, then the link
is woken. Nothing a collector reads can stop the agent: every step is guarded, and a spool write
that fails is kept and tried again at the next step.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial

import grpc
import psutil
import structlog

from agent.collectors import Collector, DcgmScrape, GpuPoll, HostPoll, IbPoll, KernelLog, NvmlEvents, Poll
from agent.config import AgentConfig
from agent.dcgm import DcgmCollector
from agent.gpu_collector import GpuCollector
from agent.host import HostCollector
from agent.infiniband import PortWatch
from agent.job_processes import jobs_on_node
from agent.kernel_log import FileTail, JournaldSource, KernelLogCollector, KmsgSource, LineSource
from agent.link import ControllerLink
from agent.local_checks import LocalChecks
from agent.metrics import AgentMetrics
from agent.rank_progress import read_progress, to_proto
from agent.remedies import Remedies
from agent.spool import Spool, SpoolError
from agent.storm import StormFolder
from agent.watchdog import GuardedWorker, Watchdog
from agent.xid_fold import XidFolder
from gpus.backend import GpuBackend
from protos.codec import gpu_to_proto, signal_problem
from protos.vigil.v1 import agent_pb2
from vigil_core import __version__, thread_names
from vigil_core.cert_reload import CertificateSource
from vigil_core.http_status import serve_http
from vigil_core.loop_lag import Lateness, stuck
from vigil_core.rank_progress import RankRecord
from vigil_core.signals import Signal, SignalKind
from vigil_core.supervise import Tasks, supervise
from vigil_core.tls import aio_channel
from vigil_core.waiting import wait_event

log = structlog.get_logger(__name__)


class AgentStartError(Exception):
    """The agent cannot start; the text names what failed and what to do about it."""


def make_backend(config: AgentConfig) -> GpuBackend:
    if config.gpu_backend == "simulated":
        from gpus.simulated import SimulatedBackend

        return SimulatedBackend(config.node, config.simulated_gpus, fault_file=config.simulated_faults)
    from gpus.nvml_backend import NvmlBackend

    return NvmlBackend()


def open_kernel_log(config: AgentConfig, spool: Spool) -> tuple[str, LineSource] | None:
    """The configured kernel-log source, resumed from its cursor in the spool."""
    source = config.kernel_log_source
    if source == "auto":
        if config.kernel_log is not None:
            source = "file"
        elif os.access(config.kmsg_path, os.R_OK):
            source = "kmsg"
        elif shutil.which(config.journalctl):
            source = "journald"
        else:
            log.warning("kernel_log_unavailable", node=config.node, reason="no readable /dev/kmsg and no journalctl")
            return None
    if source == "none":
        return None
    cursor = spool.cursor(f"kernel-log:{source}")
    if source == "file":
        assert config.kernel_log is not None  # the config validator requires it
        return source, FileTail(config.kernel_log, cursor)
    if source == "journald":
        return source, JournaldSource(cursor, config.journalctl)
    try:
        return source, KmsgSource(config.kmsg_path, cursor)
    except OSError as exc:
        raise AgentStartError(
            f"cannot read the kernel log {config.kmsg_path}: {exc.strerror} (run the agent with read access to it, "
            "or set kernel_log_source to journald or none)"
        ) from None


def _channel(target: str, tls: CertificateSource | None) -> grpc.aio.Channel:
    return aio_channel(target, tls.latest() if tls is not None else None)


class Agent:
    def __init__(
        self, config: AgentConfig, backend: GpuBackend | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.config = config
        self.clock = clock
        try:
            self.spool = Spool(config.spool, config.spool_max_signals, config.node)
        except SpoolError as exc:
            raise AgentStartError(f"{exc} (set spool to a writable path)") from None
        self.backend = backend or make_backend(config)
        self.metrics = AgentMetrics(config.node)
        self.metrics.gpus_known(self.backend.gpus())
        self.tasks = Tasks(lambda task: self.metrics.task_failures.labels(config.node, task).inc(), node=config.node)
        self.watchdog = Watchdog(config.node, clock)
        self.folder = XidFolder(config.xid_fold_window_s)
        self.storm = StormFolder(config.storm_fold_s)
        if saved_storm := self.spool.cursor("storm"):
            self.storm.restore(json.loads(saved_storm))
        # What record could not write yet (the spool failed): written first at the next step.
        self._unsaved: list[Signal] = []
        self._unsaved_cursors: dict[str, str] = {}
        self._unsaved_lost: Counter[str] = Counter()  # dropped from memory meanwhile: counted in the spool later
        node = config.node
        gpu = GpuCollector(node, self.backend, clock, config.throttle_report_s)
        host = HostCollector(node, clock, config.checkpoint_path, config.memory_available_min, config.disk_used_max)
        self.collectors: list[Collector] = [
            GpuPoll(gpu, config.gpu_poll_s, self.spool.cursor("gpu")),
            HostPoll(host, config.host_poll_s),
            IbPoll(
                PortWatch(node, config.ib_transport_timeout_s, config.ib_error_rates),
                config.ib_sysfs_root,
                config.ib_poll_s,
                clock,
            ),
            NvmlEvents(node, self.backend, self.watchdog, config.collector_deadline_s, config.kernel_log_poll_s),
        ]
        if url := config.dcgm_exporter_url:
            self.collectors.append(DcgmScrape(DcgmCollector(node, url, clock), config.dcgm_poll_s))
        opened = open_kernel_log(config, self.spool)
        self.kernel_source = opened[1] if opened else None
        self.kernel_log = opened[0] if opened else "none"
        self.kernel_lines: KernelLogCollector | None = None
        if opened is not None:
            lines = KernelLogCollector(node, opened[1].read_lines, self.backend.gpus(), clock, opened[0])
            self.kernel_lines = lines
            key = f"kernel-log:{opened[0]}"
            collector = KernelLog(node, opened[1], lines, config.kernel_log_poll_s, key, self.spool.cursor(key))
            self.collectors.append(collector)
        self.jobs_seen: list[str] = []  # the training jobs this node's processes run (job_processes)
        # When the node booted, said in every Hello (a reboot is done once the node says it from a new
        # boot); a simulated node boots with its agent.
        self.booted_at = clock() if self.backend.name == "simulated" else psutil.boot_time()
        self.ranks_seen: list[RankRecord] = []  # their ranks' progress records (rank_progress)
        # Re-read on every (re)connection: a renewed certificate is taken up without a restart.
        tls = CertificateSource(config.tls_dir, token_file=config.token_file) if config.tls_dir else None
        if tls is not None:
            self.metrics.certificate_expiry.labels(config.node).set_function(tls.expires_at)
        self.lateness = Lateness(clock)  # the agent's own event loop's: not the controller's doing
        self.link = ControllerLink(
            config.controller,
            self.spool,
            self._hello,
            LocalChecks(config.node, self.backend).run,
            heartbeat_s=config.heartbeat_s,
            idle_heartbeat_s=config.idle_heartbeat_s,
            urgent_target=config.urgent_controller,
            channel_factory=partial(_channel, tls=tls),
            fill_heartbeat=self._fill_heartbeat,
            run_remedy=Remedies(
                config.node,
                config.remedies,
                lambda: [g.pci_bus_id for g in self.backend.gpus()],
                config.kernel_log if config.kernel_log_source in ("auto", "file") else None,
            ).run,
            clock=self.lateness.own_time,
        )
        # Exported from the start (a scrape before the first collector step sees them too), and the
        # link's state as it is at the scrape.
        self.metrics.connected.labels(config.node).set_function(lambda: 1 if self.link.connected else 0)
        self.metrics.link_known(self.link)
        self._show_spool()
        self.metrics_port: int | None = None
        if self.spool.damage:  # said aloud: logged by the spool, counted here, paged by the controller
            self.metrics.spool_damaged.labels(config.node).inc()
            lost = Signal(config.node, SignalKind.SPOOL_LOST, message=self.spool.damage[:1000], source="spool")
            self.record([replace(lost, observed_at=clock())])

    def problems(self) -> list[str]:
        """Why this agent is not ready (the readiness probe's 503): a loop down, signals it cannot spool."""
        found = [f"task {name} failing: {error}" for name, error in self.tasks.down().items()]
        if self._unsaved:
            found.append(f"{len(self._unsaved)} signal(s) wait in memory: spool {self.config.spool} takes no writes")
        return found

    def _fill_heartbeat(self, beat: agent_pb2.Heartbeat) -> None:
        beat.jobs.extend(self.jobs_seen)
        beat.ranks.extend(to_proto(r) for r in self.ranks_seen)
        if self.kernel_lines is not None:
            samples = self.kernel_lines.take_samples()
            beat.unparsed_lines.extend(samples)
            beat.unparsed_total = self.kernel_lines.unparsed_lines
            self.metrics.unparsed_samples_sent.labels(self.config.node).inc(len(samples))

    async def _scan_jobs(self, stop: asyncio.Event) -> None:
        """Which jobs this node's processes run, every ``jobs_scan_s``, off the event loop."""
        while not stop.is_set():
            self.jobs_seen = await asyncio.to_thread(jobs_on_node, self.config.node, self.config.proc_root)
            await wait_event(stop, self.config.jobs_scan_s)

    async def _scan_progress(self, stop: asyncio.Event) -> None:
        """The ranks' progress records, every ``heartbeat_s``, off the event loop."""
        where, node, unreadable = self.config.progress_dir, self.config.node, 0
        while where is not None and not stop.is_set():
            read = await asyncio.to_thread(read_progress, where, node)
            self.ranks_seen = read.records
            self.metrics.rank_records.labels(node, "read").set(len(read.records))
            self.metrics.rank_records.labels(node, "unreadable").set(len(read.unreadable))
            if len(read.unreadable) > unreadable:  # said when it grows, not every read
                log.warning("rank_progress_unreadable", dir=str(where), files=read.unreadable[:10])
            unreadable = len(read.unreadable)
            await wait_event(stop, self.config.heartbeat_s)

    def _hello(self) -> agent_pb2.Hello:
        return agent_pb2.Hello(
            node=self.config.node,
            agent_version=__version__,
            gpu_backend=self.backend.name,
            gpus=[gpu_to_proto(g) for g in self.backend.gpus()],
            last_acked_seq=self.spool.acked_seq,
            spool_id=self.spool.spool_id,
            address=self.config.advertise_address,
            idle_heartbeat_s=self.config.idle_heartbeat_s,
            jobs=self.jobs_seen,
            booted_at=self.booted_at,
        )

    def record(self, signals: list[Signal], cursors: Mapping[str, str] | None = None) -> None:
        """Fold, then spool with the cursors, then wake the link: nothing is sent that is not on disk.
        Never raises: what the spool could not take now is kept and written at the next call."""
        node = self.config.node
        try:
            kept = [s for s in signals if self.folder.keep(s)]
            if len(kept) < len(signals):
                self.metrics.xid_folded.labels(node).inc(len(signals) - len(kept))
            folded_before = self.storm.folded
            for s in self.storm.fold(kept) + self.storm.due(self.clock()):
                if problem := signal_problem(s):
                    self.metrics.refused.labels(node, s.kind.value).inc()
                    log.error("signal_refused", node=node, kind=s.kind.value, problem=problem, message=s.message[:200])
                else:
                    self._unsaved.append(s)
            self.metrics.storm_folded.labels(node).inc(self.storm.folded - folded_before)
            self._unsaved_cursors.update(cursors or {})
            if self.storm.dirty:
                self._unsaved_cursors["storm"] = json.dumps(self.storm.snapshot())
            self._spool_unsaved()
        except Exception as exc:  # a full disk, a damaged spool: keep what we have, try again next step
            self.metrics.collector_errors.labels(node, "spool").inc()
            log.error("spool_write_failed", node=node, error=repr(exc), unsaved=len(self._unsaved))
            self._bound_unsaved()

    def _spool_unsaved(self) -> None:
        if not self._unsaved and not self._unsaved_cursors and not self._unsaved_lost:
            return
        dropped_before = self.spool.dropped + self._unsaved_lost  # those are exported already
        numbered = self.spool.append(self._unsaved, self._unsaved_cursors, self._unsaved_lost)
        self._unsaved, self._unsaved_cursors, self._unsaved_lost = [], {}, Counter()
        for s in numbered:
            self.metrics.signals.labels(self.config.node, s.kind.value).inc()
            if s.kind is SignalKind.XID and s.gpu.index >= 0:
                self.metrics.xid(s)
            log.info(
                "signal",
                node=s.node,
                seq=s.seq,
                kind=s.kind.value,
                code=s.code,
                gpu=s.gpu.index,
                source=s.source,
                count=s.count,
            )
        for kind, count in self.spool.dropped.items():
            if count > dropped_before.get(kind, 0):
                self.metrics.spool_dropped.labels(self.config.node, kind).inc(count - dropped_before.get(kind, 0))
        if numbered:
            self.link.notify()

    def _show_spool(self) -> None:
        """The spool's gauges: every signal waiting, and the faults among them."""
        node = self.config.node
        self.metrics.spooled.labels(node).set(self.spool.count())
        self.metrics.faults_waiting.labels(node).set(self.spool.urgent_waiting())

    def _bound_unsaved(self) -> None:
        """While the spool cannot be written, memory holds at most its bound (faults to keep first)."""
        excess = len(self._unsaved) - self.config.spool_max_signals
        if excess <= 0:
            return
        droppable = [i for i, s in enumerate(self._unsaved) if not s.must_keep][:excess]
        lost: Counter[str] = Counter()
        for i in droppable:
            lost[self._unsaved[i].kind.value] += self._unsaved[i].count
        for kind, count in lost.items():
            self.metrics.spool_dropped.labels(self.config.node, kind).inc(count)
        self._unsaved_lost.update(lost)
        gone = set(droppable)
        self._unsaved = [s for i, s in enumerate(self._unsaved) if i not in gone]
        if lost:
            log.error("unsaved_signals_dropped", node=self.config.node, dropped=dict(lost), kept=len(self._unsaved))

    # Driving the collectors, all alike --------------------------------------------------------------

    async def _drive(self, stop: asyncio.Event, collector: Collector) -> None:
        """Poll every ``interval_s``: a blocking collector in a worker thread under the watchdog (a hung
        call is COLLECTOR_HUNG, the node UNKNOWN), a non-blocking one on the loop. One failing
        collector never stops the others or the link."""
        node, deadline, name = self.config.node, self.config.collector_deadline_s, collector.name
        worker = GuardedWorker(name, deadline) if collector.blocking else None
        while not stop.is_set():
            if worker is None:
                self.poll_now(collector)
            else:
                started = time.monotonic()
                result: Poll | None = None
                try:
                    finished, result = await worker.call(collector.poll)
                except Exception as exc:
                    finished = True
                    self.metrics.collector_errors.labels(node, name).inc()
                    log.warning("collector_failed", node=node, collector=name, error=repr(exc))
                self.metrics.collector_hung.labels(node, name).set(0 if finished else 1)
                if finished:
                    self.metrics.collector_seconds.labels(node, name).set(time.monotonic() - started)
                collector.show(self.metrics, finished and result is not None)
                hung = self.watchdog.report(name, not finished, deadline)
                self.record(hung + (result.signals if result else []), result.cursors if result else None)
            self._show_spool()
            await wait_event(stop, collector.interval_s)

    def poll_now(self, collector: Collector) -> None:
        """One poll of a non-blocking collector, on the loop, and its signals recorded (which also
        sends the storm's due summaries)."""
        try:
            result, fresh = collector.poll(), True
        except Exception as exc:  # an unreadable log, a broken queue: counted, and polled again next time
            result, fresh = Poll(), False
            self.metrics.collector_errors.labels(self.config.node, collector.name).inc()
            log.warning("collector_failed", node=self.config.node, collector=collector.name, error=repr(exc))
        collector.show(self.metrics, fresh)
        self.record(result.signals, result.cursors)

    async def run(self, stop: asyncio.Event) -> None:
        if self.config.metrics_port is not None:
            address, port = self.config.metrics_bind, self.config.metrics_port
            server = serve_http(address, port, self.metrics.registry, self.problems, lambda: stuck(self.lateness))
            self.metrics_port = server.server_port
        log.info(
            "agent_started",
            node=self.config.node,
            backend=self.backend.name,
            gpus=len(self.backend.gpus()),
            controller=self.config.controller,
            metrics_port=self.metrics_port,
            spool_id=self.spool.spool_id,
            kernel_log=self.kernel_log,
            dcgm_exporter=self.config.dcgm_exporter_url,
        )
        # Each loop supervised: one that raises is logged, counted and started again after a backoff.
        tasks = [
            asyncio.create_task(supervise(f"collector:{c.name}", partial(self._drive, stop, c), stop, self.tasks))
            for c in self.collectors
        ]
        tasks.append(asyncio.create_task(supervise("link", partial(self.link.run, stop), stop, self.tasks)))
        tasks.append(asyncio.create_task(supervise("jobs", partial(self._scan_jobs, stop), stop, self.tasks)))
        if self.config.progress_dir is not None:
            progress = partial(self._scan_progress, stop)
            tasks.append(asyncio.create_task(supervise("progress", progress, stop, self.tasks)))
        observe_lag = self.metrics.loop_lag.labels(self.config.node).observe
        lag = partial(self.lateness.watch, observe_lag)
        lateness = asyncio.create_task(supervise("loop-lag", lag, stop, self.tasks))  # never ends: cancelled below
        try:
            await asyncio.gather(*tasks)
        finally:
            lateness.cancel()
            for task in tasks:
                task.cancel()
            self.record(self.storm.flush_all())  # held repeats go to the spool, sent at the next start
            if self.kernel_source is not None:
                self.kernel_source.close()
            self.backend.close()
            self.spool.close()


def run_agent(config: AgentConfig) -> None:
    thread_names.mirror()  # process-wide: here, never in a test's process

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await Agent(config).run(stop)

    asyncio.run(main())
