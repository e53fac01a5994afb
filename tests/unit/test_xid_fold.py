"""Kernel-log and NVML-event XIDs for the same fault become one signal."""

from __future__ import annotations

from agent.xid_fold import XidFolder
from vigil_core.signals import GpuRef, Signal, SignalKind

KMSG_GPU = GpuRef(-1, "", "0000:3b:00")  # the kernel line names only the bus
NVML_GPU = GpuRef(2, "GPU-abc", "0000:3b:00")


def xid(code: int, source: str, at: float, gpu: GpuRef) -> Signal:
    return Signal("n1", SignalKind.XID, gpu, code, 0.0, "", source, at)


def test_the_second_source_is_folded_within_the_window() -> None:
    folder = XidFolder(window_s=10)
    assert folder.keep(xid(79, "kmsg", 100.0, KMSG_GPU))
    assert not folder.keep(xid(79, "nvml-event", 100.4, NVML_GPU))
    assert folder.folded == 1


def test_same_source_repeats_other_codes_and_late_ones_are_kept() -> None:
    folder = XidFolder(window_s=10)
    assert folder.keep(xid(13, "nvml-event", 100.0, NVML_GPU))
    assert folder.keep(xid(13, "nvml-event", 101.0, NVML_GPU))  # counted by the policy
    assert folder.keep(xid(31, "kmsg", 101.0, KMSG_GPU))
    assert folder.keep(xid(13, "kmsg", 120.0, KMSG_GPU))  # outside the window: a new fault
    assert folder.keep(Signal("n1", SignalKind.GPU_LOST, NVML_GPU, 0, 1, "", "gpu-poll", 100.0))
    assert folder.folded == 0
