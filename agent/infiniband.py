"""InfiniBand and RoCE port health, read from sysfs (``/sys/class/infiniband/<hca>/ports/<n>/``).

Large runs die of the network as often as of GPUs: an InfiniBand port that stays down longer than
the transport timeout (about 7 s) fails every collective through it, long before the framework's
10-minute watchdog notices. Per port, each poll:

- **down time**: a port that is not ``ACTIVE``/``LinkUp`` is timed. Down past
  ``transport_timeout_s`` it is a fault (IB_PORT_DOWN, once per outage, its value the seconds so
  far); a port back up sooner was a flap (IB_PORT_FLAP, its value the seconds it was down), a
  warning that the policy pages on when it repeats. Cumulative down time is kept per port.
- **degraded link**: a rate below the most this port has run at since the agent started, or a
  width below 4X (IB_PORT_DEGRADED, once per degradation);
- **error counters** (``counters/*``, RoCE's ``hw_counters/*``): a counter that grew by more than
  its configured number within the last minute (a sliding window, so one error between two polls
  a tenth of a second apart is one error, not 600 a minute): IB_PORT_ERRORS, the counter and its
  growth in the message, at most once a minute per counter. A counter that goes back (a reset)
  starts a new window.

The root is injectable: tests use fixture trees in the real mlx5 layout (``tests/fakes/ib_sysfs``).
Files that are missing or unreadable are skipped: a port without ``hw_counters`` is an InfiniBand
port, not a broken one. Signals name the port in their message ("mlx5_0 port 1: ...") and carry the
HCA's PCI address; their code is the port number.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent.pcie import pcie_path
from vigil_core.signals import GpuRef, Signal, SignalKind, normalize_pci_bus_id

SYSFS_ROOT = Path("/sys/class/infiniband")
# Counters worth a signal when they grow faster than this many per minute; the rest are only shown.
DEFAULT_ERROR_RATES: dict[str, float] = {
    "symbol_error": 10.0,
    "link_error_recovery": 1.0,
    "link_downed": 1.0,
    "port_rcv_errors": 10.0,
    "local_link_integrity_errors": 1.0,
    "excessive_buffer_overrun_errors": 1.0,
    "port_xmit_discards": 100.0,
    # RoCE (hw_counters): retransmissions and congestion
    "out_of_sequence": 100.0,
    "packet_seq_err": 100.0,
    "local_ack_timeout_err": 10.0,
    "roce_adp_retrans": 100.0,
    "np_cnp_sent": 10_000.0,
}
_RATE_RE = re.compile(
    r"^(?P<gbps>[0-9]{1,5}(?:\.[0-9]{1,3})?) Gb/sec(?: \((?P<width>[0-9]{1,2})X(?: (?P<speed>\w+))?\))?"
)
_WIDTH_FULL = 4


@dataclass(frozen=True)
class PortReading:
    hca: str
    port: int
    pci_bus_id: str  # the HCA's
    state: str  # "ACTIVE", "DOWN", "INIT", ...
    phys_state: str  # "LinkUp", "Polling", "Disabled", ...
    rate_gbps: float
    width: int  # lanes (4 for 4X); 0 when not said
    link_layer: str  # "InfiniBand" or "Ethernet" (RoCE)
    counters: Mapping[str, int] = field(default_factory=dict)
    pcie_path: tuple[str, ...] = ()  # the HCA's place in the PCIe tree (``agent.pcie``)

    @property
    def name(self) -> str:
        return f"{self.hca} port {self.port}"

    @property
    def up(self) -> bool:
        return self.state == "ACTIVE" and self.phys_state == "LinkUp"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return ""


def _after_colon(text: str) -> str:
    """sysfs says "4: ACTIVE" and "5: LinkUp": the name after the number."""
    return text.partition(":")[2].strip() if ":" in text else text


def _counters(directory: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        files = sorted(directory.iterdir())
    except OSError:
        return out
    for f in files[:256]:
        raw = _read(f)
        if raw.isdigit() and len(raw) <= 20:
            out[f.name] = int(raw)
    return out


def read_ports(root: Path = SYSFS_ROOT) -> list[PortReading]:
    """Every port of every HCA under ``root``; an empty list where there is no InfiniBand."""
    readings: list[PortReading] = []
    try:
        hcas = sorted(p for p in root.iterdir() if (p / "ports").is_dir())
    except OSError:
        return readings
    for hca in hcas[:64]:
        path = pcie_path(hca / "device")
        bus = normalize_pci_bus_id(path[-1]) if path else ""
        for port_dir in sorted((hca / "ports").iterdir())[:16]:
            if not port_dir.name.isdigit():
                continue
            rate = _RATE_RE.match(_read(port_dir / "rate"))
            readings.append(
                PortReading(
                    hca=hca.name[:64],
                    port=int(port_dir.name),
                    pci_bus_id=bus,
                    state=_after_colon(_read(port_dir / "state"))[:32],
                    phys_state=_after_colon(_read(port_dir / "phys_state"))[:32],
                    rate_gbps=float(rate["gbps"]) if rate else 0.0,
                    width=int(rate["width"]) if rate and rate["width"] else 0,
                    link_layer=_read(port_dir / "link_layer")[:32],
                    counters=_counters(port_dir / "counters") | _counters(port_dir / "hw_counters"),
                    pcie_path=path,
                )
            )
    return readings


WINDOW_S = 60.0


@dataclass
class _Port:
    down_since: float | None = None
    down_reported: bool = False
    down_total_s: float = 0.0  # cumulative, across outages
    max_rate_gbps: float = 0.0
    degraded_reported: bool = False
    history: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # counter -> the last minute
    reported_at: dict[str, float] = field(default_factory=dict)  # counter -> its last signal


class PortWatch:
    """What the ports' readings mean between polls (pure: readings and times in, signals out)."""

    def __init__(
        self,
        node: str,
        transport_timeout_s: float = 7.0,
        error_rates: Mapping[str, float] | None = None,
    ) -> None:
        self.node = node
        self.transport_timeout_s = transport_timeout_s
        self.error_rates = dict(DEFAULT_ERROR_RATES if error_rates is None else error_rates)
        self._ports: dict[tuple[str, int], _Port] = {}

    def down_total_s(self, hca: str, port: int, now: float) -> float:
        p = self._ports.get((hca, port))
        if p is None:
            return 0.0
        return p.down_total_s + (now - p.down_since if p.down_since is not None else 0.0)

    def observe(self, readings: list[PortReading], now: float) -> list[Signal]:
        signals: list[Signal] = []
        for r in readings:
            p = self._ports.setdefault((r.hca, r.port), _Port())
            signals += self._link(r, p, now)
            signals += self._rate(r, p, now)
            signals += self._errors(r, p, now)
        return signals

    def _signal(self, r: PortReading, kind: SignalKind, what: str, now: float, value: float = 0.0) -> Signal:
        return Signal(
            node=self.node,
            kind=kind,
            gpu=GpuRef(pci_bus_id=r.pci_bus_id),
            code=r.port,
            value=value,
            message=f"{r.name}: {what}"[:1000],
            source="infiniband",
            observed_at=now,
        )

    def _link(self, r: PortReading, p: _Port, now: float) -> list[Signal]:
        if not r.up:
            if p.down_since is None:
                p.down_since, p.down_reported = now, False
            down_s = now - p.down_since
            if down_s >= self.transport_timeout_s and not p.down_reported:
                p.down_reported = True
                what = (
                    f"{r.link_layer or 'link'} down {down_s:.1f} s (state {r.state or '?'}, {r.phys_state or '?'}), "
                    f"past the {self.transport_timeout_s:g} s transport timeout: collectives through it failed"
                )
                return [self._signal(r, SignalKind.IB_PORT_DOWN, what, now, down_s)]
            return []
        if p.down_since is None:
            return []
        down_s = now - p.down_since
        p.down_total_s += down_s
        was_reported, p.down_since, p.down_reported = p.down_reported, None, False
        if was_reported:
            return []  # the outage is already a fault; its coming back is in the readings
        what = f"flapped: down {down_s:.1f} s, under the {self.transport_timeout_s:g} s transport timeout"
        return [self._signal(r, SignalKind.IB_PORT_FLAP, what, now, down_s)]

    def _rate(self, r: PortReading, p: _Port, now: float) -> list[Signal]:
        if not r.up or r.rate_gbps <= 0:
            return []
        p.max_rate_gbps = max(p.max_rate_gbps, r.rate_gbps)
        narrow = 0 < r.width < _WIDTH_FULL
        slow = r.rate_gbps < p.max_rate_gbps
        if not (narrow or slow):
            p.degraded_reported = False
            return []
        if p.degraded_reported:
            return []
        p.degraded_reported = True
        what = f"link degraded: {r.rate_gbps:g} Gb/s" + (f" on {r.width}X" if r.width else "")
        what += f" (it ran at {p.max_rate_gbps:g} Gb/s)" if slow else f" (fewer than {_WIDTH_FULL} lanes)"
        return [self._signal(r, SignalKind.IB_PORT_DEGRADED, what, now, r.rate_gbps)]

    def _errors(self, r: PortReading, p: _Port, now: float) -> list[Signal]:
        signals = []
        for name, limit in sorted(self.error_rates.items()):
            if name not in r.counters:
                continue  # not on this port
            value = r.counters[name]
            history = p.history.setdefault(name, [])
            if history and value < history[-1][1]:
                history.clear()  # the counter went back (reset): a new window
            history.append((now, value))
            while len(history) > 1 and history[0][0] < now - WINDOW_S:
                history.pop(0)
            since, base = history[0]
            grown = value - base
            if grown <= limit or now - p.reported_at.get(name, float("-inf")) < WINDOW_S:
                continue
            p.reported_at[name] = now
            what = f"{name} grew by {grown} in {now - since:.0f} s (more than {limit:g} a minute)"
            signals.append(self._signal(r, SignalKind.IB_PORT_ERRORS, what, now, float(grown)))
        return signals
