"""The kernel-log collector: tails a kmsg-format file and turns driver fault lines into signals.

This first cut reads a file (the demo's and the tests' kernel log). It starts at the end of the
file, as a fresh agent on a real node must (old faults were handled before), and starts again at
the top when the file is truncated or replaced.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import structlog

from agent.kmsg import GpuAnnounce, XidLine, is_driver_fault_line, parse_nvrm, parse_record
from vigil.signals import GpuRef, Signal, SignalKind

log = structlog.get_logger(__name__)

_MAX_READ = 1 << 20


class FileTail:
    """Complete new lines appended to a file since the last call."""

    def __init__(self, path: Path, start_at_end: bool = True) -> None:
        self._path = path
        self._offset: int | None = None if start_at_end else 0
        self._inode: int | None = None
        self._partial = b""

    def read_lines(self) -> list[str]:
        try:
            stat = os.stat(self._path)
        except FileNotFoundError:
            return []
        if self._offset is None:  # first look: skip what was there before we started
            self._offset, self._inode = stat.st_size, stat.st_ino
            return []
        if stat.st_ino != self._inode or stat.st_size < self._offset:
            self._offset, self._inode, self._partial = 0, stat.st_ino, b""
        if stat.st_size == self._offset:
            return []
        with open(self._path, "rb") as f:
            f.seek(self._offset)
            data = f.read(_MAX_READ)
        self._offset += len(data)
        chunks = (self._partial + data).split(b"\n")
        self._partial = chunks.pop()
        return [c.decode("utf-8", errors="replace") for c in chunks if c]


class KernelLogCollector:
    """Maps parsed lines to signals; the PCI bus id names the GPU."""

    def __init__(
        self,
        node: str,
        lines: Callable[[], list[str]],
        gpus: Iterable[GpuRef],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._node = node
        self._lines = lines
        self._by_bus = {g.pci_bus_id: g for g in gpus if g.pci_bus_id}
        self._clock = clock
        self.unparsed_lines = 0

    def collect(self) -> list[Signal]:
        signals = []
        for line in self._lines():
            signal = self.signal_for(line)
            if signal is not None:
                signals.append(signal)
        return signals

    def signal_for(self, line: str) -> Signal | None:
        message = parse_record(line).message
        parsed = parse_nvrm(message)
        if isinstance(parsed, GpuAnnounce):
            known = self._by_bus.get(parsed.pci_bus_id, GpuRef(pci_bus_id=parsed.pci_bus_id))
            self._by_bus[parsed.pci_bus_id] = GpuRef(known.index, parsed.uuid, parsed.pci_bus_id)
            return None
        if parsed is None:
            if is_driver_fault_line(message):
                self.unparsed_lines += 1
                log.warning("kernel_log_unparsed", line=message[:300])
            return None
        return self._xid_signal(parsed, message)

    def _xid_signal(self, xid: XidLine, message: str) -> Signal:
        gpu = self._by_bus.get(xid.pci_bus_id, GpuRef(pci_bus_id=xid.pci_bus_id))
        return Signal(
            node=self._node,
            kind=SignalKind.XID,
            gpu=gpu,
            code=xid.code,
            message=message.strip()[:1000],
            source="kmsg",
            observed_at=self._clock(),
        )
