"""Run a check as its own process, under a deadline. Used by ``vigil check`` and the agent.

The check's process is the unit of failure: a crash, a hang past the deadline, an answer that does
not parse, or an exit code that contradicts the answer all end as UNKNOWN with the reason.
Nothing here imports torch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from checks.result import CheckResult, Verdict, unknown

CHECKS = {
    "gpu_health": "NVML health snapshot of every GPU (ECC, row remap, lost, NVLink, PCIe, throttling)",
    "matmul": "GPU matmul burn: TFLOP/s per GPU (bf16; fp32 on CPU) against the model's figure and the node",
    "membw": "device memory bandwidth (device-to-device copy) per GPU against the model's figure and the node",
    "allreduce": "all-reduce bus bandwidth over message sizes (NCCL on GPUs, gloo on CPU), as nccl-tests counts it",
}


def run_check(name: str, args: list[str] | None = None, deadline_s: float = 120.0) -> CheckResult:
    started = time.time()
    if name not in CHECKS:
        return unknown(name, f"no check named {name!r}; available: {', '.join(sorted(CHECKS))}", started)
    command = [sys.executable, "-m", f"checks.{name}", "--json", *(args or [])]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the check and anything it started (all-reduce workers)
        proc.communicate()
        return unknown(name, f"did not finish within its {deadline_s:g} s deadline", started)
    return interpret(name, proc.returncode, out, err, started)


def interpret(name: str, returncode: int, stdout: str, stderr: str, started: float) -> CheckResult:
    """The check's answer, or UNKNOWN with why there is none. Pure."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    tail = stderr.strip().splitlines()[-3:]
    if not lines:
        return unknown(name, f"exited {returncode} without an answer: {' | '.join(tail) or 'no output'}", started)
    try:
        result = CheckResult.from_json(lines[-1])
    except (ValueError, KeyError, TypeError) as exc:
        return unknown(name, f"answered something unreadable ({exc})", started)
    if result.verdict.exit_code != returncode:
        return unknown(name, f"answered {result.verdict.value} but exited {returncode}", started)
    if result.verdict is Verdict.OK and result.check != name:
        return unknown(name, f"answered for {result.check!r}", started)
    return result
