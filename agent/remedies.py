"""Repairs the agent carries out on its node when the controller sends RunRemedy: a GPU reset, or a
reset of the GPUs' PCIe bus. Off unless the agent's configuration turns them on (``remedies``).

Done as NVIDIA documents it, and as other fleet tools learnt it the hard way:

1. Evidence first, bounded: ``nvidia-smi -q`` for each GPU and the driver's last kernel-log lines.
2. Never while a process uses the GPU: ``nvidia-smi --query-compute-apps`` lists none of them on
   the targets, else the remedy is refused (UNKNOWN, ``figures["busy"] = 1``) and the controller
   waits for the job to leave. The controller pauses the GPU Operator's components on the node
   (their ``nvidia.com/gpu.deploy.*`` labels) before it asks, and restores them after.
3. Persistence mode off on each target first (it holds the device: "In use by another client"),
   restored afterwards, whatever happened.
4. ``nvidia-smi -r -i BUS`` per GPU; a bus reset writes ``bus`` to the device's ``reset_method``
   and ``1`` to its ``reset`` in sysfs (the kernel's secondary bus reset).
5. Each GPU must be listed by ``nvidia-smi`` again, or the remedy failed.

The ``nvidia-smi`` program is configurable (a list: the program and its first arguments); tests
and the scenario benchmark point it at ``tests/fakes/nvidia_smi.py``, which acts on a simulated
node. OK: done; FAIL: failed (the controller climbs the ladder); UNKNOWN: refused or could not run.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog
from pydantic import Field

from protos.vigil.v1 import agent_pb2, common_pb2
from vigil_core.config_file import ConfigModel

log = structlog.get_logger(__name__)

MAX_EVIDENCE_CHARS = 16_384
KERNEL_LINES = 40
REMEDIES = ("gpu_reset", "bus_reset")


class RemediesConfig(ConfigModel):
    enabled: bool = Field(default=False, description="carry out the controller's GPU and bus resets on this node")
    nvidia_smi: tuple[str, ...] = Field(default=("nvidia-smi",), min_length=1, description="the program, as a list")
    pci_sysfs: Path = Field(default=Path("/sys/bus/pci/devices"), description="where a bus reset is asked")


class Refused(Exception):
    """The remedy must not run now (a process uses the GPU): the controller waits and asks again."""


class Failed(Exception):
    """The remedy ran and did not work."""


Run = Callable[[Sequence[str], float], subprocess.CompletedProcess[str]]


def _run(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=max(1.0, timeout_s), check=False)


def full_bus_id(bus: str) -> str:
    """Vigil's ``0000:18:00`` as the kernel and ``nvidia-smi -i`` take it: ``0000:18:00.0``."""
    return bus if bus.count(".") else f"{bus}.0"


def same_gpu(a: str, b: str) -> bool:
    """Bus ids as nvidia-smi (``00000000:18:00.0``) and Vigil (``0000:18:00``) write them."""

    def norm(s: str) -> str:
        domain, _, rest = full_bus_id(s.strip().lower()).partition(":")
        return f"{int(domain, 16):04x}:{rest}" if domain else rest

    try:
        return norm(a) == norm(b)
    except ValueError:
        return False


