"""Which devices a workload check runs on, what they are expected to reach, and whether a workload
is using them (invasive checks refuse to run on a GPU in use)."""

from __future__ import annotations

import os
from dataclasses import dataclass

# Dense bf16 peak TFLOP/s (docs/design.md) and HBM bandwidth GB/s (vendor figures), by a name fragment.
# First match wins, so the more specific names come first.
GPU_PEAKS: list[tuple[str, float, float]] = [
    ("H100 PCIe", 756.0, 2000.0),
    ("H100 NVL", 835.0, 3900.0),
    ("H100", 989.0, 3350.0),
    ("H200", 989.0, 4800.0),
    ("B200", 2250.0, 8000.0),
    ("A100-SXM4-80GB", 312.0, 2039.0),
    ("A100 80GB PCIe", 312.0, 1935.0),
    ("A100", 312.0, 1555.0),
]


@dataclass(frozen=True, slots=True)
class Device:
    index: int  # -1 for the CPU
    name: str
    torch_device: str

    @property
    def label(self) -> str:
        return "CPU" if self.index < 0 else f"GPU {self.index}"


def peaks_for(name: str) -> tuple[float, float] | None:
    """(bf16 TFLOP/s, memory GB/s) for a GPU model name, or None when unknown."""
    for fragment, tflops, gbps in GPU_PEAKS:
        if fragment in name:
            return tflops, gbps
    return None


def devices() -> list[Device]:
    import torch

    if torch.cuda.is_available():
        return [Device(i, torch.cuda.get_device_name(i), f"cuda:{i}") for i in range(torch.cuda.device_count())]
    return [Device(-1, "CPU", "cpu")]


def busy_gpus(processes: dict[int, list[int]], own_pids: set[int]) -> dict[int, list[int]]:
    """GPU index -> the other processes computing on it. Pure."""
    busy = {gpu: [p for p in pids if p not in own_pids] for gpu, pids in processes.items()}
    return {gpu: pids for gpu, pids in busy.items() if pids}


def compute_processes() -> dict[int, list[int]]:
    """GPU index -> pids with a compute context on it, from NVML; empty where there is no NVML."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return {}
    try:
        out = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            out[i] = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        return out
    finally:
        pynvml.nvmlShutdown()


def refuse_if_busy(check: str, targets: list[Device]) -> str | None:
    """The reason not to run an invasive check, or None when its GPUs are free."""
    gpus = {d.index for d in targets if d.index >= 0}
    if not gpus:
        return None
    busy = {g: p for g, p in busy_gpus(compute_processes(), {os.getpid()}).items() if g in gpus}
    if not busy:
        return None
    named = "; ".join(f"GPU {g} by pid {', '.join(map(str, p))}" for g, p in sorted(busy.items()))
    return f"not running {check}: a workload is using the GPU ({named})"
