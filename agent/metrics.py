"""The agent's Prometheus metrics.

Names follow Prometheus conventions: ``vigil_`` prefix, base units in the name (celsius, watts,
hertz, bytes, seconds, ratio), ``_total`` on counters. The GPU and host series are produced at
scrape time from the latest readings (a custom collector), so a field the GPU cannot report is
simply absent, never zero, and a GPU whose poll is hung shows no stale values: its series go
away and ``vigil_agent_collector_hung`` says why. Hardware counters that the driver keeps (ECC,
NVLink, PCIe replays) are exported as counters, since they only grow until a driver reload.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agent.host import HostReading
from agent.infiniband import PortReading
from agent.pcie import SYS_BUS_PCI, nearest_gpus, pcie_path, sysfs_device
from gpus.backend import GpuReading
from vigil_core import loop_lag
from vigil_core.signals import THROTTLE_HARMFUL_MASK, GpuRef, Signal, throttle_reason_names

_GPU = ["node", "gpu", "uuid", "pci_bus_id"]
_THROTTLE_BITS = [1 << i for i in range(8)]


class _Readings(Collector):
    """Yields the GPU and host families from whatever the collectors read last."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.gpus: list[GpuReading] = []
        self.host: HostReading | None = None
        self.ib: list[tuple[PortReading, float]] = []  # each port, and its cumulative seconds down
        self.pci_root = SYS_BUS_PCI  # where each GPU's PCIe place is read (the port -> GPU label)
        self._gpu_paths: dict[str, tuple[str, ...]] = {}

    def collect(self) -> Iterator[Any]:
        yield from _gpu_families(self.node, self.gpus)
        if self.host is not None:
            yield from _host_families(self.node, self.host)
        if self.ib:
            yield from _ib_families(self.node, self.ib, self._port_gpus())

    def _port_gpus(self) -> dict[str, str]:
        """Each port's HCA -> the GPU(s) it serves, "0" or "0,1" (none where the topology does not tell)."""
        for r in self.gpus:
            bus = r.gpu.pci_bus_id
            if bus and bus not in self._gpu_paths:
                device = sysfs_device(self.pci_root, bus)
                self._gpu_paths[bus] = pcie_path(device) if device else ()
        paths = {str(r.gpu.index): self._gpu_paths.get(r.gpu.pci_bus_id, ()) for r in self.gpus}
        return {p.hca: ",".join(nearest_gpus(p.pcie_path, paths)) for p, _ in self.ib}


class LinkCounts(Protocol):
    """What the agent's link to the controller counts (``agent.link.ControllerLink``)."""

    streams: int
    connections: int
    urgent_sessions: int
    resumed: int
    unanswered: int
    attempt: int
    left_for_urgent: int


class _Link(Collector):
    """The link's counts as they are at the scrape: why an agent is not in, seen from its node.

    The controller's ``VigilAgentsSilent`` sees only nodes it has heard from; an agent that never got
    in (a wrong address, a refused certificate, a controller that never answers) is seen here alone.
    """

    def __init__(self, node: str, link: LinkCounts) -> None:
        self.node, self.link = node, link

    def collect(self) -> Iterator[Any]:
        link = self.link
        sessions = CounterMetricFamily(
            "vigil_agent_controller_sessions",
            "Hellos the controller (or a relay for it) answered, by port: urgent for a session the agent began on "
            "the urgent port because faults waited",
            labels=["node", "port"],
        )
        sessions.add_metric([self.node, "main"], link.connections - link.urgent_sessions)
        sessions.add_metric([self.node, "urgent"], link.urgent_sessions)
        yield sessions
        counts: list[tuple[type[CounterMetricFamily | GaugeMetricFamily], str, str, int]] = [
            (CounterMetricFamily, "streams", "Streams the agent opened to the controller or a relay", link.streams),
            (
                CounterMetricFamily,
                "sessions_resumed",
                "Sessions that ended with their stream kept (a relay's HelloAgain while it reached the controller "
                "again)",
                link.resumed,
            ),
            (
                CounterMetricFamily,
                "left_for_urgent",
                "Calls still waiting for their Hello's answer given up for the urgent port when a fault came",
                link.left_for_urgent,
            ),
            (
                GaugeMetricFamily,
                "failed_sessions",
                "Sessions that ended since the controller last answered a Hello (0 once one is answered; counted "
                "up to 16)",
                link.attempt,
            ),
            (
                GaugeMetricFamily,
                "hellos_unanswered",
                "Hellos in a row not answered in the time they were given (each next one is given twice as long)",
                link.unanswered,
            ),
        ]
        for family, name, doc, value in counts:
            metric = family(f"vigil_agent_controller_{name}", doc, labels=["node"])
            metric.add_metric([self.node], value)
            yield metric


