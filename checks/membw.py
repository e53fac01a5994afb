"""Device memory bandwidth: a device-to-device copy of a large buffer, per GPU, against the model's
HBM figure and the other GPUs of the node. Bandwidth counts the bytes read and the bytes written.

    python -m checks.membw [--mib 1024] [--iters 50] [--json]
"""

from __future__ import annotations

import argparse
import time

from checks.devices import Device
from checks.per_device import per_device_check
from checks.program import check_main
from checks.result import CheckResult


def copy_gbps(device: Device, nbytes: int, iters: int) -> float:
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device.torch_device).random_(0, 255)
    dst = torch.empty_like(src)

    def sync() -> None:
        if device.index >= 0:
            torch.cuda.synchronize(device.torch_device)

    dst.copy_(src)
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    sync()
    return 2.0 * nbytes * iters / (time.perf_counter() - start) / 1e9


def run(args: argparse.Namespace) -> CheckResult:
    def mib(on_cpu: bool) -> int:
        return int(args.mib or (256 if on_cpu else 1024))

    return per_device_check(
        "membw",
        args,
        lambda d: copy_gbps(d, mib(d.index < 0) * 2**20, args.iters),
        1,
        "GB/s",
        "gbps",
        lambda cpu: f"copy of {mib(cpu)} MiB",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mib", type=int, default=0, help="buffer size (default 1024 MiB on GPU, 256 on CPU)")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--min-fraction", type=float, default=0.6, help="FAIL below this share of the HBM figure")
    parser.add_argument("--max-below-median", type=float, default=0.15, help="FAIL this far below the node's median")


if __name__ == "__main__":
    check_main("membw", __doc__ or "", add_arguments, run)
