"""The agent's Prometheus metrics. Names follow Prometheus conventions: ``vigil_`` prefix, units
in the name, ``_total`` on counters. A field the GPU cannot report is left unset, never zero."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge

from agent.backend import GpuReading


class AgentMetrics:
    def __init__(self, node: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.node = node
        gpu_labels = ["node", "gpu", "uuid", "pci_bus_id"]
        r = self.registry
        self.temperature = Gauge("vigil_gpu_temperature_celsius", "GPU temperature", gpu_labels, registry=r)
        self.power = Gauge("vigil_gpu_power_watts", "GPU power draw", gpu_labels, registry=r)
        self.sm_clock = Gauge("vigil_gpu_sm_clock_hertz", "GPU SM clock", gpu_labels, registry=r)
        self.utilization = Gauge("vigil_gpu_utilization_ratio", "GPU utilisation (0-1)", gpu_labels, registry=r)
        self.memory_used = Gauge("vigil_gpu_memory_used_bytes", "GPU memory in use", gpu_labels, registry=r)
        self.throttle = Gauge("vigil_gpu_throttle_reasons", "NVML clock-event reason bits", gpu_labels, registry=r)
        self.lost = Gauge("vigil_gpu_lost", "1 when the GPU is lost", gpu_labels, registry=r)
        self.signals = Counter("vigil_agent_signals_total", "Signals spooled", ["node", "kind"], registry=r)
        self.unparsed = Counter(
            "vigil_agent_kernel_log_unparsed_lines_total",
            "Driver fault lines the parser did not understand",
            ["node"],
            registry=r,
        )
        self.spooled = Gauge("vigil_agent_spool_signals", "Signals waiting in the spool", ["node"], registry=r)
        self.connected = Gauge(
            "vigil_agent_controller_connected", "1 while the controller stream is up", ["node"], registry=r
        )
        self.poll_seconds = Gauge(
            "vigil_agent_gpu_poll_duration_seconds", "Duration of the last GPU poll", ["node"], registry=r
        )

    def observe_readings(self, readings: list[GpuReading]) -> None:
        pairs = (
            (self.temperature, "temperature_c", 1.0),
            (self.power, "power_w", 1.0),
            (self.sm_clock, "sm_clock_mhz", 1e6),
            (self.utilization, "utilization_pct", 0.01),
            (self.memory_used, "memory_used_bytes", 1.0),
            (self.throttle, "throttle_reasons", 1.0),
        )
        for reading in readings:
            g = reading.gpu
            labels = (self.node, str(g.index), g.uuid, g.pci_bus_id)
            self.lost.labels(*labels).set(1 if reading.lost else 0)
            for gauge, field, scale in pairs:
                value = getattr(reading, field)
                if value is not None:
                    gauge.labels(*labels).set(value * scale)
                else:
                    _forget(gauge, labels)


def _forget(gauge: Gauge, labels: tuple[str, ...]) -> None:
    """Drop a series whose field became unavailable, so no stale value is scraped."""
    with contextlib.suppress(KeyError):
        gauge.remove(*labels)