def _ib_families(node: str, ports: list[tuple[PortReading, float]], gpus: Mapping[str, str]) -> Iterator[Any]:
    labels = ["node", "hca", "port", "link_layer", "gpu"]
    up = GaugeMetricFamily("vigil_ib_port_up", "1 when the port is ACTIVE and LinkUp", labels=labels)
    rate = GaugeMetricFamily("vigil_ib_port_rate_gbps", "The port's link rate (Gb/s)", labels=labels)
    width = GaugeMetricFamily("vigil_ib_port_width_lanes", "The port's link width (lanes; 4 for 4X)", labels=labels)
    down = CounterMetricFamily(
        "vigil_ib_port_down_seconds", "Seconds the port has been down since the agent started", labels=labels
    )
    counters = CounterMetricFamily(
        "vigil_ib_port_counter", "The port's counters and RoCE hw_counters, as sysfs reads", labels=[*labels, "counter"]
    )
    for r, down_s in ports:
        values = [node, r.hca, str(r.port), r.link_layer, gpus.get(r.hca, "")]
        up.add_metric(values, 1.0 if r.up else 0.0)
        rate.add_metric(values, r.rate_gbps)
        width.add_metric(values, float(r.width))
        down.add_metric(values, down_s)
        for name, value in sorted(r.counters.items()):
            counters.add_metric([*values, name], float(value))
    yield from (up, rate, width, down, counters)


def _gpu_families(node: str, readings: list[GpuReading]) -> Iterator[Any]:
    def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=[*_GPU, *extra])

    def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> CounterMetricFamily:
        return CounterMetricFamily(name, doc, labels=[*_GPU, *extra])

    simple: list[tuple[GaugeMetricFamily | CounterMetricFamily, str, float]] = [
        (gauge("vigil_gpu_temperature_celsius", "GPU core temperature"), "temperature_c", 1.0),
        (gauge("vigil_gpu_power_watts", "GPU power draw"), "power_w", 1.0),
        (gauge("vigil_gpu_sm_clock_hertz", "SM clock"), "sm_clock_mhz", 1e6),
        (gauge("vigil_gpu_memory_clock_hertz", "Memory clock"), "memory_clock_mhz", 1e6),
        (gauge("vigil_gpu_utilization_ratio", "Fraction of time a kernel ran (0-1)"), "utilization_pct", 0.01),
        (gauge("vigil_gpu_memory_used_bytes", "GPU memory in use"), "memory_used_bytes", 1.0),
        (gauge("vigil_gpu_memory_total_bytes", "GPU memory size"), "memory_total_bytes", 1.0),
        (gauge("vigil_gpu_clocks_event_reasons", "NVML clock-event (throttle) reason bits"), "throttle_reasons", 1.0),
        (counter("vigil_gpu_pcie_replays", "PCIe replays since driver load"), "pcie_replays", 1.0),
        (gauge("vigil_gpu_pcie_link_generation", "PCIe link generation now"), "pcie_generation", 1.0),
        (gauge("vigil_gpu_pcie_link_generation_max", "Highest PCIe generation"), "pcie_generation_max", 1.0),
        (gauge("vigil_gpu_pcie_link_width", "PCIe lanes now"), "pcie_width", 1.0),
        (gauge("vigil_gpu_pcie_link_width_max", "Most PCIe lanes"), "pcie_width_max", 1.0),
        (gauge("vigil_gpu_remapped_rows_pending", "1 while a row remap waits for a GPU reset"), "remap_pending", 1.0),
        (gauge("vigil_gpu_remapped_rows_failure", "1 after a row remap failed"), "remap_failure", 1.0),
        (gauge("vigil_gpu_retired_pages_pending", "1 while a page retirement waits"), "retired_pages_pending", 1.0),
    ]
    lost = gauge("vigil_gpu_lost", "1 when the GPU is lost (fallen off the bus, needs reset)")
    ecc = counter("vigil_gpu_ecc_errors", "ECC errors", ("scope", "type"))
    remapped = counter("vigil_gpu_remapped_rows", "Rows remapped", ("type",))
    retired = gauge("vigil_gpu_retired_pages", "Pages retired", ("cause",))
    throttle_on = gauge("vigil_gpu_clocks_event_active", "1 while a clock-event reason holds", ("reason", "harmful"))
    throttle_s = counter("vigil_gpu_clocks_event_duration_seconds", "Driver's time per clock-event reason", ("reason",))
    nvlink = counter("vigil_gpu_nvlink_errors", "NVLink error counters", ("link", "counter"))
    nvlink_down = gauge("vigil_gpu_nvlink_links_down", "NVLinks that were up at start and are down now")
    for r in readings:
        g = r.gpu
        labels = [node, str(g.index), g.uuid, g.pci_bus_id]
        lost.add_metric(labels, 1.0 if r.lost else 0.0)
        for family, field, scale in simple:
            value = getattr(r, field)
            if value is not None:
                family.add_metric(labels, float(value) * scale)
        for scope in ("volatile", "aggregate"):
            for kind in ("corrected", "uncorrected"):
                if (value := getattr(r, f"ecc_{scope}_{kind}")) is not None:
                    ecc.add_metric([*labels, scope, kind], value)
        for kind in ("corrected", "uncorrected"):
            if (value := getattr(r, f"remapped_rows_{kind}")) is not None:
                remapped.add_metric([*labels, kind], value)
        for cause, value in (("single_bit", r.retired_pages_sbe), ("double_bit", r.retired_pages_dbe)):
            if value is not None:
                retired.add_metric([*labels, cause], value)
        if r.throttle_reasons is not None:
            for bit in _THROTTLE_BITS:
                harmful = "true" if bit & THROTTLE_HARMFUL_MASK else "false"
                throttle_on.add_metric(
                    [*labels, throttle_reason_names(bit), harmful], 1.0 if r.throttle_reasons & bit else 0
                )
        for bit, ns in (r.throttle_ns or {}).items():
            throttle_s.add_metric([*labels, throttle_reason_names(bit)], ns / 1e9)
        for (link, name), value in (r.nvlink_errors or {}).items():
            nvlink.add_metric([*labels, str(link), name], value)
        if r.nvlink_links_down is not None:
            nvlink_down.add_metric(labels, len(r.nvlink_links_down))
    yield from (f for f, _, _ in simple)
    yield from (lost, ecc, remapped, retired, throttle_on, throttle_s, nvlink, nvlink_down)


