"""GPU matmul burn: the TFLOP/s each GPU sustains on large bf16 products (fp32 on a CPU), against the
model's dense peak and against the other GPUs of the node.

    python -m checks.matmul [--size 8192] [--seconds 10] [--min-fraction 0.5] [--json]
"""

from __future__ import annotations

import argparse
import time

from checks.devices import Device
from checks.per_device import per_device_check
from checks.program import check_main
from checks.result import CheckResult


def matmul_tflops(device: Device, size: int, seconds: float) -> float:
    import torch

    dtype = torch.float32 if device.index < 0 else torch.bfloat16
    a = torch.randn(size, size, dtype=dtype, device=device.torch_device)
    b = torch.randn(size, size, dtype=dtype, device=device.torch_device)

    def sync() -> None:
        if device.index >= 0:
            torch.cuda.synchronize(device.torch_device)

    for _ in range(3):  # warm-up: kernels chosen, clocks up
        torch.matmul(a, b)
    sync()
    runs, start = 0, time.perf_counter()
    while True:
        for _ in range(10):
            torch.matmul(a, b)
        runs += 10
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2.0 * size**3 * runs / elapsed / 1e12


def run(args: argparse.Namespace) -> CheckResult:
    def size(on_cpu: bool) -> int:
        return int(args.size or (1024 if on_cpu else 8192))

    return per_device_check(
        "matmul",
        args,
        lambda d: matmul_tflops(d, size(d.index < 0), args.seconds),
        0,
        "TFLOP/s",
        "tflops",
        lambda cpu: f"{'fp32' if cpu else 'bf16'} {size(cpu)}x{size(cpu)}",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", type=int, default=0, help="matrix size (default 8192 on GPU, 1024 on CPU)")
    parser.add_argument("--seconds", type=float, default=10.0, help="burn time per device")
    parser.add_argument("--min-fraction", type=float, default=0.5, help="FAIL below this share of the model's peak")
    parser.add_argument("--max-below-median", type=float, default=0.15, help="FAIL this far below the node's median")


if __name__ == "__main__":
    check_main("matmul", __doc__ or "", add_arguments, run)
