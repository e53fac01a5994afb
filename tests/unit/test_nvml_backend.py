"""The NVML backend against a fake NVML library: every field, unsupported calls, lost GPUs, events."""

from __future__ import annotations

import threading
import time

import pytest

from gpus.backend import BackendUnavailable
from gpus.nvml_backend import NvmlBackend
from tests.fakes.nvml import FakeNvml, hgx
from tests.helpers import poll_until
from vigil_core.signals import THROTTLE_HW_THERMAL, THROTTLE_SW_POWER_CAP


def backend(nvml: FakeNvml) -> NvmlBackend:
    return NvmlBackend(nvml, event_wait_ms=50)


def test_reads_every_field_of_a_healthy_gpu() -> None:
    nvml = FakeNvml(hgx(2))
    nvml.gpus[1].ecc = {(0, 0): 4, (1, 0): 0, (0, 1): 9, (1, 1): 1}
    nvml.gpus[1].nvlink_errors = {(2, 2): 7}  # link 2, CRC flit
    b = backend(nvml)
    try:
        assert [g.pci_bus_id for g in b.gpus()] == ["0000:18:00", "0000:2a:00"]
        r = b.read(1)
        assert r.gpu == b.gpus()[1] and not r.lost and r.name == "NVIDIA H100 80GB HBM3"
        assert (r.temperature_c, r.power_w, r.sm_clock_mhz, r.utilization_pct) == (40.0, 120.0, 1980.0, 97.0)
        assert (r.memory_used_bytes, r.memory_total_bytes) == (10 << 30, 80 << 30)
        assert (r.ecc_volatile_corrected, r.ecc_volatile_uncorrected) == (4, 0)
        assert (r.ecc_aggregate_corrected, r.ecc_aggregate_uncorrected) == (9, 1)
        assert (r.remap_pending, r.remap_failure, r.retired_pages_dbe) == (False, False, 0)
        assert r.throttle_ns == {THROTTLE_SW_POWER_CAP: 5_000_000_000, THROTTLE_HW_THERMAL: 0}
        assert r.nvlink_errors is not None and len(r.nvlink_errors) == 18 * 4
        assert r.nvlink_errors[(2, "crc_flit")] == 7 and r.nvlink_links_down == ()
        assert (r.pcie_generation, r.pcie_width, r.pcie_replays) == (5, 16, 0)
    finally:
        b.close()


def test_unsupported_calls_leave_fields_unavailable_not_zero() -> None:
    nvml = FakeNvml(hgx(1))
    nvml.gpus[0].unsupported = {
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetCurrentClocksEventReasons",
    }
    nvml.gpus[0].nvlinks = {}  # a PCIe card without NVLink
    nvml.gpus[0].reasons = 0x4
    b = backend(nvml)
    try:
        r = b.read(0)
        assert not r.lost and r.temperature_c == 40.0
        assert r.remap_pending is None and r.remapped_rows_uncorrected is None
        assert r.throttle_ns is None and r.pcie_replays is None and r.ecc_volatile_uncorrected is None
        assert r.nvlink_errors is None and r.nvlink_links_down is None
        assert r.throttle_reasons == 0x4  # from the pre-R535 call
    finally:
        b.close()


def test_a_lost_gpu_is_reported_lost_with_nvmls_words() -> None:
    nvml = FakeNvml(hgx(2))
    b = backend(nvml)
    try:
        nvml.gpus[0].lost = True
        r = b.read(0)
        assert r.lost and "GPU is lost" in r.lost_reason and r.temperature_c is None
        assert not b.read(1).lost
    finally:
        b.close()


def test_a_gpu_lost_before_start_is_listed_and_lost() -> None:
    nvml = FakeNvml(hgx(2))
    nvml.gpus[1].lost = True
    b = backend(nvml)
    try:
        assert [g.index for g in b.gpus()] == [0, 1] and b.gpus()[1].uuid == ""
        assert b.read(1).lost and b.events_registered == [0]
    finally:
        b.close()


def test_a_missing_driver_is_a_clear_error() -> None:
    with pytest.raises(BackendUnavailable, match="NVML cannot start: Driver Not Loaded"):
        NvmlBackend(FakeNvml(hgx(1), init_error=9))


def test_a_link_that_goes_down_is_named() -> None:
    nvml = FakeNvml(hgx(1))
    b = backend(nvml)
    try:
        nvml.gpus[0].nvlinks[3] = 0
        assert b.read(0).nvlink_links_down == (3,)
    finally:
        b.close()


def test_xid_events_arrive_through_the_listener_thread() -> None:
    nvml = FakeNvml(hgx(4))
    b = backend(nvml)
    try:
        first = b.events_progress()
        assert first is not None
        nvml.events.put((2, 79))
        events = poll_until(b.drain_xid_events, timeout=5)
        assert [(e.gpu.index, e.code) for e in events] == [(2, 79)]
        assert events[0].gpu.uuid == b.gpus()[2].uuid
        poll_until(lambda: (b.events_progress() or 0) > first, timeout=5)
    finally:
        b.close()
    assert nvml.shutdown


def test_a_wedged_event_wait_stops_progress() -> None:
    nvml = FakeNvml(hgx(1))
    gate = threading.Event()
    real_wait = nvml.nvmlEventSetWait

    def wedged_wait(event_set: object, timeout_ms: int) -> object:
        gate.wait()  # a driver that never returns from the wait
        return real_wait(event_set, timeout_ms)

    nvml.nvmlEventSetWait = wedged_wait  # type: ignore[method-assign]
    b = backend(nvml)
    try:
        time.sleep(0.2)
        stalled = b.events_progress()
        time.sleep(0.3)
        assert b.events_progress() == stalled  # the watchdog sees no progress
    finally:
        gate.set()
        b.close()


def test_event_handles_match_by_address_not_identity() -> None:
    import ctypes

    import pynvml

    from gpus.nvml_backend import _handle_key

    device = pynvml.struct_c_nvmlDevice_t()
    one, other = pynvml.c_nvmlDevice_t(device), pynvml.c_nvmlDevice_t(device)
    assert one is not other and _handle_key(one) == _handle_key(other) == ctypes.addressof(device)
    assert _handle_key(pynvml.c_nvmlDevice_t(pynvml.struct_c_nvmlDevice_t())) != _handle_key(one)
