"""A ``/sys/class/infiniband`` tree in the real mlx5 layout, for the InfiniBand collector's tests.

``<root>/<hca>/device`` links to a directory named by the HCA's PCI address, and
``<root>/<hca>/ports/<n>/`` holds ``state`` ("4: ACTIVE"), ``phys_state`` ("5: LinkUp"), ``rate``
("400 Gb/sec (4X NDR)"), ``link_layer`` and the ``counters/`` (and, for RoCE, ``hw_counters/``)
files, each a decimal number, as the mlx5 driver writes them.
"""

from __future__ import annotations

from pathlib import Path

IB_COUNTERS = (
    "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors", "local_link_integrity_errors",
    "excessive_buffer_overrun_errors", "port_xmit_discards", "port_rcv_data", "port_xmit_data",
)  # fmt: skip
ROCE_HW_COUNTERS = ("out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "roce_adp_retrans", "np_cnp_sent")


class IbSysfs:
    def __init__(self, base: Path) -> None:
        self.root = base / "class" / "infiniband"
        self.root.mkdir(parents=True, exist_ok=True)
        self._devices = base / "devices"

    def port_dir(self, hca: str, port: int) -> Path:
        return self.root / hca / "ports" / str(port)

    def add_port(
        self, hca: str, port: int = 1, bus: str = "0000:17:00.0", link_layer: str = "InfiniBand",
        rate: str = "400 Gb/sec (4X NDR)", bridges: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        """``bridges``: the PCIe bridges above the HCA, from the root port down (none: a flat tree)."""
        device = self._pci_dir(bus, bridges)
        device.mkdir(parents=True, exist_ok=True)
        (self.root / hca).mkdir(parents=True, exist_ok=True)
        if not (self.root / hca / "device").exists():
            (self.root / hca / "device").symlink_to(device)
        d = self.port_dir(hca, port)
        (d / "counters").mkdir(parents=True, exist_ok=True)
        (d / "link_layer").write_text(link_layer + "\n")
        self.set_rate(hca, port, rate)
        self.set_up(hca, port, True)
        for name in IB_COUNTERS:
            (d / "counters" / name).write_text("0\n")
        if link_layer == "Ethernet":
            (d / "hw_counters").mkdir(exist_ok=True)
            for name in ROCE_HW_COUNTERS:
                (d / "hw_counters" / name).write_text("0\n")

    def add_gpu(self, bus: str, bridges: tuple[str, ...]) -> None:
        """A GPU's place in the PCIe tree, linked from ``bus/pci/devices`` as the kernel does."""
        device = self._pci_dir(bus, bridges)
        device.mkdir(parents=True, exist_ok=True)
        link = self.root.parent.parent / "bus" / "pci" / "devices" / bus
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(device)

    def _pci_dir(self, bus: str, bridges: tuple[str, ...]) -> Path:
        if not bridges:
            return self._devices / bus
        return self._devices / f"pci{bridges[0][:7]}" / Path(*bridges) / bus

    def set_up(self, hca: str, port: int, up: bool) -> None:
        d = self.port_dir(hca, port)
        (d / "state").write_text("4: ACTIVE\n" if up else "1: DOWN\n")
        (d / "phys_state").write_text("5: LinkUp\n" if up else "2: Polling\n")

    def set_rate(self, hca: str, port: int, rate: str) -> None:
        (self.port_dir(hca, port) / "rate").write_text(rate + "\n")

    def bump(self, hca: str, port: int, counter: str, by: int) -> None:
        d = self.port_dir(hca, port)
        path = d / ("hw_counters" if counter in ROCE_HW_COUNTERS else "counters") / counter
        path.write_text(f"{int(path.read_text()) + by}\n")

    def reset(self, hca: str, port: int, counter: str) -> None:
        d = self.port_dir(hca, port)
        (d / ("hw_counters" if counter in ROCE_HW_COUNTERS else "counters") / counter).write_text("0\n")
