"""Parsing of kernel-log lines that carry NVIDIA driver faults. Pure functions, no I/O.

Accepted input: ``/dev/kmsg`` records (``6,1234,5678901234,-;NVRM: Xid ...``) and plain lines as
``dmesg`` or journald print them (``[ 1234.5] NVRM: Xid ...``, ``kernel: NVRM: Xid ...``).
Driver formats seen in the field:

- R5xx: ``NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.``
- R525+: ``NVRM: Xid (PCI:0000:b7:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable ...``
- R3xx/R4xx: ``NVRM: Xid (0000:03:00): 13, 0003 00000000 0000a1c0 ...`` (no ``PCI:``, no pid)
- the bus drop without an Xid: ``NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.``
- the start-up line that maps a bus id to a UUID: ``NVRM: GPU at PCI:0000:3b:00: GPU-5b8d...``
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vigil.signals import normalize_pci_bus_id

_BUS = r"(?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
_XID_RE = re.compile(r"NVRM: Xid \(" + _BUS + r"\): (?P<code>\d+)(?:,\s*(?P<rest>.*))?$")
_PID_RE = re.compile(r"^pid=(?P<pid>'<unknown>'|<unknown>|\d+)(?:,\s*name=(?P<name>[^,]*))?,?\s*")
_BUS_DROP_RE = re.compile(r"NVRM: GPU (?:at )?" + _BUS + r":? GPU has fallen off the bus")
_ANNOUNCE_RE = re.compile(r"NVRM: GPU at " + _BUS + r": (?P<uuid>GPU-[0-9a-fA-F-]{36})")
_KMSG_RE = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<ts>\d+),[^;]*;(?P<msg>.*)$")

XID_FALLEN_OFF_BUS = 79


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    seq: int  # -1 for a plain line without a kmsg header
    timestamp_us: int
    message: str


@dataclass(frozen=True, slots=True)
class XidLine:
    pci_bus_id: str
    code: int
    pid: int | None
    process: str
    detail: str


@dataclass(frozen=True, slots=True)
class GpuAnnounce:
    pci_bus_id: str
    uuid: str


def parse_record(line: str) -> KmsgRecord:
    """Split a kmsg header off a line if it has one; a plain line is its own message."""
    line = line.rstrip("\n")
    match = _KMSG_RE.match(line)
    if match is None:
        return KmsgRecord(seq=-1, timestamp_us=-1, message=line)
    return KmsgRecord(int(match["seq"]), int(match["ts"]), match["msg"])


def is_driver_fault_line(message: str) -> bool:
    """A line the parser is expected to understand; one it then cannot parse is counted."""
    return "NVRM: Xid" in message or "fallen off the bus" in message


def parse_nvrm(message: str) -> XidLine | GpuAnnounce | None:
    """An XID (or bus drop, reported as XID 79) or a GPU announce line; None for anything else."""
    if (match := _XID_RE.search(message)) is not None:
        return _xid_line(match)
    if (match := _BUS_DROP_RE.search(message)) is not None:
        return XidLine(normalize_pci_bus_id(match["bus"]), XID_FALLEN_OFF_BUS, None, "", "GPU has fallen off the bus.")
    if (match := _ANNOUNCE_RE.search(message)) is not None:
        return GpuAnnounce(normalize_pci_bus_id(match["bus"]), match["uuid"])
    return None


def _xid_line(match: re.Match[str]) -> XidLine:
    rest = (match["rest"] or "").strip()
    pid: int | None = None
    process = ""
    if (pid_match := _PID_RE.match(rest)) is not None:
        raw_pid = pid_match["pid"]
        pid = int(raw_pid) if raw_pid.isdigit() else None
        process = (pid_match["name"] or "").strip().strip("'")
        if process == "<unknown>":
            process = ""
        rest = rest[pid_match.end() :]
    return XidLine(normalize_pci_bus_id(match["bus"]), int(match["code"]), pid, process, rest)
