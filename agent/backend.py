"""The GPU backend interface that collectors read through.

A backend answers three questions: which GPUs are there, what does one read now, and which XID
events arrived since the last call. ``None`` in a reading means "not available on this GPU",
never zero: a field the hardware cannot report must not look healthy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from vigil.signals import GpuRef


@dataclass(frozen=True, slots=True)
class GpuReading:
    gpu: GpuRef
    lost: bool = False
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    ecc_dbe_volatile: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    throttle_reasons: int | None = None


@dataclass(frozen=True, slots=True)
class XidEvent:
    gpu: GpuRef
    code: int
    observed_at: float
    message: str = ""


class GpuBackend(Protocol):
    name: str

    def gpus(self) -> list[GpuRef]: ...

    def read(self, index: int) -> GpuReading: ...

    def drain_xid_events(self) -> list[XidEvent]: ...
