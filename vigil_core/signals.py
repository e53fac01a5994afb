"""The domain types that cross from agent to controller: GPUs and the signals observed on them."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import StrEnum

from vigil_core.sxid import sxid_meaning


class SignalKind(StrEnum):
    XID = "XID"
    ECC_DBE = "ECC_DBE"
    ROW_REMAP_PENDING = "ROW_REMAP_PENDING"
    ROW_REMAP_FAILURE = "ROW_REMAP_FAILURE"
    RETIRED_PAGES = "RETIRED_PAGES"
    THROTTLE = "THROTTLE"
    GPU_LOST = "GPU_LOST"
    NVLINK_ERRORS = "NVLINK_ERRORS"
    PCIE_REPLAY = "PCIE_REPLAY"
    PCIE_LINK_DEGRADED = "PCIE_LINK_DEGRADED"
    COLLECTOR_HUNG = "COLLECTOR_HUNG"
    CHECK_FAILED = "CHECK_FAILED"
    HOST_MEMORY_PRESSURE = "HOST_MEMORY_PRESSURE"
    DISK_FULL = "DISK_FULL"
    NIC_ERRORS = "NIC_ERRORS"
    SPOOL_LOST = "SPOOL_LOST"
    SXID_FATAL = "SXID_FATAL"  # an NVSwitch error the driver calls Fatal (code: the SXid)
    SXID_NONFATAL = "SXID_NONFATAL"
    IB_PORT_DOWN = "IB_PORT_DOWN"  # an InfiniBand/RoCE port down past the transport timeout
    IB_PORT_FLAP = "IB_PORT_FLAP"
    IB_PORT_DEGRADED = "IB_PORT_DEGRADED"
    IB_PORT_ERRORS = "IB_PORT_ERRORS"
    GPU_FABRIC_FAILED = "GPU_FABRIC_FAILED"  # the GPU did not join its NVLink fabric (NVSwitch systems)
    SCHEDULER_DRAIN = "SCHEDULER_DRAIN"  # drained in Slurm by someone else (the controller reads Slurm)


# Signals an agent may drop first when its spool is full: measurements of degradation, not faults.
LOW_SEVERITY_KINDS = frozenset(
    {
        SignalKind.THROTTLE,
        SignalKind.PCIE_REPLAY,
        SignalKind.NVLINK_ERRORS,
        SignalKind.NIC_ERRORS,
        SignalKind.IB_PORT_ERRORS,
        SignalKind.IB_PORT_FLAP,
    }
)
IB_KINDS = frozenset(
    {SignalKind.IB_PORT_DOWN, SignalKind.IB_PORT_FLAP, SignalKind.IB_PORT_DEGRADED, SignalKind.IB_PORT_ERRORS}
)

# XIDs whose default rule takes the node out of service (NVIDIA's catalog: a reset, a reboot, a service
# call...; and XID 154, by the recovery action it names). The agent's spool never drops these to keep
# its bound: they are the root cause a flood of follow-up errors would bury. tests/unit/test_xid_catalog.py
# holds this to the default policy.
QUARANTINE_XIDS = frozenset(
    {
        1,
        2,
        3,
        4,
        5,
        6,
        7,
        9,
        10,
        12,
        15,
        16,
        17,
        18,
        19,
        20,
        21,
        22,
        23,
        24,
        26,
        27,
        28,
        29,
        30,
        33,
        34,
        35,
        36,
        42,
        46,
        47,
        48,
        49,
        50,
        51,
        52,
        53,
        54,
        55,
        56,
        57,
        58,
        59,
        61,
        62,
        64,
        65,
        73,
        74,
        78,
        79,
        81,
        87,
        90,
        91,
        95,
        108,
        109,
        110,
        111,
        112,
        113,
        114,
        115,
        116,
        117,
        118,
        119,
        120,
        122,
        123,
        124,
        125,
        136,
        138,
        140,
        142,
        143,
        144,
        145,
        146,
        147,
        148,
        149,
        150,
        151,
        154,
        155,
        156,
        158,
        160,
        162,
    }
)
# Other kinds that are faults by themselves (the default policy quarantines on them).
QUARANTINE_KINDS = frozenset(
    {
        SignalKind.ECC_DBE,
        SignalKind.ROW_REMAP_PENDING,
        SignalKind.ROW_REMAP_FAILURE,
        SignalKind.GPU_LOST,
        SignalKind.SXID_FATAL,
        SignalKind.IB_PORT_DOWN,
        SignalKind.GPU_FABRIC_FAILED,
    }
)
# Kinds that report a state (stuck, recovered) rather than an event: order matters, so they are
# never folded or merged with their repeats.
STATE_KINDS = frozenset({SignalKind.COLLECTOR_HUNG})


# NVML clock-event (throttle) reason bits, as nvmlClocksEventReason* defines them.
THROTTLE_GPU_IDLE = 0x1
THROTTLE_APPLICATIONS_CLOCKS = 0x2
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SYNC_BOOST = 0x10
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80
# Reasons that mean the hardware is slowing the GPU down; idle and the software power cap are normal.
THROTTLE_HARMFUL_MASK = THROTTLE_HW_SLOWDOWN | THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL | THROTTLE_HW_POWER_BRAKE

_THROTTLE_NAMES = {
    THROTTLE_GPU_IDLE: "idle",
    THROTTLE_APPLICATIONS_CLOCKS: "applications clocks",
    THROTTLE_SW_POWER_CAP: "software power cap",
    THROTTLE_HW_SLOWDOWN: "hardware slowdown",
    THROTTLE_SYNC_BOOST: "sync boost",
    THROTTLE_SW_THERMAL: "software thermal",
    THROTTLE_HW_THERMAL: "hardware thermal",
    THROTTLE_HW_POWER_BRAKE: "power brake",
}


def throttle_reason_names(bits: int) -> str:
    """``0x48`` -> ``"hardware slowdown + hardware thermal"``; unknown bits are shown in hex."""
    names = [name for bit, name in _THROTTLE_NAMES.items() if bits & bit]
    unknown = bits & ~sum(_THROTTLE_NAMES)
    if unknown:
        names.append(f"0x{unknown:x}")
    return " + ".join(names) or "none"


_PCI_RE = re.compile(
    r"^(?:PCI:)?(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})"
    r"(?:\.[0-7])?$"
)


def normalize_pci_bus_id(raw: str) -> str:
    """One spelling for a PCI bus id: the kernel's ``0000:3b:00`` and NVML's ``00000000:3B:00.0``
    both become ``0000:3b:00``. Raises ValueError for anything that is not a bus id."""
    match = _PCI_RE.match(raw.strip())
    if match is None:
        raise ValueError(f"not a PCI bus id: {raw!r}")
    domain = int(match["domain"] or "0", 16)
    return f"{domain:04x}:{match['bus'].lower()}:{match['dev'].lower()}"


@dataclass(frozen=True, slots=True)
class GpuRef:
    """A GPU of a node; ``index == -1`` when an observation is about the node, not one GPU."""

    index: int = -1
    uuid: str = ""
    pci_bus_id: str = ""

    @property
    def key(self) -> str:
        """A stable name for per-GPU counting: the UUID when known, else bus id, else index."""
        return self.uuid or self.pci_bus_id or (f"gpu{self.index}" if self.index >= 0 else "node")

    def describe(self) -> str:
        if self.index < 0 and not self.pci_bus_id:
            return "node"
        parts = [f"GPU {self.index}" if self.index >= 0 else "GPU ?"]
        if self.pci_bus_id:
            parts.append(f"PCI {self.pci_bus_id}")
        return ", ".join(parts)


NODE = GpuRef()


@dataclass(frozen=True, slots=True)
class Signal:
    """One observation on a node. ``seq`` is 0 until the agent's spool numbers it."""

    node: str
    kind: SignalKind
    gpu: GpuRef = NODE
    code: int = 0
    value: float = 0.0
    message: str = ""
    source: str = ""
    observed_at: float = 0.0
    seq: int = 0
    # A storm folded at the agent: this signal stands for ``count`` observations of the same GPU,
    # kind and code, the first at ``first_observed_at`` (0: only one, at ``observed_at``).
    count: int = 1
    first_observed_at: float = 0.0

    def numbered(self, seq: int) -> Signal:
        return replace(self, seq=seq)

    @property
    def fold_key(self) -> tuple[str, str, int]:
        """Repeats of one fault: the same GPU, kind and code."""
        return (self.gpu.key, self.kind.value, self.code)

    @property
    def must_keep(self) -> bool:
        """A fault the default policy quarantines on: never dropped to keep a bound."""
        if self.kind is SignalKind.XID:
            return self.code in QUARANTINE_XIDS
        return self.kind in QUARANTINE_KINDS or self.kind is SignalKind.SPOOL_LOST

    def describe(self) -> str:
        if self.kind in (SignalKind.SXID_FATAL, SignalKind.SXID_NONFATAL):
            severity = "fatal" if self.kind is SignalKind.SXID_FATAL else "non-fatal"
            where = f"{self.node} NVSwitch at PCI {self.gpu.pci_bus_id or '?'}"
            return f"SXid {self.code} ({severity}: {sxid_meaning(self.code or 0)}) on {where}"
        if self.kind in IB_KINDS:  # the message starts with the port: "mlx5_0 port 1: ..."
            return f"{self.kind.value} on {self.node} {self.message.partition(':')[0][:80]}"
        what = f"XID {self.code}" if self.kind is SignalKind.XID else self.kind.value
        return f"{what} on {self.node} {self.gpu.describe()}"
