"""The production GPU backend: NVML through nvidia-ml-py (``import pynvml``).

Design choices:

- Every field is read by its own call, and a call the GPU does not support (NOT_SUPPORTED,
  NO_PERMISSION, FUNCTION_NOT_FOUND with an older driver, ...) leaves that field ``None``: "not
  available", never zero and never a crash. The first failure of each (call, GPU) is logged once.
- A lost-class error (GPU_IS_LOST, RESET_REQUIRED, GPU_NOT_FOUND) on any call ends the reading and
  marks the GPU lost, with NVML's words as the reason. A GPU whose handle cannot be had at start
  is listed by index and reported lost.
- XID critical-error events come from ``nvmlEventSetWait`` in a daemon thread that waits at most
  ``event_wait_ms`` at a time, so it notices ``close()`` and proves it is alive to the watchdog
  (``events_progress``). The agent's event loop never calls NVML itself: the GPU poll runs in a
  worker thread under the watchdog, because a wedged driver can hang any NVML call.
- The library is injected (``nvml=``), so tests drive this code through a fake NVML library with
  error and hang injection; on a GPU machine tests/gpu runs it against the real driver.
"""

from __future__ import annotations

import ctypes
import importlib
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from gpus.backend import NVLINK_COUNTERS, BackendUnavailable, GpuReading, XidEvent
from vigil_core.signals import (
    THROTTLE_HW_POWER_BRAKE,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_POWER_CAP,
    THROTTLE_SW_THERMAL,
    THROTTLE_SYNC_BOOST,
    GpuRef,
    normalize_pci_bus_id,
)

log = structlog.get_logger(__name__)

GPU_IS_LOST, RESET_REQUIRED, GPU_NOT_FOUND, TIMEOUT = 15, 16, 28, 10
_LOST_ERRORS = frozenset({GPU_IS_LOST, RESET_REQUIRED, GPU_NOT_FOUND})
# Driver field ids holding the cumulative time (ns) of each clock-event reason (R535 and later).
_THROTTLE_FIELDS = {
    74: THROTTLE_SW_POWER_CAP,  # NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP
    76: THROTTLE_SYNC_BOOST,  # ..._SYNC_BOOST
    269: THROTTLE_SW_THERMAL,  # ..._SW_THERM_SLOWDOWN
    270: THROTTLE_HW_THERMAL,  # ..._HW_THERM_SLOWDOWN
    271: THROTTLE_HW_POWER_BRAKE,  # ..._HW_POWER_BRAKE_SLOWDOWN
}
_NVLINK_COUNTER_IDS = dict(zip(NVLINK_COUNTERS, range(4), strict=True))  # NVML_NVLINK_ERROR_DL_*


class _GpuLost(Exception):
    pass


class _Calls:
    """NVML calls for one GPU: the value, ``None`` when unavailable, ``_GpuLost`` when lost."""

    def __init__(self, nvml: Any, handle: Any, index: int, warned: set[tuple[str, int]]) -> None:
        self._nvml, self._handle, self._index, self._warned = nvml, handle, index, warned

    def __call__(self, fn_name: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, fn_name)(self._handle, *args)
        except self._nvml.NVMLError as exc:
            if exc.value in _LOST_ERRORS:
                raise _GpuLost(f"{fn_name}: {exc}") from exc
            if (fn_name, self._index) not in self._warned:
                self._warned.add((fn_name, self._index))
                log.info("nvml_field_unavailable", gpu=self._index, call=fn_name, error=str(exc))
            return None
        except AttributeError:  # an nvidia-ml-py older than the call
            return None


