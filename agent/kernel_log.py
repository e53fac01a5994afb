"""Kernel-log sources and the collector that turns driver fault lines into signals.

Three sources give lines, each with a cursor the daemon stores in the spool together with the
signals read up to it:

- ``KmsgSource`` reads ``/dev/kmsg``: one record per ``read()``; EPIPE means the ring buffer
  overwrote records before we read them (counted in ``overruns``; reading goes on at the oldest
  record still there). With no cursor it starts at the end, as a fresh agent must (older faults
  were someone else's to handle). With a cursor from this boot it resumes after that record; with
  a cursor from an earlier boot it reads this boot's log from its start, because the node
  rebooted while the agent was down and those lines are new to it.
- ``JournaldSource`` follows ``journalctl --dmesg --output=json`` and resumes with
  ``--after-cursor``, for nodes where /dev/kmsg is not readable from the pod.
- ``FileTail`` tails a kmsg-format file (the demo's and the tests' kernel log) by inode and offset.
"""

from __future__ import annotations

import errno
import json
import os
import queue
import subprocess
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

import structlog

from agent.driver_lines import GpuAnnounce, SxidLine, UnparsedLine, XidLine, parse_nvrm, parse_record
from protos.codec import valid_text
from vigil_core.signals import GpuRef, Signal, SignalKind

log = structlog.get_logger(__name__)

_MAX_READ = 1 << 20
MAX_LINE_BYTES = 64 * 1024  # a kernel record is at most about 1 KiB; a longer line keeps its head only
_MAX_RECORDS = 10_000  # per call, so a flood cannot starve the event loop
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
SAMPLES_KEPT = 5  # unparsed driver lines sent with each heartbeat, at most
SAMPLE_CHARS = 512


class LineSource(Protocol):
    def read_lines(self) -> list[str]: ...

    @property
    def cursor(self) -> str | None: ...

    def close(self) -> None: ...


def current_boot_id(path: Path = BOOT_ID) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return "unknown-boot"


class KmsgSource:
    def __init__(self, path: Path = Path("/dev/kmsg"), cursor: str | None = None, boot_id: str | None = None) -> None:
        self._boot = boot_id or current_boot_id()
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._after = -1
        self.overruns = 0
        saved_boot, _, saved_seq = (cursor or "").rpartition(":")
        if cursor is None:
            os.lseek(self._fd, 0, os.SEEK_END)
        elif saved_boot == self._boot and saved_seq.isdigit():
            self._after = int(saved_seq)  # the start of the buffer, skipping what we had
        # else: an earlier boot's cursor: read this boot from its first record

    @property
    def cursor(self) -> str | None:
        return f"{self._boot}:{self._after}" if self._after >= 0 else None

    def read_lines(self) -> list[str]:
        lines: list[str] = []
        while len(lines) < _MAX_RECORDS:
            try:
                raw = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    self.overruns += 1
                    log.warning("kmsg_overrun", overruns=self.overruns)
                    continue
                raise
            record = raw.decode("utf-8", errors="replace").split("\n", 1)[0]  # continuation lines: metadata
            seq = parse_record(record).seq
            if seq <= self._after:
                continue
            self._after = max(self._after, seq)
            lines.append(record)
        return lines

    def close(self) -> None:
        os.close(self._fd)


class JournaldSource:
    """Kernel messages from ``journalctl -k -f -o json``; a reader thread feeds a queue."""

    def __init__(self, cursor: str | None = None, command: str = "journalctl", restart_s: float = 5.0) -> None:
        self._cursor = cursor
        self._command = command
        self._restart_s = restart_s
        self._lines: queue.Queue[tuple[str, str | None]] = queue.Queue(maxsize=100_000)
        self._proc: subprocess.Popen[str] | None = None
        self._started_at = 0.0
        self._start()

    def _start(self) -> None:
        args = [self._command, "--dmesg", "--follow", "--output=json", "--no-pager"]
        args += [f"--after-cursor={self._cursor}"] if self._cursor else ["--lines=0"]
        self._started_at = time.monotonic()
        try:
            self._proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError as exc:
            log.error("journald_unavailable", command=self._command, error=str(exc))
            self._proc = None
            return
        threading.Thread(target=self._pump, args=(self._proc,), name="vigil-journald", daemon=True).start()

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            try:
                entry = json.loads(raw)
            except json.JSONDecodeError:
                log.warning("journald_bad_json", line=raw[:200])
                continue
            message = entry.get("MESSAGE", "")
            if isinstance(message, list):  # journald sends non-UTF-8 messages as a byte array
                message = bytes(message).decode("utf-8", errors="replace")
            self._lines.put((str(message), entry.get("__CURSOR")))

    @property
    def cursor(self) -> str | None:
        return self._cursor

    def read_lines(self) -> list[str]:
        lines: list[str] = []
        while len(lines) < _MAX_RECORDS:
            try:
                message, cursor = self._lines.get_nowait()
            except queue.Empty:
                break
            lines.append(message)
            self._cursor = cursor or self._cursor
        exited = self._proc is None or self._proc.poll() is not None
        if exited and not lines and time.monotonic() - self._started_at > self._restart_s:
            log.warning("journald_restart", command=self._command, cursor=self._cursor)
            self._start()
        return lines

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(timeout=5)


