"""Host signals with psutil: memory pressure, a nearly full checkpoint filesystem, NIC errors.

Memory pressure and a full disk are reported when they start (once, until they clear); NIC
error counters (``errin``/``errout``) are reported when they grow. Drop counters are exported
as metrics only: kernels count harmless drops (unknown protocols, multicast) there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

from vigil_core.signals import Signal, SignalKind


@dataclass(frozen=True, slots=True)
class HostReading:
    memory_available_bytes: int
    memory_total_bytes: int
    checkpoint_path: str = ""
    disk_free_bytes: int | None = None
    disk_total_bytes: int | None = None
    nic_errors: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)  # errin, errout, dropin, dropout


class HostCollector:
    def __init__(
        self,
        node: str,
        clock: Callable[[], float],
        checkpoint_path: Path | None = None,
        memory_available_min: float = 0.05,
        disk_used_max: float = 0.95,
        ps: Any = psutil,
    ) -> None:
        self._node = node
        self._clock = clock
        self._checkpoint_path = checkpoint_path
        self._memory_available_min = memory_available_min
        self._disk_used_max = disk_used_max
        self._ps = ps
        self._pressure = False
        self._full = False
        self._nic_before: dict[str, int] | None = None
        self.reading: HostReading | None = None

    def collect(self) -> list[Signal]:
        now = self._clock()
        memory = self._ps.virtual_memory()
        reading = HostReading(int(memory.available), int(memory.total))
        signals = []
        available = memory.available / memory.total if memory.total else 1.0
        if available < self._memory_available_min and not self._pressure:
            message = f"only {available:.1%} of host memory available ({memory.available >> 20} MiB)"
            signals.append(self._signal(SignalKind.HOST_MEMORY_PRESSURE, available, message, now))
        self._pressure = available < self._memory_available_min
        if self._checkpoint_path is not None:
            reading, signal = self._disk(reading, now)
            signals += signal
        nics = self._ps.net_io_counters(pernic=True)
        counts = {n: (c.errin, c.errout, c.dropin, c.dropout) for n, c in nics.items() if n != "lo"}
        errors = {n: c[0] + c[1] for n, c in counts.items()}
        if self._nic_before is not None:
            for nic, total in errors.items():
                if (grew := total - self._nic_before.get(nic, total)) > 0:
                    message = f"{nic}: {grew} new receive/transmit errors"
                    signals.append(self._signal(SignalKind.NIC_ERRORS, grew, message, now))
        self._nic_before = errors
        self.reading = replace(reading, nic_errors=counts)
        return signals

    def _disk(self, reading: HostReading, now: float) -> tuple[HostReading, list[Signal]]:
        path = self._checkpoint_path
        assert path is not None
        try:
            usage = self._ps.disk_usage(str(path))
        except OSError:
            return reading, []  # not mounted yet: nothing to say about its space
        used = usage.used / usage.total if usage.total else 0.0
        out = []
        if used >= self._disk_used_max and not self._full:
            message = f"{path} is {used:.1%} full ({usage.free >> 30} GiB free): the next checkpoint may fail"
            out.append(self._signal(SignalKind.DISK_FULL, used, message, now))
        self._full = used >= self._disk_used_max
        disk = replace(
            reading, checkpoint_path=str(path), disk_free_bytes=int(usage.free), disk_total_bytes=int(usage.total)
        )
        return disk, out

    def _signal(self, kind: SignalKind, value: float, message: str, now: float) -> Signal:
        return Signal(self._node, kind, code=1, value=value, message=message, source="host", observed_at=now)
