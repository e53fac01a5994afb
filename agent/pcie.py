"""Which GPU an InfiniBand/RoCE port serves, from the PCIe topology in sysfs. Pure but for reading links.

A device's sysfs directory resolves to its place in the PCIe tree, e.g.
``/sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:00.0``: the bridges from the root port
down, then the device. An HCA serves the GPU it shares the most bridges with (the same PCIe switch,
as ``nvidia-smi topo -m`` shows PIX or PXB); one that shares none (the path crosses the host bridge
or the CPUs' interconnect) serves no GPU in particular.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

SYS_BUS_PCI = Path("/sys/bus/pci/devices")
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def pcie_path(device: Path) -> tuple[str, ...]:
    """The PCI addresses from the root port down to the device itself; () where it cannot be read."""
    try:
        resolved = device.resolve(strict=True)
    except OSError:
        return ()
    return tuple(p.lower() for p in resolved.parts if _PCI_ADDRESS.match(p.lower()))


def nearest_gpus(port_path: tuple[str, ...], gpus: Mapping[str, tuple[str, ...]]) -> list[str]:
    """The GPUs (by label) sharing the most bridges with the port's HCA; none if no bridge is shared."""
    above = port_path[:-1]
    shared: dict[str, int] = {}
    for label, path in gpus.items():
        n = 0
        for a, b in zip(above, path[:-1], strict=False):
            if a != b:
                break
            n += 1
        shared[label] = n
    best = max(shared.values(), default=0)
    return [label for label, n in shared.items() if n == best] if best else []


_BUS_ID = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})(?:\.(?P<fn>[0-7]))?$"
)


def sysfs_device(root: Path, bus_id: str) -> Path | None:
    """Where a device's sysfs entry is, from NVML's ``00000000:18:00.0`` or the kernel's ``0000:18:00``."""
    match = _BUS_ID.match(bus_id.strip())
    if match is None:
        return None
    domain = int(match["domain"] or "0", 16)
    return root / f"{domain:04x}:{match['bus'].lower()}:{match['dev'].lower()}.{match['fn'] or '0'}"