class FileTail:
    """Complete new lines appended to a file since the last call; the cursor is inode:offset."""

    def __init__(self, path: Path, cursor: str | None = None) -> None:
        self._path = path
        self._offset: int | None = None
        self._inode: int | None = None
        self._partial = b""
        self._skipping = False  # inside the tail of an over-long line, up to its newline
        self.long_lines = 0
        inode, _, offset = (cursor or "").partition(":")
        if inode.isdigit() and offset.isdigit():
            self._inode, self._offset = int(inode), int(offset)

    @property
    def cursor(self) -> str | None:
        return f"{self._inode}:{self._offset - len(self._partial)}" if self._offset is not None else None

    def read_lines(self) -> list[str]:
        try:
            stat = os.stat(self._path)
        except FileNotFoundError:
            return []
        if self._offset is None:  # first look: skip what was there before we started
            self._offset, self._inode = stat.st_size, stat.st_ino
            return []
        if stat.st_ino != self._inode or stat.st_size < self._offset:
            self._offset, self._inode, self._partial, self._skipping = 0, stat.st_ino, b"", False
        if stat.st_size == self._offset:
            return []
        with open(self._path, "rb") as f:
            f.seek(self._offset)
            data = f.read(_MAX_READ)
        self._offset += len(data)
        chunks = (self._partial + data).split(b"\n")
        self._partial = chunks.pop()
        if self._skipping and chunks:  # the rest of an over-long line ends here
            chunks, self._skipping = chunks[1:], False
        if self._skipping:
            self._partial = b""
        elif len(self._partial) > MAX_LINE_BYTES:  # no newline in sight: keep the head, skip the rest
            chunks.append(self._partial)
            self._partial, self._skipping = b"", True
        lines = []
        for chunk in chunks:
            if len(chunk) > MAX_LINE_BYTES:
                self.long_lines += 1
                chunk = chunk[:MAX_LINE_BYTES]
            if chunk:
                lines.append(chunk.decode("utf-8", errors="replace"))
        return lines

    def close(self) -> None:
        pass


class KernelLogCollector:
    """Maps parsed lines to signals; the PCI bus id names the GPU."""

    def __init__(
        self,
        node: str,
        lines: Callable[[], list[str]],
        gpus: Iterable[GpuRef],
        clock: Callable[[], float] = time.time,
        source: str = "kmsg",
    ) -> None:
        self._node = node
        self.source = source  # "kmsg", "journald" or "file": where the line was read
        self._lines = lines
        self._by_bus = {g.pci_bus_id: g for g in gpus if g.pci_bus_id}
        self._clock = clock
        self.unparsed: Counter[str] = Counter()  # reason -> lines
        # The latest unparsed driver lines, for the controller (a sample: the fleet sees what it misses).
        self.samples: deque[str] = deque(maxlen=SAMPLES_KEPT)

    @property
    def unparsed_lines(self) -> int:
        return sum(self.unparsed.values())

    def collect(self) -> list[Signal]:
        """Every line on its own: one the parser cannot use is counted by reason, and the rest go on."""
        signals = []
        for line in self._lines():
            try:
                signal = self.signal_for(line)
            except UnparsedLine as exc:
                self._count_unparsed(exc.reason, line)
                continue
            except Exception as exc:  # a parser bug must cost one line, never the agent
                self._count_unparsed("error", line, repr(exc))
                continue
            if signal is not None:
                signals.append(signal)
        return signals

    def take_samples(self) -> list[str]:
        """The unparsed lines kept since the last call (at most ``SAMPLES_KEPT``), each cut short."""
        taken = list(self.samples)
        self.samples.clear()
        return taken

    def _count_unparsed(self, reason: str, line: str, error: str = "") -> None:
        self.unparsed[reason] += 1
        self.samples.append(f"{reason}: {valid_text(line)[:SAMPLE_CHARS]}")
        if self.unparsed[reason] <= 100 or self.unparsed[reason] % 1000 == 0:  # a flood logs sparsely
            log.warning("kernel_log_unparsed", reason=reason, count=self.unparsed[reason], line=line[:300], error=error)

    def signal_for(self, line: str) -> Signal | None:
        """The signal a line carries; None for a line that is not a fault. Raises ``UnparsedLine``."""
        message = valid_text(parse_record(line).message)
        parsed = parse_nvrm(message)
        if isinstance(parsed, GpuAnnounce):
            known = self._by_bus.get(parsed.pci_bus_id, GpuRef(pci_bus_id=parsed.pci_bus_id))
            if len(self._by_bus) < 4096 or parsed.pci_bus_id in self._by_bus:  # bounded: announces are few
                self._by_bus[parsed.pci_bus_id] = GpuRef(known.index, parsed.uuid, parsed.pci_bus_id)
            return None
        if parsed is None:
            return None
        if isinstance(parsed, SxidLine):
            return Signal(
                node=self._node,
                kind=SignalKind.SXID_FATAL if parsed.fatal else SignalKind.SXID_NONFATAL,
                gpu=GpuRef(pci_bus_id=parsed.pci_bus_id),  # the switch's bus; no GPU
                code=parsed.code,
                message=message.strip()[:1000],
                source=self.source,
                observed_at=self._clock(),
            )
        return self._xid_signal(parsed, message)

    def _xid_signal(self, xid: XidLine, message: str) -> Signal:
        gpu = self._by_bus.get(xid.pci_bus_id, GpuRef(pci_bus_id=xid.pci_bus_id))
        return Signal(
            node=self._node,
            kind=SignalKind.XID,
            gpu=gpu,
            code=xid.code,
            message=message.strip()[:1000],
            source=self.source,
            observed_at=self._clock(),
        )