class NvmlBackend:
    name = "nvml"

    def __init__(self, nvml: Any = None, event_wait_ms: int = 1000, clock: Callable[[], float] = time.time) -> None:
        try:
            self._nvml = nvml if nvml is not None else importlib.import_module("pynvml")
            self._nvml.nvmlInit()
        except (ImportError, OSError) as exc:
            raise BackendUnavailable(f"NVML cannot be loaded: {exc}") from exc
        except Exception as exc:  # pynvml.NVMLError: no driver, driver/library mismatch, ...
            raise BackendUnavailable(f"NVML cannot start: {exc}") from exc
        self._clock = clock
        self._warned: set[tuple[str, int]] = set()
        self._handles: list[Any] = []
        self._gpus: list[GpuRef] = []
        for index in range(self._nvml.nvmlDeviceGetCount()):
            self._add_gpu(index)
        self._nvlinks = [self._nvlinks_present(i) for i in range(len(self._gpus))]
        self._events: list[XidEvent] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._progress: float | None = None
        self.events_registered: list[int] = []
        self._event_thread = self._start_event_listener(event_wait_ms)

    def _add_gpu(self, index: int) -> None:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            bus = normalize_pci_bus_id(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        except nvml.NVMLError as exc:
            log.error("nvml_gpu_unreachable", gpu=index, error=str(exc))
            handle, uuid, bus = None, "", ""
        self._handles.append(handle)
        self._gpus.append(GpuRef(index=index, uuid=uuid, pci_bus_id=bus))

    def _nvlinks_present(self, index: int) -> list[int]:
        """Links that answer a state query: a link that later reads as down is a fault."""
        handle = self._handles[index]
        if handle is None:
            return []
        calls = _Calls(self._nvml, handle, index, {("nvmlDeviceGetNvLinkState", index)})
        links = []
        try:
            for link in range(int(getattr(self._nvml, "NVML_NVLINK_MAX_LINKS", 18))):
                if calls("nvmlDeviceGetNvLinkState", link) == 1:
                    links.append(link)
        except _GpuLost:
            return []
        return links

    def gpus(self) -> list[GpuRef]:
        return list(self._gpus)

    @property
    def driver_version(self) -> str | None:
        try:
            return _text(self._nvml.nvmlSystemGetDriverVersion())
        except self._nvml.NVMLError:
            return None

    def _fabric(self, call: _Calls) -> tuple[int | None, int | None]:
        """The GPU's NVLink fabric registration (nvmlDeviceGetGpuFabricInfo): (state, status), or
        Nones where the GPU has no fabric or the driver does not say."""
        struct = getattr(self._nvml, "c_nvmlGpuFabricInfo_t", None)
        if struct is None:
            return None, None
        info = struct()
        if call("nvmlDeviceGetGpuFabricInfo", ctypes.byref(info)) is None or info.state == 0:
            return None, None  # 0: NVML_GPU_FABRIC_STATE_NOT_SUPPORTED (no NVSwitch fabric)
        return int(info.state), int(info.status)

    def read(self, index: int) -> GpuReading:
        gpu, handle = self._gpus[index], self._handles[index]
        if handle is None:
            return GpuReading(gpu=gpu, lost=True, lost_reason="no NVML handle for this GPU")
        try:
            return self._read(gpu, _Calls(self._nvml, handle, index, self._warned))
        except _GpuLost as exc:
            return GpuReading(gpu=gpu, lost=True, lost_reason=str(exc))

    def _read(self, gpu: GpuRef, call: _Calls) -> GpuReading:
        memory = call("nvmlDeviceGetMemoryInfo")
        util = call("nvmlDeviceGetUtilizationRates")
        power_mw = call("nvmlDeviceGetPowerUsage")
        remap = call("nvmlDeviceGetRemappedRows")
        pending = call("nvmlDeviceGetRetiredPagesPendingStatus")
        sbe_pages = call("nvmlDeviceGetRetiredPages", 0)  # NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT
        dbe_pages = call("nvmlDeviceGetRetiredPages", 1)  # NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT
        fabric = self._fabric(call)
        reasons = call("nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is None:
            reasons = call("nvmlDeviceGetCurrentClocksThrottleReasons")  # drivers before R535
        return GpuReading(
            gpu=gpu,
            name=_text(call("nvmlDeviceGetName")) or None,
            temperature_c=_float(call("nvmlDeviceGetTemperature", 0)),  # NVML_TEMPERATURE_GPU
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            sm_clock_mhz=_float(call("nvmlDeviceGetClockInfo", 1)),  # NVML_CLOCK_SM
            memory_clock_mhz=_float(call("nvmlDeviceGetClockInfo", 2)),  # NVML_CLOCK_MEM
            utilization_pct=_float(util.gpu) if util is not None else None,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            ecc_volatile_corrected=_int(call("nvmlDeviceGetTotalEccErrors", 0, 0)),
            ecc_volatile_uncorrected=_int(call("nvmlDeviceGetTotalEccErrors", 1, 0)),
            ecc_aggregate_corrected=_int(call("nvmlDeviceGetTotalEccErrors", 0, 1)),
            ecc_aggregate_uncorrected=_int(call("nvmlDeviceGetTotalEccErrors", 1, 1)),
            retired_pages_sbe=len(sbe_pages) if sbe_pages is not None else None,
            retired_pages_dbe=len(dbe_pages) if dbe_pages is not None else None,
            retired_pages_pending=bool(pending) if pending is not None else None,
            remapped_rows_corrected=int(remap[0]) if remap is not None else None,
            remapped_rows_uncorrected=int(remap[1]) if remap is not None else None,
            remap_pending=bool(remap[2]) if remap is not None else None,
            remap_failure=bool(remap[3]) if remap is not None else None,
            throttle_reasons=_int(reasons),
            throttle_ns=self._throttle_ns(call),
            nvlink_errors=self._nvlink_errors(gpu.index, call),
            nvlink_links_down=self._nvlinks_down(gpu.index, call),
            pcie_replays=_int(call("nvmlDeviceGetPcieReplayCounter")),
            pcie_generation=_int(call("nvmlDeviceGetCurrPcieLinkGeneration")),
            pcie_generation_max=_int(call("nvmlDeviceGetMaxPcieLinkGeneration")),
            pcie_width=_int(call("nvmlDeviceGetCurrPcieLinkWidth")),
            pcie_width_max=_int(call("nvmlDeviceGetMaxPcieLinkWidth")),
            fabric_state=fabric[0],
            fabric_status=fabric[1],
            recovery_action=self._recovery_action(call),
        )

    def _recovery_action(self, call: _Calls) -> int | None:
        """What the driver says the GPU needs to recover (the number XID 154 prints); None where this
        driver or pynvml does not have the field."""
        field = getattr(self._nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field is None:
            return None
        values = call("nvmlDeviceGetFieldValues", [field])
        if not values or values[0].nvmlReturn != 0:
            return None
        return int(values[0].value.uiVal)

    @staticmethod
    def _throttle_ns(call: _Calls) -> dict[int, int] | None:
        values = call("nvmlDeviceGetFieldValues", list(_THROTTLE_FIELDS))
        if values is None:
            return None
        out = {_THROTTLE_FIELDS[v.fieldId]: int(v.value.ullVal) for v in values if v.nvmlReturn == 0}
        return out or None

    def _nvlink_errors(self, index: int, call: _Calls) -> dict[tuple[int, str], int] | None:
        if not self._nvlinks[index]:
            return None
        out = {}
        for link in self._nvlinks[index]:
            for name, counter in _NVLINK_COUNTER_IDS.items():
                value = call("nvmlDeviceGetNvLinkErrorCounter", link, counter)
                if value is not None:
                    out[(link, name)] = int(value)
        return out

    def _nvlinks_down(self, index: int, call: _Calls) -> tuple[int, ...] | None:
        if not self._nvlinks[index]:
            return None
        return tuple(link for link in self._nvlinks[index] if call("nvmlDeviceGetNvLinkState", link) != 1)

    # XID events ---------------------------------------------------------------------------------

    def _start_event_listener(self, wait_ms: int) -> threading.Thread | None:
        event_set = self._nvml.nvmlEventSetCreate()
        xid_type = int(getattr(self._nvml, "nvmlEventTypeXidCriticalError", 0x8))
        for index, handle in enumerate(self._handles):
            if handle is None:
                continue
            try:
                self._nvml.nvmlDeviceRegisterEvents(handle, xid_type, event_set)
                self.events_registered.append(index)
            except self._nvml.NVMLError as exc:
                log.warning("nvml_xid_events_unavailable", gpu=index, error=str(exc))
        if not self.events_registered:
            self._nvml.nvmlEventSetFree(event_set)
            return None
        thread = threading.Thread(target=self._listen, args=(event_set, wait_ms), name="nvml-xid-events", daemon=True)
        thread.start()
        return thread

    def _listen(self, event_set: Any, wait_ms: int) -> None:
        by_handle = {_handle_key(h): g for h, g in zip(self._handles, self._gpus, strict=True) if h is not None}
        while not self._stop.is_set():
            self._progress = time.monotonic()
            try:
                data = self._nvml.nvmlEventSetWait(event_set, wait_ms)
            except self._nvml.NVMLError as exc:
                if exc.value != TIMEOUT:
                    log.warning("nvml_event_wait_failed", error=str(exc))
                    self._stop.wait(wait_ms / 1000.0)
                continue
            gpu = by_handle.get(_handle_key(data.device), GpuRef())
            event = XidEvent(gpu, int(data.eventData), self._clock(), f"XID {int(data.eventData)} (NVML event)")
            with self._lock:
                self._events.append(event)
        self._nvml.nvmlEventSetFree(event_set)

    def drain_xid_events(self) -> list[XidEvent]:
        with self._lock:
            events, self._events = self._events, []
        return events

    def events_progress(self) -> float | None:
        return self._progress if self._event_thread is not None else None

    def close(self) -> None:
        self._stop.set()
        if self._event_thread is not None:
            self._event_thread.join(timeout=2.0)
        if self._event_thread is None or not self._event_thread.is_alive():
            self._nvml.nvmlShutdown()  # never under a listener that is still inside NVML


def _handle_key(handle: Any) -> Any:
    """NVML device handles are ctypes pointers, and the event's handle is a new pointer object to
    the same device: compare addresses, not objects."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return getattr(handle, "value", handle)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


def _float(value: Any) -> float | None:
    return float(value) if value is not None else None


def _int(value: Any) -> int | None:
    return int(value) if value is not None else None
