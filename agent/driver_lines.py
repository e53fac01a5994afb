"""Parsing of kernel-log lines that carry NVIDIA driver faults. Pure functions, no I/O.

Accepted input: ``/dev/kmsg`` records (``6,1234,5678901234,-;NVRM: Xid ...``) and plain lines as
``dmesg`` or journald print them (``[ 1234.5] NVRM: Xid ...``, ``kernel: NVRM: Xid ...``).
Driver formats seen in the field:

- R5xx: ``NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.``
- R525+: ``NVRM: Xid (PCI:0000:b7:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable ...``
- R3xx/R4xx: ``NVRM: Xid (0000:03:00): 13, 0003 00000000 0000a1c0 ...`` (no ``PCI:``, no pid)
- the bus drop without an Xid: ``NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.``
- the start-up line that maps a bus id to a UUID: ``NVRM: GPU at PCI:0000:3b:00: GPU-5b8d...``
- a MIG instance's: ``NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 94, pid=..., ...`` (the GPU's bus id, then
  the GPU instance; any code, 48 and 79 included, is the GPU's)
- a bus id redacted by a log shipper (``NVRM: Xid (PCI:...): 79, ...``): the node's, its GPU unknown
- the bus drop in its other forms: ``NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.``,
  ``NVRM: The NVIDIA GPU 0000:3b:00.0 (PCI ID: 10de:2330) installed in this system has fallen off
  the bus and is not responding to commands.``: XID 79, on the bus id the line names if it names one
- an NVSwitch error: ``nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress
  non-posted PRIV error (First)``; the driver follows it with lines of the same SXid that carry no
  severity (``..., Severity 0 Engine instance 32 ...``, ``..., Data {0x...}``): those add nothing.
  Some SXids carry no severity field at all (``..., 24007, SOE watchdog error``, ``SOE halted``,
  ``SOE external error``): the SXid catalog's severity where it names the code
  (``vigil_core.sxid``), else fatal when their text names the switch's management engine (SOE), a
  halt or a watchdog, since the switch cannot manage its links then; otherwise non-fatal

Any process with root can write to ``/dev/kmsg``, and a buggy driver can write anything, so every
number is read with a bounded pattern of ASCII digits and range-checked before it becomes an
``int``: a line the parser cannot use raises ``UnparsedLine`` with a reason, and the caller counts
it and moves on. No line can make the parser raise anything else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vigil_core.signals import normalize_pci_bus_id
from vigil_core.sxid import catalog_fatal

_BUS_ID = r"(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
_BUS = r"(?:PCI:)?" + _BUS_ID
_ANY_BUS_RE = re.compile(r"(?<![0-9a-fA-F])" + _BUS_ID + r"(?![0-9a-fA-F])")
_MIG_RE = re.compile(r"GPU-I:\s*(?P<gi>[0-9]{1,4})(?![0-9])")
# What stands between the parentheses: the bus id (maybe redacted), then a MIG instance, bounded.
_WHERE = r"\((?P<where>[^()\n]{0,96})\)"
# Digits are bounded so that no line can hand int() thousands of them; one digit past a bound makes
# the pattern fail, and the line is then reported as unparsed (code) or read without a header or pid.
_XID_RE = re.compile(r"NVRM: Xid " + _WHERE + r": (?P<code>[0-9]{1,24})(?![0-9])(?:,\s*(?P<rest>.*))?$", re.S)
_XID_LONG_CODE_RE = re.compile(r"NVRM: Xid " + _WHERE + r": [0-9]{25}")
_PID_RE = re.compile(r"^pid=(?P<pid>'<unknown>'|<unknown>|[0-9]{1,10}(?![0-9]))(?:,\s*name=(?P<name>[^,]*))?,?\s*")
_BUS_DROP = "fallen off the bus"
_DRIVER_RE = re.compile(r"NVRM|NVIDIA|\bnvidia\b")  # the driver's own words, not just anyone's
_ANNOUNCE_RE = re.compile(r"NVRM: GPU at " + _BUS + r": (?P<uuid>GPU-[0-9a-fA-F-]{36})")
_SXID_RE = re.compile(
    r"nvidia-nvswitch(?P<switch>[0-9]{1,4}): SXid " + _WHERE + r": (?P<code>[0-9]{1,10})(?![0-9]),\s*"
    r"(?:(?P<severity>Fatal|Non-fatal)(?:,\s*(?P<rest>.*))?|(?P<text>.*))$",
    re.S,
)
_SXID_MORE_RE = re.compile(r"nvidia-nvswitch[0-9]{1,4}: SXid " + _WHERE + r": [0-9]{1,10},\s*(?:Severity|Data)\b")
_SXID_GRAVE_RE = re.compile(r"\bSOE\b|halt|watchdog|fatal", re.I)
_KMSG_RE = re.compile(r"^(?P<prio>[0-9]{1,4}),(?P<seq>[0-9]{1,19}),(?P<ts>[0-9]{1,19}),[^;]*;(?P<msg>.*)$", re.S)

XID_FALLEN_OFF_BUS = 79
MAX_XID_CODE = 2**31 - 1  # NVIDIA's catalog ends near 200; beyond int32 is not a driver's number
MAX_PID = 2**22  # the kernel's pid_max limit
_INT64_MAX = 2**63 - 1


class UnparsedLine(ValueError):
    """A driver fault line that cannot be used; ``reason`` labels the agent's unparsed counter."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


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
class SxidLine:
    switch: int  # the N of nvidia-nvswitchN
    pci_bus_id: str  # the switch's
    code: int
    fatal: bool
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
    seq, ts = int(match["seq"]), int(match["ts"])
    if seq > _INT64_MAX or ts > _INT64_MAX:  # not a header the kernel wrote: keep the line whole
        return KmsgRecord(seq=-1, timestamp_us=-1, message=line)
    return KmsgRecord(seq, ts, match["msg"])


