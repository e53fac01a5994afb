"""Run a check as its own process, under a deadline. Used by ``vigil check`` and the agent.

The check's process is the unit of failure: a crash, a hang past the deadline, an answer that does
not parse, or an exit code that contradicts the answer all end as UNKNOWN with the reason.
Nothing here imports torch.
"""

from __future__ import annotations

import asyncio
import contextlib
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
        return _no_such_check(name, started)
    proc = subprocess.Popen(
        _command(name, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the check and anything it started (all-reduce workers)
        proc.communicate()
        return _overran(name, deadline_s, started)
    return interpret(name, proc.returncode, out, err, started)


async def run_check_async(name: str, args: list[str] | None = None, deadline_s: float = 120.0) -> CheckResult:
    """``run_check`` for an event loop (the agent): cancelling it ends the check and everything it
    started (the controller stopped it), then the cancellation goes on."""
    started = time.time()
    if name not in CHECKS:
        return _no_such_check(name, started)
    proc = await asyncio.create_subprocess_exec(
        *_command(name, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), deadline_s)
    except (TimeoutError, asyncio.CancelledError) as exc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        if isinstance(exc, asyncio.CancelledError):
            raise
        return _overran(name, deadline_s, started)
    assert proc.returncode is not None  # communicate() returns once the process has exited
    return interpret(name, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"), started)


def _command(name: str, args: list[str] | None) -> list[str]:
    return [sys.executable, "-m", f"checks.{name}", "--json", *(args or [])]


def _no_such_check(name: str, started: float) -> CheckResult:
    return unknown(name, f"no check named {name!r}; available: {', '.join(sorted(CHECKS))}", started)


def _overran(name: str, deadline_s: float, started: float) -> CheckResult:
    return unknown(name, f"did not finish within its {deadline_s:g} s deadline", started)


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
