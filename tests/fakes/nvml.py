"""A hand-written fake of the NVML library (the ``pynvml`` module) for the NVML backend's tests.

It keeps the real module's error classes and constants (nvidia-ml-py imports without a driver)
and replaces the calls with per-GPU state that tests change: faults, unsupported calls, a lost
GPU, a call that hangs as under a wedged driver, and XID events for ``nvmlEventSetWait``.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

NOT_SUPPORTED, GPU_IS_LOST, TIMEOUT = 3, 15, 10


@dataclass
class FakeGpu:
    uuid: str
    bus_id: str  # as NVML spells it: "00000000:18:00.0"
    name: str = "NVIDIA H100 80GB HBM3"
    temperature: int = 40
    power_mw: int = 120_000
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)  # (error type, counter type) -> n
    remap: tuple[int, int, int, int] = (0, 0, 0, 0)
    reasons: int = 0x1
    throttle_ns: dict[int, int] = field(default_factory=lambda: {74: 5_000_000_000, 270: 0})
    nvlinks: dict[int, int] = field(default_factory=lambda: dict.fromkeys(range(18), 1))  # link -> state
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)
    pcie: tuple[int, int, int, int] = (5, 5, 16, 16)  # gen, max gen, width, max width
    replays: int = 0
    fabric: tuple[int, int] = (0, 0)  # NVML fabric (state, status); state 0: not supported
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    hang: threading.Event | None = None


class FakeNvml:
    NVMLError = pynvml.NVMLError
    c_nvmlGpuFabricInfo_t = pynvml.c_nvmlGpuFabricInfo_t
    NVML_NVLINK_MAX_LINKS = 18
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.events: queue.Queue[tuple[int, int]] = queue.Queue()
        self.calls = 0
        self.shutdown = False

    # Library ------------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.124.06"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimpleNamespace:
        if self.gpus[index].lost:
            raise pynvml.NVMLError(GPU_IS_LOST)
        return SimpleNamespace(value=0x7F0000 + index, index=index)

    def _gpu(self, handle: SimpleNamespace, call: str) -> FakeGpu:
        self.calls += 1
        gpu = self.gpus[handle.index]
        if gpu.hang is not None:
            gpu.hang.wait()
        if gpu.lost:
            raise pynvml.NVMLError(GPU_IS_LOST)
        if call in gpu.unsupported:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return gpu

    # Device queries -----------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return self._gpu(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetPciInfo(self, h: Any) -> SimpleNamespace:
        return SimpleNamespace(busId=self._gpu(h, "nvmlDeviceGetPciInfo").bus_id.encode())

    def nvmlDeviceGetName(self, h: Any) -> str:
        return self._gpu(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return self._gpu(h, "nvmlDeviceGetTemperature").temperature

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetClockInfo(self, h: Any, clock: int) -> int:
        self._gpu(h, "nvmlDeviceGetClockInfo")
        return 1980 if clock == 1 else 2619

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> SimpleNamespace:
        self._gpu(h, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> SimpleNamespace:
        self._gpu(h, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(used=10 << 30, total=80 << 30, free=70 << 30)

    def nvmlDeviceGetTotalEccErrors(self, h: Any, error_type: int, counter_type: int) -> int:
        return self._gpu(h, "nvmlDeviceGetTotalEccErrors").ecc.get((error_type, counter_type), 0)

    def nvmlDeviceGetRetiredPages(self, h: Any, cause: int) -> list[int]:
        self._gpu(h, "nvmlDeviceGetRetiredPages")
        return []

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Any) -> int:
        self._gpu(h, "nvmlDeviceGetRetiredPagesPendingStatus")
        return 0

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:
        return self._gpu(h, "nvmlDeviceGetRemappedRows").remap

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrentClocksEventReasons").reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrentClocksThrottleReasons").reasons

    def nvmlDeviceGetFieldValues(self, h: Any, field_ids: list[int]) -> list[SimpleNamespace]:
        gpu = self._gpu(h, "nvmlDeviceGetFieldValues")
        return [
            SimpleNamespace(
                fieldId=f,
                nvmlReturn=0 if f in gpu.throttle_ns else NOT_SUPPORTED,
                value=SimpleNamespace(ullVal=gpu.throttle_ns.get(f, 0)),
            )
            for f in field_ids
        ]

    def nvmlDeviceGetNvLinkState(self, h: Any, link: int) -> int:
        gpu = self._gpu(h, "nvmlDeviceGetNvLinkState")
        if link not in gpu.nvlinks:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return gpu.nvlinks[link]

    def nvmlDeviceGetNvLinkErrorCounter(self, h: Any, link: int, counter: int) -> int:
        return self._gpu(h, "nvmlDeviceGetNvLinkErrorCounter").nvlink_errors.get((link, counter), 0)

    def nvmlDeviceGetPcieReplayCounter(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetPcieReplayCounter").replays

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkGeneration").pcie[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkGeneration").pcie[1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkWidth").pcie[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkWidth").pcie[3]

    def nvmlDeviceGetGpuFabricInfo(self, h: Any, info: Any) -> int:
        """As pynvml's: fills the structure passed by reference."""
        state, status = self._gpu(h, "nvmlDeviceGetGpuFabricInfo").fabric
        info._obj.state, info._obj.status = state, status
        return 0

    # Events -------------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, h: Any, types: int, event_set: object) -> None:
        self._gpu(h, "nvmlDeviceRegisterEvents")

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        try:
            index, xid = self.events.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise pynvml.NVMLError(TIMEOUT) from None
        return SimpleNamespace(device=SimpleNamespace(value=0x7F0000 + index), eventData=xid, eventType=0x8)

    def nvmlEventSetFree(self, event_set: object) -> None:
        pass


def hgx(count: int = 8) -> list[FakeGpu]:
    buses = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
    return [
        FakeGpu(uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", bus_id=f"00000000:{buses[i].upper()}:00.0")
        for i in range(count)
    ]