class Remedies:
    def __init__(
        self,
        node: str,
        config: RemediesConfig,
        gpus: Callable[[], Sequence[str]],
        kernel_log: Path | None = None,
        run: Run = _run,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._node = node
        self._config = config
        self._gpus = gpus  # every GPU's bus id, as the backend reads them
        self._kernel_log = kernel_log
        self._run_program = run
        self._clock = clock
        self._lock = asyncio.Lock()  # one remedy at a time on a node

    async def run(self, request: agent_pb2.RunRemedy) -> common_pb2.CheckResult:
        result = common_pb2.CheckResult(
            request_id=request.request_id, node=self._node, check=request.remedy, started_at=self._clock()
        )
        targets = list(request.pci_bus_ids) or list(self._gpus())
        deadline = self._clock() + (request.deadline_s or 300.0)
        if not self._config.enabled:
            result.verdict, result.reason = common_pb2.UNKNOWN, "remedies are off in this agent's configuration"
        elif request.remedy not in REMEDIES:
            result.verdict, result.reason = common_pb2.UNKNOWN, f"no remedy named {request.remedy!r}: {REMEDIES}"
        else:
            async with self._lock:
                await asyncio.to_thread(self._carry_out, request.remedy, targets, deadline, result)
        result.finished_at = self._clock()
        log.info("remedy_done", remedy=request.remedy, gpus=targets, verdict=common_pb2.Verdict.Name(result.verdict),
                 reason=result.reason[:300], request=request.request_id)  # fmt: skip
        return result

    def _carry_out(self, remedy: str, targets: list[str], deadline: float, result: common_pb2.CheckResult) -> None:
        result.evidence = self._evidence(targets, deadline)[:MAX_EVIDENCE_CHARS]
        try:
            self._not_busy(targets, deadline)
            restore = self._persistence_off(targets, deadline)
            try:
                for bus in targets:
                    self._gpu_reset(bus, deadline) if remedy == "gpu_reset" else self._bus_reset(bus)
            finally:
                unrestored = self._persistence_on(restore, deadline)
            self._present(targets, deadline)
        except Refused as exc:
            result.verdict, result.reason = common_pb2.UNKNOWN, f"refused: {exc}"
            result.figures["busy"] = 1
            return
        except (Failed, OSError, subprocess.TimeoutExpired) as exc:
            result.verdict, result.reason = common_pb2.FAIL, str(exc)[:2000]
            return
        said = "reset" if remedy == "gpu_reset" else "bus reset"
        result.verdict = common_pb2.OK
        result.reason = f"{len(targets)} GPU(s) {said} and present again" + (
            f"; persistence mode not restored on {', '.join(unrestored)}" if unrestored else ""
        )
        result.figures["gpus"] = len(targets)

    def _smi(self, args: Sequence[str], deadline: float) -> subprocess.CompletedProcess[str]:
        return self._run_program([*self._config.nvidia_smi, *args], deadline - self._clock())

    def _evidence(self, targets: list[str], deadline: float) -> str:
        parts = []
        for bus in targets:
            try:
                # At most 30 s of the remedy's time (a deadline, not a duration: a duration here gave
                # every `nvidia-smi -q` 1 s, and a sick GPU's evidence was lost).
                done = self._smi(["-q", "-i", full_bus_id(bus)], min(deadline, self._clock() + 30.0))
                parts.append(f"$ nvidia-smi -q -i {full_bus_id(bus)}\n{(done.stdout or done.stderr)[:4000]}")
            except (OSError, subprocess.TimeoutExpired) as exc:
                parts.append(f"$ nvidia-smi -q -i {full_bus_id(bus)}\n(could not run: {exc})")
        parts.append("$ the driver's last kernel-log lines\n" + "\n".join(self._kernel_lines()))
        return "\n\n".join(parts)

    def _kernel_lines(self) -> list[str]:
        """The driver's last lines in a kernel-log file (not /dev/kmsg: it cannot be read from its end)."""
        path = self._kernel_log
        if path is None or not path.is_file():
            return ["(the kernel log is not a file here)"]
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 262_144))
            lines = f.read().decode("utf-8", "replace").splitlines()
        return [line[:500] for line in lines if "NVRM" in line or "Xid" in line][-KERNEL_LINES:]

    def _not_busy(self, targets: list[str], deadline: float) -> None:
        done = self._smi(["--query-compute-apps=gpu_bus_id,pid,process_name", "--format=csv,noheader"], deadline)
        if done.returncode != 0:
            raise Failed(f"nvidia-smi could not list the GPUs' processes: {done.stderr.strip()[:300]}")
        for line in done.stdout.splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) >= 2 and any(same_gpu(fields[0], t) for t in targets):
                raise Refused(f"pid {fields[1]} ({fields[2] if len(fields) > 2 else '?'}) uses GPU {fields[0]}")

    def _persistence_off(self, targets: list[str], deadline: float) -> list[str]:
        turned_off = []
        for bus in targets:
            query = ["--query-gpu=persistence_mode", "--format=csv,noheader", "-i", full_bus_id(bus)]
            done = self._smi(query, deadline)
            if done.returncode == 0 and done.stdout.strip().lower() == "enabled":
                off = self._smi(["-pm", "0", "-i", full_bus_id(bus)], deadline)
                if off.returncode != 0:
                    raise Failed(f"could not turn persistence mode off on {bus}: {off.stderr.strip()[:300]}")
                turned_off.append(bus)
        return turned_off

    def _persistence_on(self, buses: list[str], deadline: float) -> list[str]:
        """Persistence mode back on where it was; returns where that failed."""
        failed = []
        for bus in buses:
            try:
                if self._smi(["-pm", "1", "-i", full_bus_id(bus)], max(deadline, self._clock() + 10)).returncode:
                    failed.append(bus)
            except (OSError, subprocess.TimeoutExpired):
                failed.append(bus)
        if failed:
            log.error("persistence_mode_not_restored", gpus=failed)
        return failed

    def _gpu_reset(self, bus: str, deadline: float) -> None:
        done = self._smi(["-r", "-i", full_bus_id(bus)], deadline)
        if done.returncode != 0:
            said = (done.stdout + done.stderr).strip().replace("\n", " ")[:500]
            raise Failed(f"nvidia-smi -r -i {full_bus_id(bus)} exited {done.returncode}: {said}")

    def _bus_reset(self, bus: str) -> None:
        device = self._config.pci_sysfs / full_bus_id(bus)
        if not device.is_dir():
            raise Failed(f"no PCI device {device}")
        (device / "reset_method").write_text("bus\n")
        (device / "reset").write_text("1\n")

    def _present(self, targets: list[str], deadline: float) -> None:
        done = self._smi(["--query-gpu=pci.bus_id", "--format=csv,noheader"], deadline)
        listed = done.stdout.splitlines() if done.returncode == 0 else []
        missing = [t for t in targets if not any(same_gpu(line, t) for line in listed)]
        if missing:
            raise Failed(f"GPU(s) {', '.join(missing)} not listed by nvidia-smi after the reset")


