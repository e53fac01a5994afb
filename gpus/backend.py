"""The GPU backend interface that collectors read through.

A backend answers three questions: which GPUs are there, what does one read now, and which XID
events arrived since the last call. ``None`` in a reading means "not available on this GPU",
never zero: a field the hardware cannot report must not look healthy.

Two backends implement it: ``nvml`` (production, ``gpus.nvml_backend``) and ``simulated`` (the
demo and the tests, with fault injection). tests/contract/test_gpu_backends.py holds both to the
same contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from vigil_core.signals import GpuRef

# NVLink error counters, by the names NVML gives them (nvmlNvLinkErrorCounter_t).
NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")


@dataclass(frozen=True, slots=True)
class GpuReading:
    gpu: GpuRef
    lost: bool = False
    lost_reason: str = ""
    name: str | None = None
    # For /metrics.
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None
    utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    # ECC error counts: volatile since the driver loaded, aggregate over the GPU's life.
    ecc_volatile_corrected: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    # Page retirement (pre-Ampere) and row remapping (Ampere and later).
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_corrected: int | None = None
    remapped_rows_uncorrected: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    # Clock-event (throttle) reasons: the bitmask now, and the driver's cumulative time per reason
    # bit in nanoseconds where the driver counts it.
    throttle_reasons: int | None = None
    throttle_ns: Mapping[int, int] | None = None
    # Interconnect: (link, counter) -> count for each NVLink that is up; links that went down.
    nvlink_errors: Mapping[tuple[int, str], int] | None = None
    nvlink_links_down: tuple[int, ...] | None = None
    pcie_replays: int | None = None
    pcie_generation: int | None = None
    pcie_generation_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    # NVLink fabric (NVSwitch systems, Hopper and later): NVML's registration state, and its status
    # once completed (0: joined). None where the GPU has no fabric or the driver does not say.
    fabric_state: int | None = None
    fabric_status: int | None = None
    # The driver's GPU recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 0 none, 1 GPU reset, 2 node
    # reboot, 3 drain P2P, 4 drain and reset, 5 recover IMEX domain, 6 bus reset, 7 system reboot);
    # None where the driver does not report it.
    recovery_action: int | None = None


@dataclass(frozen=True, slots=True)
class XidEvent:
    gpu: GpuRef
    code: int
    observed_at: float
    message: str = ""


class BackendUnavailable(RuntimeError):
    """The backend cannot start on this machine (no driver, no library); the text says why."""


class GpuBackend(Protocol):
    name: str

    def gpus(self) -> list[GpuRef]: ...

    def read(self, index: int) -> GpuReading: ...

    def drain_xid_events(self) -> list[XidEvent]: ...

    def events_progress(self) -> float | None:
        """``time.monotonic()`` when the XID event listener last came back from a wait, or None
        when the backend has no listener thread. The watchdog uses it to find a wedged listener."""
        ...

    def close(self) -> None: ...


FABRIC_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED


def fabric_failure(reading: GpuReading) -> int:
    """NVML's failing status of a fabric registration that completed without joining; 0 when none."""
    if reading.fabric_state == FABRIC_COMPLETED and reading.fabric_status:
        return reading.fabric_status
    return 0