def _host_families(node: str, h: HostReading) -> Iterator[Any]:
    available = GaugeMetricFamily("vigil_host_memory_available_bytes", "Host memory available", labels=["node"])
    available.add_metric([node], h.memory_available_bytes)
    total = GaugeMetricFamily("vigil_host_memory_total_bytes", "Host memory size", labels=["node"])
    total.add_metric([node], h.memory_total_bytes)
    yield from (available, total)
    if h.disk_free_bytes is not None and h.disk_total_bytes is not None:
        free = GaugeMetricFamily(
            "vigil_host_checkpoint_disk_free_bytes", "Free space for checkpoints", labels=["node", "path"]
        )
        free.add_metric([node, h.checkpoint_path], h.disk_free_bytes)
        size = GaugeMetricFamily(
            "vigil_host_checkpoint_disk_size_bytes", "Checkpoint filesystem size", labels=["node", "path"]
        )
        size.add_metric([node, h.checkpoint_path], h.disk_total_bytes)
        yield from (free, size)
    nic = CounterMetricFamily(
        "vigil_host_nic_errors", "NIC error and drop counters", labels=["node", "nic", "direction", "type"]
    )
    for name, (errin, errout, dropin, dropout) in sorted(h.nic_errors.items()):
        for direction, kind, value in (
            ("rx", "error", errin),
            ("tx", "error", errout),
            ("rx", "drop", dropin),
            ("tx", "drop", dropout),
        ):
            nic.add_metric([node, name, direction, kind], value)
    yield nic


