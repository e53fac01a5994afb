"""The workload checks against what the hardware does without them, as ratios.

    python -m bench.gpu_checks [--seconds 10] [--mib 1024]

- matmul: the check's TFLOP/s per device (run as ``vigil check matmul`` runs it: its own process)
  against the model's dense bf16 peak (``checks.devices.GPU_PEAKS``; an H100 SXM reaches about
  790-800 of its 989 on large products);
- membw: the check's copy bandwidth per device against a plain device-to-device copy timed here
  with CUDA events (bytes read + written), side by side: the ratio shows what the check's own
  measuring costs.

On a machine without a GPU both run on the CPU (fp32, no peak to compare with); the copy ratio still
means the same. Figures are printed and appended to bench/results/gpu_checks.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from bench.record import append_result, header
from checks.result import Verdict
from checks.runner import run_check
from controller.sweeps.judge import device_figures


def plain_copy_gbps(torch_device: str, nbytes: int, iters: int) -> float:
    """A device-to-device copy timed with CUDA events (perf_counter on the CPU): the baseline."""
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8, device=torch_device)  # touched: no zero pages to read
    dst = torch.empty_like(src)
    dst.copy_(src)
    if torch_device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            dst.copy_(src)
        seconds = time.perf_counter() - t0
    return 2.0 * nbytes * iters / seconds / 1e9


def torch_device(label: str) -> str:
    """The checks label devices "GPU3" (or "CPU"): the torch device of that label."""
    return "cpu" if label == "CPU" else f"cuda:{int(label.removeprefix('GPU'))}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="matmul burn time per device")
    parser.add_argument("--mib", type=int, default=1024, help="copy buffer size")
    parser.add_argument("--iters", type=int, default=50, help="copies per measurement")
    args = parser.parse_args()
    import torch

    on_gpu = torch.cuda.is_available()
    matmul = run_check("matmul", ["--seconds", str(args.seconds)], deadline_s=60 + 20 * args.seconds)
    membw = run_check("membw", ["--mib", str(args.mib), "--iters", str(args.iters)], deadline_s=600)
    if Verdict.UNKNOWN in (matmul.verdict, membw.verdict):
        print(f"a check could not run: matmul: {matmul.reason}; membw: {membw.reason}", file=sys.stderr)
        return 1
    tflops = device_figures(matmul, "tflops")
    peak = matmul.figures.get("expected_peak_tflops")
    copies = device_figures(membw, "gbps")
    devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if on_gpu else ["cpu"]
    plain = {
        label: plain_copy_gbps(d, args.mib * 2**20, args.iters)
        for label, d in zip(sorted(copies), devices, strict=True)
    }
    per_device: dict[str, dict[str, Any]] = {}
    for label in sorted(copies, key=lambda k: (len(k), k)):
        per_device[label] = {
            "matmul_tflops": round(tflops[label], 2),
            "matmul_of_peak": round(tflops[label] / peak, 3) if peak else None,
            "membw_check_gbps": round(copies[label], 1),
            "plain_copy_gbps": round(plain[label], 1),
            "check_over_plain": round(copies[label] / plain[label], 3),
        }
    record = {
        **header("gpu_checks", torch=torch.__version__, gpu=torch.cuda.get_device_name(0) if on_gpu else "none (CPU)"),
        "peak_tflops": peak,
        "devices": per_device,
        "matmul_reason": matmul.reason,
        "membw_reason": membw.reason,
    }
    print(json.dumps(record, indent=2))
    for label, d in per_device.items():
        of_peak = f" = {d['matmul_of_peak']:.0%} of the {peak:g} peak" if peak else " (no peak figure for a CPU)"
        print(
            f"{label}: matmul {d['matmul_tflops']:.4g} TFLOP/s{of_peak}; copy {d['membw_check_gbps']:.4g} GB/s "
            f"by the check vs {d['plain_copy_gbps']:.4g} GB/s plain = x{d['check_over_plain']:.3f}"
        )
    append_result("gpu_checks", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
