"""A simulated GPU backend for the demo and tests: N GPUs with real-looking PCI bus ids and UUIDs,
and fault injection for the faults the collectors must notice.

It is a named backend (``gpu_backend: simulated``), not a stand-in for testing the NVML code.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, replace

from gpus.backend import NVLINK_COUNTERS, GpuReading, XidEvent
from vigil_core.signals import GpuRef

# Bus ids of the eight GPUs of an HGX H100 board, as `nvidia-smi` shows them on DGX H100.
_HGX_BUS_IDS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
_UUID_NAMESPACE = uuid.UUID("6f1d3b52-6a39-4c55-9a0e-8c51a7c43a10")


def simulated_gpus(node: str, count: int) -> list[GpuRef]:
    """The GPUs a simulated node has: deterministic, so a test or the demo can name them."""
    gpus = []
    for index in range(count):
        bus = _HGX_BUS_IDS[index % 8]
        domain = index // 8
        uid = uuid.uuid5(_UUID_NAMESPACE, f"{node}/{index}")
        gpus.append(GpuRef(index=index, uuid=f"GPU-{uid}", pci_bus_id=f"{domain:04x}:{bus}:00"))
    return gpus


@dataclass
class _GpuFaults:
    lost: bool = False
    ecc_dbe: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    throttle_reasons: int = 0
    nvlink_crc: int = 0
    pcie_replays: int = 0
    pcie_width: int = 16
    hang: threading.Event | None = None  # set: reads of this GPU block until it is cleared


class SimulatedBackend:
    name = "simulated"

    def __init__(self, node: str, gpu_count: int = 8, clock: object = time.time) -> None:
        if gpu_count < 1:
            raise ValueError("a simulated node needs at least one GPU")
        self._gpus = simulated_gpus(node, gpu_count)
        self._faults = [_GpuFaults() for _ in self._gpus]
        self._events: list[XidEvent] = []
        self._lock = threading.Lock()
        self._clock = clock

    def gpus(self) -> list[GpuRef]:
        return list(self._gpus)

    def read(self, index: int) -> GpuReading:
        gpu = self._gpus[index]
        with self._lock:
            faults = replace(self._faults[index])
        if faults.hang is not None:
            faults.hang.wait()  # a wedged driver: the call does not come back
        if faults.lost:
            return GpuReading(gpu=gpu, lost=True, lost_reason="simulated: GPU is lost")
        return GpuReading(
            gpu=gpu,
            name="NVIDIA H100 80GB HBM3 (simulated)",
            temperature_c=34.0 + index,
            power_w=72.0,
            sm_clock_mhz=1980.0,
            memory_clock_mhz=2619.0,
            utilization_pct=0.0,
            memory_used_bytes=0,
            memory_total_bytes=81559 << 20,
            ecc_volatile_corrected=0,
            ecc_volatile_uncorrected=faults.ecc_dbe,
            ecc_aggregate_corrected=0,
            ecc_aggregate_uncorrected=faults.ecc_dbe,
            retired_pages_sbe=None,  # H100 remaps rows instead of retiring pages
            retired_pages_dbe=None,
            retired_pages_pending=None,
            remapped_rows_corrected=0,
            remapped_rows_uncorrected=1 if faults.remap_pending or faults.remap_failure else 0,
            remap_pending=faults.remap_pending,
            remap_failure=faults.remap_failure,
            throttle_reasons=faults.throttle_reasons,
            throttle_ns=None,
            nvlink_errors={
                (link, c): (faults.nvlink_crc if c == "crc_flit" and link == 0 else 0)
                for link in range(18)
                for c in NVLINK_COUNTERS
            },
            nvlink_links_down=(),
            pcie_replays=faults.pcie_replays,
            pcie_generation=5,
            pcie_generation_max=5,
            pcie_width=faults.pcie_width,
            pcie_width_max=16,
        )

    def drain_xid_events(self) -> list[XidEvent]:
        with self._lock:
            events, self._events = self._events, []
        return events

    def events_progress(self) -> float | None:
        return None  # events are injected, not waited for: there is no listener to wedge

    def close(self) -> None:
        self.release_hangs()

    # Fault injection -----------------------------------------------------------------------

    def inject_xid(self, index: int, code: int, message: str = "") -> None:
        now = self._clock()  # type: ignore[operator]
        with self._lock:
            self._events.append(XidEvent(self._gpus[index], code, now, message))

    def inject_ecc_dbe(self, index: int, count: int = 1) -> None:
        with self._lock:
            self._faults[index].ecc_dbe += count

    def inject_row_remap(self, index: int, *, pending: bool = False, failure: bool = False) -> None:
        with self._lock:
            self._faults[index].remap_pending = pending
            self._faults[index].remap_failure = failure

    def inject_throttle(self, index: int, reasons: int) -> None:
        with self._lock:
            self._faults[index].throttle_reasons = reasons

    def inject_gpu_lost(self, index: int) -> None:
        with self._lock:
            self._faults[index].lost = True

    def inject_nvlink_errors(self, index: int, count: int) -> None:
        with self._lock:
            self._faults[index].nvlink_crc += count

    def inject_pcie_replays(self, index: int, count: int) -> None:
        with self._lock:
            self._faults[index].pcie_replays += count

    def inject_pcie_width(self, index: int, width: int) -> None:
        with self._lock:
            self._faults[index].pcie_width = width

    def inject_hang(self, index: int) -> None:
        """Reads of this GPU block (as NVML does under a wedged driver) until ``release_hangs``."""
        with self._lock:
            self._faults[index].hang = threading.Event()

    def release_hangs(self) -> None:
        with self._lock:
            for faults in self._faults:
                if faults.hang is not None:
                    faults.hang.set()
                    faults.hang = None