class AgentMetrics:
    def __init__(self, node: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.node = node
        self.readings = _Readings(node)
        r = self.registry
        r.register(self.readings)
        self.signals = Counter("vigil_agent_signals", "Signals spooled", ["node", "kind"], registry=r)
        # Per GPU and XID code, for shops that alert from Prometheus alone. A counter series appears
        # only with its first XID (so increase() over it misses that one); the last-XID gauges exist
        # for every GPU from the start, so changes() on the timestamp sees the very first XID.
        gpu = ["node", "gpu", "uuid"]
        self.xid_errors = Counter(
            "vigil_gpu_xid_errors",
            "XID errors observed, per GPU and code (a storm's repeats counted)",
            [*gpu, "code"],
            registry=r,
        )
        self.last_xid_code = Gauge(
            "vigil_gpu_last_xid_code", "The GPU's latest XID code (0: none yet)", gpu, registry=r
        )
        self.last_xid_at = Gauge(
            "vigil_gpu_last_xid_timestamp_seconds",
            "When the GPU's latest XID was observed (0: none yet)",
            gpu,
            registry=r,
        )
        self.unparsed = Counter(
            "vigil_agent_kernel_log_unparsed",
            "Kernel-log lines that looked like a driver fault but could not be used, by reason "
            "(unrecognised, out_of_range, error); each is skipped and the log read on",
            ["node", "reason"],
            registry=r,
        )
        self.refused = Counter(
            "vigil_agent_signals_refused",
            "Signals that could not be put on the wire (a number out of range) and were not spooled",
            ["node", "kind"],
            registry=r,
        )
        self.storm_folded = Counter(
            "vigil_agent_storm_folded",
            "Repeats of a fault held back and sent as part of one signal's count",
            ["node"],
            registry=r,
        )
        self.spool_damaged = Counter(
            "vigil_agent_spool_damaged",
            "Times the agent found its spool damaged or lost at start (moved aside, a new one begun)",
            ["node"],
            registry=r,
        )
        self.kmsg_overruns = Counter(
            "vigil_agent_kmsg_overruns", "Times /dev/kmsg overwrote records before they were read", ["node"], registry=r
        )
        self.xid_folded = Counter(
            "vigil_agent_xid_folded", "XIDs dropped as a second source's report of the same fault", ["node"], registry=r
        )
        self.spooled = Gauge("vigil_agent_spool_signals", "Signals waiting in the spool", ["node"], registry=r)
        self.faults_waiting = Gauge(
            "vigil_agent_spool_faults_waiting",
            "Faults the default policy quarantines on, in the spool and not acknowledged by the controller yet"
            " (what the agent's Hello says; never dropped to keep the spool's bound)",
            ["node"],
            registry=r,
        )
        self.spool_dropped = Counter(
            "vigil_agent_spool_dropped_signals",
            "Signals dropped to keep the spool bounded",
            ["node", "kind"],
            registry=r,
        )
        self.connected = Gauge(
            "vigil_agent_controller_connected", "1 while the controller stream is up", ["node"], registry=r
        )
        self.loop_lag = Histogram(
            "vigil_agent_event_loop_lag_seconds",
            "How much later than due the agent's event loop ran a tick every 0.1 s (a node's CPUs busy; the"
            " wait for the controller's answer to a Hello leaves it out)",
            ["node"],
            buckets=loop_lag.BUCKETS_S,
            registry=r,
        )
        self.certificate_expiry = Gauge(
            "vigil_agent_certificate_expiry_timestamp_seconds",
            "When the agent's certificate in use expires (unix time)",
            ["node"],
            registry=r,
        )
        self.collector_hung = Gauge(
            "vigil_agent_collector_hung",
            "1 while a collector's call overruns its deadline",
            ["node", "collector"],
            registry=r,
        )
        self.collector_errors = Counter(
            "vigil_agent_collector_errors", "Collector runs that raised an error", ["node", "collector"], registry=r
        )
        self.collector_seconds = Gauge(
            "vigil_agent_collector_duration_seconds",
            "Duration of a collector's last run",
            ["node", "collector"],
            registry=r,
        )
        self.task_failures = Counter(
            "vigil_agent_task_failures_total",
            "Exceptions that ended one of the agent's loops (a collector's, the link's); each restarts with backoff",
            ["node", "task"],
            registry=r,
        )
        self.rank_records = Gauge(
            "vigil_agent_rank_records",
            "Training ranks' progress records at the last read (state: read, or unreadable: not one whole "
            "record of this node)",
            ["node", "state"],
            registry=r,
        )
        self.unparsed_samples_sent = Counter(
            "vigil_agent_unparsed_driver_lines_sent_total",
            "Driver lines the agent could not parse, sent to the controller as samples (bounded)",
            ["node"],
            registry=r,
        )

    def link_known(self, link: LinkCounts) -> None:
        """The link's counts, exported as they are at each scrape."""
        self.registry.register(_Link(self.node, link))

    def gpus_known(self, gpus: Sequence[GpuRef]) -> None:
        """Every GPU's last-XID series, from the start (0: no XID yet)."""
        for g in gpus:
            self.last_xid_code.labels(self.node, str(g.index), g.uuid).set(0)
            self.last_xid_at.labels(self.node, str(g.index), g.uuid).set(0)

    def xid(self, s: Signal) -> None:
        labels = (self.node, str(s.gpu.index), s.gpu.uuid)
        self.xid_errors.labels(*labels, str(s.code)).inc(s.count)
        self.last_xid_code.labels(*labels).set(s.code)
        self.last_xid_at.labels(*labels).set(s.observed_at)