def is_driver_fault_line(message: str) -> bool:
    """A line the parser is expected to understand; one it then cannot parse is counted."""
    return "NVRM: Xid" in message or _BUS_DROP in message or "SXid" in message


def bus_of(where: str) -> str:
    """The PCI bus id in an Xid's or SXid's parentheses; "" when redacted or missing. Pure."""
    match = _ANY_BUS_RE.search(where)
    return normalize_pci_bus_id(match["bus"]) if match else ""


def parse_nvrm(message: str) -> XidLine | SxidLine | GpuAnnounce | None:
    """An XID (or bus drop, reported as XID 79), an NVSwitch SXid or a GPU announce line; None for a
    line that is not a driver fault's (or adds nothing to one). Raises ``UnparsedLine`` for a driver
    fault line it cannot use."""
    if (match := _XID_RE.search(message)) is not None:
        return _xid_line(match)
    if _SXID_MORE_RE.search(message) is not None:
        return None  # the same SXid's severity number or data words: its first line said it all
    if (match := _SXID_RE.search(message)) is not None:
        return _sxid_line(match)
    if _BUS_DROP in message and _DRIVER_RE.search(message) is not None:
        match = _ANY_BUS_RE.search(message)
        bus = normalize_pci_bus_id(match["bus"]) if match else ""
        return XidLine(bus, XID_FALLEN_OFF_BUS, None, "", "GPU has fallen off the bus.")
    if (match := _ANNOUNCE_RE.search(message)) is not None:
        return GpuAnnounce(normalize_pci_bus_id(match["bus"]), match["uuid"])
    if _XID_LONG_CODE_RE.search(message) is not None:
        raise UnparsedLine("out_of_range", "an XID code with more digits than any driver writes")
    if is_driver_fault_line(message):
        raise UnparsedLine("unrecognised", "a driver fault line in no format the parser knows")
    return None


def _sxid_line(match: re.Match[str]) -> SxidLine:
    code = int(match["code"])
    if code > MAX_XID_CODE:
        raise UnparsedLine("out_of_range", f"SXid code {match['code']} is beyond any driver's")
    if match["severity"] is not None:
        fatal, detail = match["severity"] == "Fatal", (match["rest"] or "").strip()
    else:  # no severity field: the catalog's, else what it names (the management engine, a halt, a watchdog)
        detail = (match["text"] or "").strip()
        known = catalog_fatal(code)
        fatal = known if known is not None else bool(_SXID_GRAVE_RE.search(detail)) or code // 1000 == 24
    return SxidLine(int(match["switch"]), bus_of(match["where"]), code, fatal, detail)


def _xid_line(match: re.Match[str]) -> XidLine:
    rest = (match["rest"] or "").strip()
    pid: int | None = None
    process = ""
    if (pid_match := _PID_RE.match(rest)) is not None:
        raw_pid = pid_match["pid"]
        pid = int(raw_pid) if raw_pid.isdigit() and int(raw_pid) <= MAX_PID else None
        process = (pid_match["name"] or "").strip().strip("'")
        if process == "<unknown>":
            process = ""
        rest = rest[pid_match.end() :]
    code = int(match["code"])
    if code > MAX_XID_CODE:
        raise UnparsedLine("out_of_range", f"XID code {match['code'][:24]} is beyond any driver's")
    if (mig := _MIG_RE.search(match["where"])) is not None:
        rest = f"[MIG GPU instance {int(mig['gi'])}] {rest}".strip()
    return XidLine(bus_of(match["where"]), code, pid, process, rest)
