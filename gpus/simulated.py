"""A simulated GPU backend for the demo and tests: N GPUs with real-looking PCI bus ids and UUIDs,
healthy until their state is changed (``set_faults``, ``add_xid``), in process or, for agents run
as processes (the demo, the scenario benchmark), through a *fault file*: JSON lines appended while
the agent runs, read as they come, each one of

    {"gpu": 2, "xid": 48, "message": "..."}       an XID event, as NVML reports it
    {"gpu": 2, "set": {"remap_pending": true}}    the GPU reports this from now on (GpuFaults' fields)
    {"gpu": 2, "reset": true}                     the GPU was reset: healthy again (a fake nvidia-smi writes it)

A line that cannot be used is logged with what is wrong and skipped.

It is a named backend (``gpu_backend: simulated``), not a stand-in for testing the NVML code.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, fields, replace
from pathlib import Path

import structlog

from gpus.backend import NVLINK_COUNTERS, GpuReading, XidEvent
from vigil_core.signals import GpuRef

log = structlog.get_logger(__name__)

# Bus ids of the eight GPUs of an HGX H100 board, as `nvidia-smi` shows them on DGX H100.
_HGX_BUS_IDS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
_UUID_NAMESPACE = uuid.UUID("6f1d3b52-6a39-4c55-9a0e-8c51a7c43a10")


def simulated_gpus(node: str, count: int) -> list[GpuRef]:
    """The GPUs a simulated node has: deterministic, so a test or the demo can name them."""
    gpus = []
    for index in range(count):
        bus = _HGX_BUS_IDS[index % 8]
        domain = index // 8
        uid = uuid.uuid5(_UUID_NAMESPACE, f"{node}/{index}")
        gpus.append(GpuRef(index=index, uuid=f"GPU-{uid}", pci_bus_id=f"{domain:04x}:{bus}:00"))
    return gpus


@dataclass
class GpuFaults:
    """What one simulated GPU reports besides its healthy readings."""

    lost: bool = False
    ecc_dbe: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    throttle_reasons: int = 0
    nvlink_crc: int = 0
    pcie_replays: int = 0
    pcie_width: int = 16
    fabric_failed: bool = False  # its NVLink fabric registration completed with an error
    recovery_action: int = 0  # what the driver says it needs (NVML's numbers: 0 none, 2 node reboot, ...)
    hang: threading.Event | None = None  # set: reads of this GPU block until it is cleared


class SimulatedBackend:
    name = "simulated"

    def __init__(
        self, node: str, gpu_count: int = 8, clock: object = time.time, fault_file: Path | None = None
    ) -> None:
        if gpu_count < 1:
            raise ValueError("a simulated node needs at least one GPU")
        self._gpus = simulated_gpus(node, gpu_count)
        self._faults = [GpuFaults() for _ in self._gpus]
        self._events: list[XidEvent] = []
        self._lock = threading.Lock()
        self._clock = clock
        self._fault_file = fault_file
        self._fault_file_offset = 0
        self._fault_file_lock = threading.Lock()  # the poll and the event drain both read it

    def gpus(self) -> list[GpuRef]:
        return list(self._gpus)

    def read(self, index: int) -> GpuReading:
        self._read_fault_file()
        gpu = self._gpus[index]
        with self._lock:
            faults = replace(self._faults[index])
        if faults.hang is not None:
            faults.hang.wait()  # a wedged driver: the call does not come back
        if faults.lost:
            return GpuReading(gpu=gpu, lost=True, lost_reason="simulated: GPU is lost")
        return GpuReading(
            gpu=gpu,
            name="NVIDIA H100 80GB HBM3 (simulated)",
            temperature_c=34.0 + index,
            power_w=72.0,
            sm_clock_mhz=1980.0,
            memory_clock_mhz=2619.0,
            utilization_pct=0.0,
            memory_used_bytes=0,
            memory_total_bytes=81559 << 20,
            ecc_volatile_corrected=0,
            ecc_volatile_uncorrected=faults.ecc_dbe,
            ecc_aggregate_corrected=0,
            ecc_aggregate_uncorrected=faults.ecc_dbe,
            retired_pages_sbe=None,  # H100 remaps rows instead of retiring pages
            retired_pages_dbe=None,
            retired_pages_pending=None,
            remapped_rows_corrected=0,
            remapped_rows_uncorrected=1 if faults.remap_pending or faults.remap_failure else 0,
            remap_pending=faults.remap_pending,
            remap_failure=faults.remap_failure,
            throttle_reasons=faults.throttle_reasons,
            throttle_ns=None,
            nvlink_errors={
                (link, c): (faults.nvlink_crc if c == "crc_flit" and link == 0 else 0)
                for link in range(18)
                for c in NVLINK_COUNTERS
            },
            nvlink_links_down=(),
            pcie_replays=faults.pcie_replays,
            pcie_generation=5,
            pcie_generation_max=5,
            pcie_width=faults.pcie_width,
            pcie_width_max=16,
            fabric_state=3 if faults.fabric_failed else None,  # NVML_GPU_FABRIC_STATE_COMPLETED
            fabric_status=999 if faults.fabric_failed else None,  # NVML_ERROR_UNKNOWN
            recovery_action=faults.recovery_action,
        )

    def drain_xid_events(self) -> list[XidEvent]:
        self._read_fault_file()
        with self._lock:
            events, self._events = self._events, []
        return events

    def events_progress(self) -> float | None:
        return None  # events are injected, not waited for: there is no listener to wedge

    def close(self) -> None:
        self.release_hangs()

    # The GPUs' state -------------------------------------------------------------------------

    def set_faults(self, index: int, **changes: object) -> None:
        """Change what GPU ``index`` reports from now on (``GpuFaults``' fields; tests' fault
        injection, ``tests.fakes.gpu_faults``, is written on this)."""
        with self._lock:
            self._faults[index] = replace(self._faults[index], **changes)  # type: ignore[arg-type]

    def faults(self, index: int) -> GpuFaults:
        with self._lock:
            return replace(self._faults[index])

    def add_xid(self, index: int, code: int, message: str = "") -> None:
        """An XID event on GPU ``index``, as NVML's event set reports it."""
        now = self._clock()  # type: ignore[operator]
        with self._lock:
            self._events.append(XidEvent(self._gpus[index], code, now, message))

    def _read_fault_file(self) -> None:
        """Apply the fault file's new complete lines (a line still being written waits)."""
        if self._fault_file is None:
            return
        with self._fault_file_lock:
            try:
                with open(self._fault_file, "rb") as f:
                    f.seek(self._fault_file_offset)
                    data = f.read()
            except FileNotFoundError:
                return
            complete = data[: data.rfind(b"\n") + 1]
            self._fault_file_offset += len(complete)
        for raw in complete.splitlines():
            if raw.strip():
                problem = self._apply_fault_line(raw)
                if problem:
                    log.error("simulated_fault_line_refused", file=str(self._fault_file), problem=problem)

    def _apply_fault_line(self, raw: bytes) -> str:
        """Apply one fault-file line; returns what is wrong with it ('' when it was applied)."""
        try:
            line = json.loads(raw)
        except ValueError as exc:
            return f"not JSON: {exc}"
        if not isinstance(line, dict):
            return "not a JSON object"
        gpu = line.get("gpu")
        if not isinstance(gpu, int) or not 0 <= gpu < len(self._gpus):
            return f"gpu {gpu!r} is not one of this node's {len(self._gpus)} GPUs"
        if line.get("reset") is True:
            self.release_hangs(gpu)
            self.set_faults(gpu, **{f.name: f.default for f in fields(GpuFaults)})
            return ""
        if "xid" in line:
            code = line["xid"]
            if not isinstance(code, int) or not 0 < code < 1 << 16:
                return f"xid {code!r} is not an XID code"
            self.add_xid(gpu, code, str(line.get("message", "")))
            return ""
        changes = line.get("set")
        allowed = {f.name: f.type for f in fields(GpuFaults) if f.name != "hang"} | {"hang": "bool"}
        if not isinstance(changes, dict) or not changes:
            return 'needs "xid" or a non-empty "set" object'
        unknown = sorted(set(changes) - set(allowed))
        if unknown:
            return f"unknown fields {unknown}; known: {sorted(allowed)}"
        bad = [k for k, v in changes.items() if type(v) is not (bool if allowed[k] == "bool" else int)]
        if bad:
            return f"{bad[0]} must be {'true or false' if allowed[bad[0]] == 'bool' else 'an integer'}"
        if "hang" in changes:  # true: reads of this GPU block (a wedged driver) until a line says false
            hang = changes.pop("hang")
            if hang and self.faults(gpu).hang is None:
                self.set_faults(gpu, hang=threading.Event())
            elif not hang:
                self.release_hangs(gpu)
        if changes:
            self.set_faults(gpu, **changes)
        return ""

    def release_hangs(self, index: int | None = None) -> None:
        with self._lock:
            for i, faults in enumerate(self._faults):
                if faults.hang is not None and index in (None, i):
                    faults.hang.set()
                    faults.hang = None
