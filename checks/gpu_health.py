"""NVML health snapshot of every GPU: lost, ECC, row remap, retired pages, NVLink, PCIe, throttling.
The same reading and the same rules as the agent's own ``gpu_health`` answer.

    python -m checks.gpu_health [--backend nvml|simulated] [--json]
"""

from __future__ import annotations

import argparse
import socket
import time

from checks.program import check_main, verdict_for
from checks.result import CheckResult, unknown
from gpus.backend import BackendUnavailable, GpuBackend
from gpus.health import health_problems


def backend_for(name: str, gpus: int) -> GpuBackend:
    if name == "simulated":
        from gpus.simulated import SimulatedBackend

        return SimulatedBackend(socket.gethostname(), gpus)
    from gpus.nvml_backend import NvmlBackend

    return NvmlBackend()


def run(args: argparse.Namespace) -> CheckResult:
    started = time.time()
    try:
        backend = backend_for(args.backend, args.simulated_gpus)
    except BackendUnavailable as exc:
        return unknown("gpu_health", f"cannot read the GPUs: {exc}", started)
    try:
        readings = [backend.read(g.index) for g in backend.gpus()]
    finally:
        backend.close()
    verdict, reason = verdict_for(health_problems(readings), f"{len(readings)} GPUs healthy")
    return CheckResult("gpu_health", verdict, reason, {"gpus": float(len(readings))}, started, time.time())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=("nvml", "simulated"), default="nvml")
    parser.add_argument("--simulated-gpus", type=int, default=8)


if __name__ == "__main__":
    check_main("gpu_health", __doc__ or "", add_arguments, run)
