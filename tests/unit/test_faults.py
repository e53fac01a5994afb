"""Fault transitions from GPU readings: first readings, counters, unavailable fields, restarts."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from agent.faults import FaultState, diff_faults, fault_state
from agent.gpu_collector import GpuCollector
from gpus.backend import GpuReading
from gpus.simulated import SimulatedBackend
from tests.fakes.gpu_faults import GpuFaults
from vigil_core.signals import THROTTLE_HW_SLOWDOWN, GpuRef, SignalKind

GPU = GpuRef(0, "GPU-a", "0000:18:00")
HEALTHY = GpuReading(
    gpu=GPU,
    ecc_volatile_uncorrected=0,
    remap_pending=False,
    remap_failure=False,
    nvlink_errors={(0, "crc_flit"): 5, (1, "replay"): 2},
    nvlink_links_down=(),
    pcie_replays=100,
    pcie_generation=5,
    pcie_generation_max=5,
    pcie_width=16,
    pcie_width_max=16,
    utilization_pct=90.0,
)


def kinds_after(*readings: GpuReading) -> list[list[SignalKind]]:
    before: FaultState | None = None
    out = []
    for r in readings:
        now = fault_state(r, before)
        out.append([s.kind for s in diff_faults("n1", GPU, before, now, 1.0)])
        before = now
    return out


def test_first_reading_reports_faults_that_hold_but_not_old_counters() -> None:
    first = replace(HEALTHY, ecc_volatile_uncorrected=3, remap_pending=True, pcie_width=8)
    assert sorted(kinds_after(first)[0]) == sorted(
        [SignalKind.ECC_DBE, SignalKind.ROW_REMAP_PENDING, SignalKind.PCIE_LINK_DEGRADED]
    )
    assert kinds_after(HEALTHY) == [[]]  # 7 NVLink errors and 100 replays from before: baseline only


def test_counters_report_their_growth_once() -> None:
    more = replace(HEALTHY, nvlink_errors={(0, "crc_flit"): 9, (1, "replay"): 2}, pcie_replays=103)
    assert kinds_after(HEALTHY, more, more) == [[], [SignalKind.NVLINK_ERRORS, SignalKind.PCIE_REPLAY], []]
    now = fault_state(more, fault_state(HEALTHY, None))
    signals = diff_faults("n1", GPU, fault_state(HEALTHY, None), now, 1.0)
    assert [s.value for s in signals] == [4, 3]


def test_a_reset_counter_sets_a_new_baseline_silently() -> None:
    reset = replace(HEALTHY, pcie_replays=0)
    again = replace(HEALTHY, pcie_replays=2)
    assert kinds_after(HEALTHY, reset, again) == [[], [], [SignalKind.PCIE_REPLAY]]


def test_an_unavailable_field_keeps_its_last_value() -> None:
    blank = replace(HEALTHY, pcie_replays=None, ecc_volatile_uncorrected=None, ecc_aggregate_uncorrected=None)
    assert kinds_after(HEALTHY, blank, HEALTHY) == [[], [], []]


def test_nvlink_down_and_generation_drop_under_load() -> None:
    down = replace(HEALTHY, nvlink_links_down=(3,))
    slow = replace(HEALTHY, pcie_generation=3)
    idle_slow = replace(slow, utilization_pct=0.0)
    assert kinds_after(HEALTHY, down, down) == [[], [SignalKind.NVLINK_ERRORS], []]
    assert kinds_after(HEALTHY, idle_slow, slow) == [[], [], [SignalKind.PCIE_LINK_DEGRADED]]


def test_lost_once_then_quiet_and_counters_survive() -> None:
    lost = GpuReading(gpu=GPU, lost=True)
    assert kinds_after(HEALTHY, lost, lost) == [[], [SignalKind.GPU_LOST], []]
    assert fault_state(lost, fault_state(HEALTHY, None)).pcie_replays == 100


@given(st.builds(FaultState, nvlink_down=st.lists(st.integers(0, 17)).map(tuple)))
def test_fault_state_json_round_trip(state: FaultState) -> None:
    assert FaultState.from_json(state.to_json()) == state


def test_a_restored_collector_neither_repeats_nor_misses() -> None:
    clock = lambda: 1000.0  # noqa: E731
    backend = SimulatedBackend("n1", 2, clock=clock)
    GpuFaults(backend).row_remap(0, pending=True)
    GpuFaults(backend).throttle(1, THROTTLE_HW_SLOWDOWN)
    first = GpuCollector("n1", backend, clock, throttle_report_s=60)
    assert {s.kind for s in first.collect()} == {SignalKind.ROW_REMAP_PENDING, SignalKind.THROTTLE}
    restarted = GpuCollector("n1", backend, clock, throttle_report_s=60)
    restarted.restore(first.snapshot())
    assert restarted.collect() == []  # nothing new: no double report
    GpuFaults(backend).ecc_dbe(0, 1)
    assert [s.kind for s in restarted.collect()] == [SignalKind.ECC_DBE]
