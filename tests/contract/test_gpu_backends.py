"""The GPU backend contract, held against both backends: the simulated one (demo, tests) and the
NVML one (production) driven through a fake NVML library. Faults are injected through each
backend's own means; what the collectors see must be the same."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from agent.gpu_collector import GpuCollector
from gpus.backend import GpuBackend, GpuReading
from gpus.health import health_problems
from gpus.nvml_backend import NvmlBackend
from gpus.simulated import SimulatedBackend
from tests.fakes.gpu_faults import GpuFaults
from tests.fakes.nvml import FakeNvml, hgx
from tests.helpers import poll_until
from vigil_core.signals import SignalKind, normalize_pci_bus_id


@dataclass
class Faults:
    lose: Callable[[int], None]
    remap_pending: Callable[[int], None]
    xid: Callable[[int, int], None]
    hang: Callable[[int], None]
    release: Callable[[], None]
    fabric_fail: Callable[[int], None]


def simulated() -> tuple[GpuBackend, Faults]:
    b = SimulatedBackend("n1", 4)
    f = GpuFaults(b)
    return b, Faults(
        f.gpu_lost, lambda i: f.row_remap(i, pending=True), f.xid, f.hang, b.release_hangs, f.fabric_failed
    )


def nvml() -> tuple[GpuBackend, Faults]:
    lib = FakeNvml(hgx(4))
    gate = threading.Event()

    def lose(i: int) -> None:
        lib.gpus[i].lost = True

    def remap(i: int) -> None:
        lib.gpus[i].remap = (0, 1, 1, 0)

    def hang(i: int) -> None:
        lib.gpus[i].hang = gate

    def fabric_fail(i: int) -> None:
        lib.gpus[i].fabric = (3, 999)  # NVML_GPU_FABRIC_STATE_COMPLETED, NVML_ERROR_UNKNOWN

    for gpu in lib.gpus:
        gpu.fabric = (3, 0)  # an HGX board: every GPU joined its NVLink fabric
    xid = lambda i, c: lib.events.put((i, c))  # noqa: E731
    return NvmlBackend(lib, event_wait_ms=20), Faults(lose, remap, xid, hang, gate.set, fabric_fail)


@pytest.fixture(params=[simulated, nvml], ids=["simulated", "nvml"])
def subject(request: pytest.FixtureRequest) -> Iterator[tuple[GpuBackend, Faults]]:
    backend, faults = request.param()
    yield backend, faults
    faults.release()
    backend.close()


def test_gpus_are_indexed_and_named_every_way(subject: tuple[GpuBackend, Faults]) -> None:
    backend, _ = subject
    gpus = backend.gpus()
    assert [g.index for g in gpus] == list(range(4))
    assert len({g.uuid for g in gpus}) == 4 and all(g.uuid.startswith("GPU-") for g in gpus)
    assert all(normalize_pci_bus_id(g.pci_bus_id) == g.pci_bus_id for g in gpus)


def test_a_healthy_reading_fills_the_metrics_fields(subject: tuple[GpuBackend, Faults]) -> None:
    backend, _ = subject
    r = backend.read(0)
    assert r.gpu == backend.gpus()[0] and not r.lost
    for name in ("temperature_c", "power_w", "sm_clock_mhz", "utilization_pct", "memory_used_bytes"):
        assert isinstance(getattr(r, name), (int, float)), name
    assert r.remap_pending is False and r.ecc_volatile_uncorrected == 0


def test_a_lost_gpu_reads_as_lost_with_nothing_else(subject: tuple[GpuBackend, Faults]) -> None:
    backend, faults = subject
    faults.lose(1)
    r = backend.read(1)
    assert r.lost and r.lost_reason
    assert all(getattr(r, f.name) is None for f in fields(GpuReading) if f.name not in ("gpu", "lost", "lost_reason"))


def test_xid_events_are_drained_once(subject: tuple[GpuBackend, Faults]) -> None:
    backend, faults = subject
    faults.xid(3, 48)
    events = poll_until(backend.drain_xid_events, timeout=5)
    assert [(e.gpu, e.code) for e in events] == [(backend.gpus()[3], 48)]  # type: ignore[union-attr]
    assert backend.drain_xid_events() == []


def test_a_hung_read_blocks_until_released(subject: tuple[GpuBackend, Faults]) -> None:
    backend, faults = subject
    faults.hang(2)
    done = threading.Event()
    threading.Thread(target=lambda: (backend.read(2), done.set()), daemon=True).start()
    assert not done.wait(0.3)
    faults.release()
    assert done.wait(5)


def test_the_collector_sees_the_same_faults(subject: tuple[GpuBackend, Faults]) -> None:
    backend, faults = subject
    collector = GpuCollector("n1", backend, lambda: 100.0)
    assert collector.collect() == []
    faults.lose(0)
    faults.remap_pending(1)
    assert sorted((s.kind, s.gpu.index) for s in collector.collect()) == [
        (SignalKind.GPU_LOST, 0),
        (SignalKind.ROW_REMAP_PENDING, 1),
    ]


def test_the_simulated_backend_reads_faults_from_its_file_as_it_grows(tmp_path: Path) -> None:
    faults = tmp_path / "node.faults"
    b = SimulatedBackend("n1", 4, fault_file=faults)
    assert not b.read(1).remap_pending and b.drain_xid_events() == []  # no file yet: healthy
    faults.write_text(
        '{"gpu": 1, "set": {"remap_pending": true}}\n'
        "not json\n"
        '{"gpu": 9, "xid": 79}\n'  # no such GPU: refused, the rest applies
        '{"gpu": 2, "set": {"colour": 1}}\n'
        '{"gpu": 2, "set": {"ecc_dbe": true}}\n'  # a count must be an integer
        '{"gpu": 3, "xid": 48, "message": "DBE"}\n'
        '{"gpu": 0, "set": {"lost": true}}'  # not finished: waits for its newline
    )
    assert b.read(1).remap_pending and b.read(2).ecc_volatile_uncorrected == 0
    (event,) = b.drain_xid_events()
    assert (event.gpu.index, event.code, event.message) == (3, 48, "DBE")
    assert not b.read(0).lost
    with open(faults, "a") as f:
        f.write("\n")
    assert b.read(0).lost and b.drain_xid_events() == []  # each line applies once


def test_a_fault_file_line_can_hang_a_gpus_reads_and_another_release_them(tmp_path: Path) -> None:
    """A wedged driver, for the hung-collector scenario: reads of that GPU block until a later line
    (read by another caller, as the agent's NVML event drain does) says hang: false."""
    faults = tmp_path / "node.faults"
    b = SimulatedBackend("n1", 2, fault_file=faults)
    faults.write_text('{"gpu": 1, "set": {"hang": true}}\n')
    assert not b.read(0).lost  # applies the line; GPU 0 is not hung
    done = threading.Event()
    reader = threading.Thread(target=lambda: (b.read(1), done.set()), daemon=True)
    reader.start()
    assert not done.wait(0.3)  # GPU 1's read does not come back
    with open(faults, "a") as f:
        f.write('{"gpu": 1, "set": {"hang": false}}\n')
    b.drain_xid_events()  # another caller reads the file and releases the hang
    assert done.wait(5)


def test_a_gpu_cut_off_its_nvlink_fabric_is_one_signal_and_fails_its_health_check(
    subject: tuple[GpuBackend, Faults],
) -> None:
    backend, faults = subject
    collector = GpuCollector("n1", backend, lambda: 100.0)
    assert collector.collect() == []  # every GPU joined (or, simulated, has no fabric to join)
    faults.fabric_fail(2)
    (signal,) = collector.collect()
    assert (signal.kind, signal.gpu.index, signal.value) == (SignalKind.GPU_FABRIC_FAILED, 2, 999)
    assert collector.collect() == []  # a state, said once
    problems = health_problems([backend.read(i) for i in range(len(backend.gpus()))])
    assert problems == ["GPU 2 NVLink fabric registration failed (NVML status 999)"]
