"""The GPU poll collector over the simulated backend's fault injection."""

from __future__ import annotations

from agent.gpu_collector import GpuCollector, xid_signals
from gpus.simulated import SimulatedBackend, simulated_gpus
from tests.fakes.clock import ManualClock
from tests.fakes.gpu_faults import GpuFaults
from vigil_core.signals import THROTTLE_GPU_IDLE, THROTTLE_HW_THERMAL, THROTTLE_SW_POWER_CAP, SignalKind


def setup() -> tuple[SimulatedBackend, GpuCollector, ManualClock]:
    clock = ManualClock(1000.0)
    backend = SimulatedBackend("n1", 8, clock=clock)
    return backend, GpuCollector("n1", backend, clock, throttle_report_s=5.0), clock


def test_simulated_gpus_look_like_an_hgx_board() -> None:
    gpus = simulated_gpus("n1", 8)
    assert [g.pci_bus_id for g in gpus][:2] == ["0000:18:00", "0000:2a:00"]
    assert len({g.uuid for g in gpus}) == 8 and all(g.uuid.startswith("GPU-") for g in gpus)
    assert simulated_gpus("n1", 8) == gpus and simulated_gpus("n2", 8) != gpus


def test_healthy_gpus_give_no_signals() -> None:
    _, collector, _ = setup()
    assert collector.collect() == [] and collector.collect() == []
    assert len(collector.readings) == 8


def test_each_injected_fault_is_reported_once() -> None:
    backend, collector, _ = setup()
    collector.collect()
    GpuFaults(backend).ecc_dbe(1, 2)
    GpuFaults(backend).row_remap(2, failure=True)
    GpuFaults(backend).row_remap(3, pending=True)
    GpuFaults(backend).gpu_lost(4)
    GpuFaults(backend).xid(5, 48)
    first = collector.collect() + xid_signals("n1", backend.drain_xid_events())
    assert sorted((s.kind, s.gpu.index) for s in first) == sorted(
        [
            (SignalKind.ECC_DBE, 1),
            (SignalKind.ROW_REMAP_FAILURE, 2),
            (SignalKind.ROW_REMAP_PENDING, 3),
            (SignalKind.GPU_LOST, 4),
            (SignalKind.XID, 5),
        ]
    )
    assert next(s for s in first if s.kind is SignalKind.ECC_DBE).value == 2
    assert collector.collect() == []  # a steady fault is not reported again
    GpuFaults(backend).ecc_dbe(1, 1)
    assert [(s.kind, s.value) for s in collector.collect()] == [(SignalKind.ECC_DBE, 1)]


def test_lost_gpu_reads_as_not_available_not_zero() -> None:
    backend, collector, _ = setup()
    GpuFaults(backend).gpu_lost(0)
    collector.collect()
    lost = collector.readings[0]
    assert lost.lost and lost.temperature_c is None and lost.ecc_volatile_uncorrected is None


def test_throttling_reports_start_progress_and_end_but_not_normal_reasons() -> None:
    backend, collector, clock = setup()
    GpuFaults(backend).throttle(0, THROTTLE_GPU_IDLE | THROTTLE_SW_POWER_CAP)
    assert collector.collect() == []  # idle and the software power cap are normal
    GpuFaults(backend).throttle(0, THROTTLE_HW_THERMAL)
    start = collector.collect()
    assert [(s.kind, s.code, s.value) for s in start] == [(SignalKind.THROTTLE, THROTTLE_HW_THERMAL, 0.0)]
    clock.now += 2
    assert collector.collect() == []
    clock.now += 4
    assert [s.value for s in collector.collect()] == [6.0]
    GpuFaults(backend).throttle(0, 0)
    assert [(s.code, s.value) for s in collector.collect()] == [(0, 0.0)]
