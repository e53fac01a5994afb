"""Fault injection into the simulated GPU backend, for tests: the faults the collectors must notice,
written on the backend's ``set_faults`` and ``add_xid``."""

from __future__ import annotations

import threading

from gpus.backend import GpuBackend
from gpus.simulated import SimulatedBackend


class GpuFaults:
    def __init__(self, backend: GpuBackend | SimulatedBackend) -> None:
        assert isinstance(backend, SimulatedBackend), f"fault injection needs the simulated backend, not {backend!r}"
        self._backend = backend

    def xid(self, index: int, code: int, message: str = "") -> None:
        self._backend.add_xid(index, code, message)

    def ecc_dbe(self, index: int, count: int = 1) -> None:
        self._backend.set_faults(index, ecc_dbe=self._backend.faults(index).ecc_dbe + count)

    def row_remap(self, index: int, *, pending: bool = False, failure: bool = False) -> None:
        self._backend.set_faults(index, remap_pending=pending, remap_failure=failure)

    def throttle(self, index: int, reasons: int) -> None:
        self._backend.set_faults(index, throttle_reasons=reasons)

    def gpu_lost(self, index: int) -> None:
        self._backend.set_faults(index, lost=True)

    def nvlink_errors(self, index: int, count: int) -> None:
        self._backend.set_faults(index, nvlink_crc=self._backend.faults(index).nvlink_crc + count)

    def fabric_failed(self, index: int) -> None:
        """The GPU's NVLink fabric registration completes with an error (it is cut off its peers)."""
        self._backend.set_faults(index, fabric_failed=True)

    def hang(self, index: int) -> None:
        """Reads of this GPU block (as NVML does under a wedged driver) until ``release_hangs``."""
        self._backend.set_faults(index, hang=threading.Event())
