"""The agent's collector interface, and the collectors it drives all alike.

As node-problem-detector's monitors do, a collector only observes: ``poll`` returns the signals it
saw and the cursors that say how far it got (written to the spool in the same transaction, so a
restarted agent resumes there); ``show`` hands its latest readings to ``/metrics``. The daemon runs
every collector in the same loop, every ``interval_s``: a ``blocking`` one (a driver or HTTP call
that can hang) in a worker thread under the watchdog, a non-blocking one on the event loop, which is
the fast path from a fault to the controller (the kernel log, NVML's event queue).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from agent.dcgm import DcgmCollector
from agent.gpu_collector import GpuCollector, xid_signals
from agent.host import HostCollector
from agent.infiniband import PortReading, PortWatch, read_ports
from agent.kernel_log import KernelLogCollector, KmsgSource, LineSource
from agent.metrics import AgentMetrics
from agent.watchdog import Watchdog
from gpus.backend import GpuBackend
from vigil_core.signals import Signal


@dataclass
class Poll:
    signals: list[Signal] = field(default_factory=list)
    cursors: dict[str, str] = field(default_factory=dict)


class Collector(Protocol):
    name: str
    interval_s: float
    blocking: bool

    def poll(self) -> Poll: ...

    def show(self, metrics: AgentMetrics, fresh: bool) -> None:
        """Publish the latest readings; ``fresh`` is False when the last poll hung or failed."""


class GpuPoll:
    """Every GPU's reading through the backend, and the fault transitions between polls."""

    name, blocking = "gpu-poll", True

    def __init__(self, collector: GpuCollector, interval_s: float, saved: str | None) -> None:
        self.collector, self.interval_s = collector, interval_s
        self._saved = saved  # the fault baseline as last written to the spool
        if saved:
            collector.restore(json.loads(saved))

    def poll(self) -> Poll:
        signals = self.collector.collect()
        snapshot = json.dumps(self.collector.snapshot(), sort_keys=True)
        if snapshot == self._saved:
            return Poll(signals)
        self._saved = snapshot
        return Poll(signals, {"gpu": snapshot})

    def show(self, metrics: AgentMetrics, fresh: bool) -> None:
        metrics.readings.gpus = self.collector.readings if fresh else []  # a hung poll shows no stale values


class HostPoll:
    name, blocking = "host", True

    def __init__(self, collector: HostCollector, interval_s: float) -> None:
        self.collector, self.interval_s = collector, interval_s

    def poll(self) -> Poll:
        return Poll(self.collector.collect())

    def show(self, metrics: AgentMetrics, fresh: bool) -> None:
        metrics.readings.host = self.collector.reading if fresh else None


class IbPoll:
    """InfiniBand/RoCE ports from sysfs (``agent.infiniband``): down time, rate, error counters."""

    name, blocking = "infiniband", True

    def __init__(self, watch: PortWatch, root: Path, interval_s: float, clock: Callable[[], float]) -> None:
        self.watch, self.root, self.interval_s, self._clock = watch, root, interval_s, clock
        self.readings: list[PortReading] = []

    def poll(self) -> Poll:
        self.readings = read_ports(self.root)
        return Poll(self.watch.observe(self.readings, self._clock()))

    def show(self, metrics: AgentMetrics, fresh: bool) -> None:
        now = self._clock()
        metrics.readings.ib = [(r, self.watch.down_total_s(r.hca, r.port, now)) for r in self.readings] if fresh else []
        metrics.readings.pci_root = self.root.parent.parent / "bus" / "pci" / "devices"  # the same sysfs


class DcgmScrape:
    name, blocking = "dcgm", True

    def __init__(self, collector: DcgmCollector, interval_s: float) -> None:
        self.collector, self.interval_s = collector, interval_s

    def poll(self) -> Poll:
        return Poll(self.collector.collect())

    def show(self, metrics: AgentMetrics, fresh: bool) -> None:
        pass  # dcgm-exporter serves its own metrics


class NvmlEvents:
    """XID events queued by the NVML backend's listener thread; a listener stuck in the driver for
    longer than the deadline is reported as a hung collector, as a blocking collector would be."""

    name, blocking = "nvml-events", False

    def __init__(
        self, node: str, backend: GpuBackend, watchdog: Watchdog, deadline_s: float, interval_s: float
    ) -> None:
        self._node, self._backend, self._watchdog = node, backend, watchdog
        self._deadline_s, self.interval_s = deadline_s, interval_s
        self._stuck = False

    def poll(self) -> Poll:
        signals = xid_signals(self._node, self._backend.drain_xid_events())
        progress = self._backend.events_progress()
        if progress is not None:
            self._stuck = time.monotonic() - progress > self._deadline_s
            signals += self._watchdog.report(self.name, self._stuck, self._deadline_s)
        return Poll(signals)

    def show(self, metrics: AgentMetrics, fresh: bool) -> None:
        if self._backend.events_progress() is not None:
            metrics.collector_hung.labels(self._node, self.name).set(1 if self._stuck else 0)


class KernelLog:
    """Driver fault lines from the kernel log; what it cannot parse it counts by reason. Its cursor
    (``cursor_key`` in the spool) comes back with the signals of the lines before it, so both land
    in one spool write; with no signals, at most every ``save_every_s`` (a restart then re-reads at
    most that much of the log, harmlessly: the spool drops what it has seen)."""

    name, blocking = "kernel-log", False

    def __init__(
        self,
        node: str,
        source: LineSource,
        collector: KernelLogCollector,
        interval_s: float,
        cursor_key: str,
        saved: str | None = None,
        save_every_s: float = 10.0,
    ) -> None:
        self._node, self.source, self.collector, self.interval_s = node, source, collector, interval_s
        self.cursor_key, self._saved, self._save_every_s = cursor_key, saved, save_every_s
        self._saved_at = float("-inf")
        self._unparsed: dict[str, int] = {}
        self._overruns = 0

    def poll(self) -> Poll:
        signals = self.collector.collect()
        cursor, now = self.source.cursor, time.monotonic()
        if cursor is None or cursor == self._saved or (not signals and now - self._saved_at < self._save_every_s):
            return Poll(signals)
        self._saved, self._saved_at = cursor, now
        return Poll(signals, {self.cursor_key: cursor})

    def show(self, metrics: AgentMetrics, fresh: bool) -> None:
        for reason, count in self.collector.unparsed.items():
            if count > self._unparsed.get(reason, 0):
                metrics.unparsed.labels(self._node, reason).inc(count - self._unparsed.get(reason, 0))
                self._unparsed[reason] = count
        if isinstance(self.source, KmsgSource) and self.source.overruns > self._overruns:
            metrics.kmsg_overruns.labels(self._node).inc(self.source.overruns - self._overruns)
            self._overruns = self.source.overruns