MAX_RESULT_BYTES = 4096  # a Kubernetes container's termination message


def result_json(result: common_pb2.CheckResult, limit: int = MAX_RESULT_BYTES) -> str:
    """A remedy's result as one JSON object within ``limit`` bytes (the evidence cut first): what
    ``vigil remedy`` writes for the controller to read back from a Job's termination message."""
    body = {
        "remedy": result.check,
        "verdict": common_pb2.Verdict.Name(result.verdict),
        "reason": result.reason[:1500],
        "busy": bool(result.figures.get("busy", 0)),
        "finished_at": result.finished_at,  # the node's clock: a fault it observed later came after the step
        "evidence": result.evidence,
    }
    text = json.dumps(body)
    if len(text.encode()) > limit:
        room = max(0, limit - len(json.dumps(body | {"evidence": ""}).encode()) - 64)
        body["evidence"] = result.evidence[: room // 2] + " [cut]"  # non-ASCII may double in JSON
        text = json.dumps(body)
    return text


def exit_code(result: common_pb2.CheckResult) -> int:
    """0 done, 1 failed, 2 refused or could not run (the checks' contract)."""
    return {common_pb2.OK: 0, common_pb2.FAIL: 1}.get(result.verdict, 2)


def listed_gpus(nvidia_smi: Sequence[str]) -> list[str]:
    """Every GPU's bus id as nvidia-smi lists it (a command line's default: the node's every GPU)."""
    done = _run([*nvidia_smi, "--query-gpu=pci.bus_id", "--format=csv,noheader"], 60.0)
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []
