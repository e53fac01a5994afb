"""The NVML backend on a real NVIDIA GPU. CI has none, so these skip there; run them on a GPU node:

    pytest -m gpu -s tests/gpu

They print what the backend reads (fields present per GPU, XID event registration, the latency of
one full poll) so that the figures can be recorded.
"""

from __future__ import annotations

import time
from dataclasses import fields

import pytest

from agent.gpu_collector import GpuCollector
from gpus.backend import BackendUnavailable, GpuReading
from gpus.nvml_backend import NvmlBackend
from vigil_core.signals import SignalKind

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def backend() -> NvmlBackend:
    try:
        b = NvmlBackend()
    except BackendUnavailable as exc:
        pytest.skip(f"no NVIDIA GPU here: {exc}")
    if not b.gpus():
        pytest.skip("NVML found no GPU")
    return b


def test_every_gpu_is_named_and_read(backend: NvmlBackend) -> None:
    print(f"\ndriver {backend.driver_version}, {len(backend.gpus())} GPU(s)")
    for gpu in backend.gpus():
        r = backend.read(gpu.index)
        assert not r.lost, r.lost_reason
        assert gpu.uuid.startswith("GPU-") and gpu.pci_bus_id
        present = [f.name for f in fields(GpuReading) if getattr(r, f.name) is not None]
        absent = [f.name for f in fields(GpuReading) if getattr(r, f.name) is None]
        print(f"GPU {gpu.index} {r.name} {gpu.pci_bus_id}: present {present}; not available {absent}")
        assert r.temperature_c is not None and r.memory_total_bytes is not None
        assert r.throttle_reasons is not None
        # The driver's recovery action, where it has the field: a number XID 154 would print (0: none).
        assert r.recovery_action is None or 0 <= r.recovery_action <= 7, r.recovery_action


def test_xid_events_are_registered(backend: NvmlBackend) -> None:
    print(f"\nXID events registered on GPUs {backend.events_registered}")
    assert backend.events_registered, "no GPU accepted XID critical-error events"
    first = backend.events_progress()
    time.sleep(2.5)
    assert (backend.events_progress() or 0) > (first or 0)  # the listener comes back from its waits


def test_a_full_poll_reads_every_gpu_and_reports_only_what_changed(backend: NvmlBackend) -> None:
    """Every GPU read on every poll (the latency is printed for the record; bench.gpu_checks measures
    it), and polls of an unchanged GPU report nothing new: a fault signal here is a real transition."""
    collector = GpuCollector("gpu-node", backend, time.time)
    collector.collect()  # first poll sets the baseline
    samples = []
    repeated: list[str] = []
    for _ in range(10):
        started = time.perf_counter()
        signals = collector.collect()
        samples.append(time.perf_counter() - started)
        repeated += [s.describe() for s in signals if s.kind is not SignalKind.THROTTLE]
        readings = collector.readings
        assert [r.gpu.index for r in readings] == [g.index for g in backend.gpus()]
        assert all(r.lost or r.temperature_c is not None for r in readings)
    samples.sort()
    print(
        f"\nfull poll of {len(backend.gpus())} GPU(s): median {samples[5] * 1e3:.1f} ms, max {samples[-1] * 1e3:.1f} ms"
    )
    assert repeated == [], f"a healthy, unchanged GPU reported faults on every poll: {repeated}"


def test_what_certification_reads_on_a_real_gpu_read_only(backend: NvmlBackend) -> None:
    """The fields a repaired node is certified on (``gpu_health``: the recovery action back to none,
    no pending remap, no uncorrectable ECC, its NVLink fabric) read on the real GPUs. Read only:
    nothing here resets a GPU (the remedies never run on a GPU lent to measure on)."""
    from gpus.health import health_problems

    readings = [backend.read(g.index) for g in backend.gpus()]
    for r in readings:
        print(f"GPU {r.gpu.index}: recovery action {r.recovery_action}, remap pending {r.remap_pending}, "
              f"uncorrectable ECC {r.ecc_volatile_uncorrected}, fabric {r.fabric_state}/{r.fabric_status}")  # fmt: skip
    problems = health_problems(readings)
    print(f"gpu_health on this node: {problems or 'healthy'}")
    assert all(isinstance(p, str) and p.startswith("GPU ") for p in problems)
