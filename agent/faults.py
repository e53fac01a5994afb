"""What in a GPU reading is a fault, and which signals a change of it makes. Pure functions.

A reading is reduced to a small ``FaultState``; signals come from transitions between two fault
states of the same GPU, so a steady fault is reported once, not once per poll. The fault state is
also what the agent persists with its spool, so a restarted agent diffs against what it had
already reported and neither repeats nor misses a fault.

First reading of a GPU (no earlier state): faults that hold now are reported (a pending row remap,
uncorrected ECC errors since the driver loaded, a lost GPU, a degraded PCIe link); cumulative
counters (NVLink errors, PCIe replays, retired pages) only set the baseline, since their history
predates the agent. A counter that goes down (a driver reload clears volatile counts) sets a new
baseline without a signal. A field that becomes unavailable keeps its last value.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from gpus.backend import GpuReading, fabric_failure
from gpus.health import pcie_degradation
from vigil_core.recovery import recovery_line
from vigil_core.signals import GpuRef, Signal, SignalKind

# Below this utilisation a PCIe link trains down to save power: a lower generation is normal.


@dataclass(frozen=True, slots=True)
class FaultState:
    lost: bool = False
    ecc_uncorrected: int | None = None
    retired_dbe: int | None = None
    retired_pending: bool = False
    remap_pending: bool = False
    remap_failure: bool = False
    nvlink_errors: int | None = None
    nvlink_down: tuple[int, ...] = ()
    pcie_replays: int | None = None
    pcie_degraded: str = ""
    fabric_failed: int = 0  # NVML's status of a failed fabric registration
    recovery_action: int = 0  # the driver's GPU recovery action (NVML's number; 0: none)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FaultState:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if "nvlink_down" in values:
            values["nvlink_down"] = tuple(values["nvlink_down"])
        return cls(**values)


def fault_state(reading: GpuReading, before: FaultState | None) -> FaultState:
    """The fault state a reading shows; unavailable fields keep what ``before`` had."""
    prior = before or FaultState()
    if reading.lost:
        return replace(prior, lost=True)
    ecc = reading.ecc_volatile_uncorrected
    if ecc is None:
        ecc = reading.ecc_aggregate_uncorrected
    nvlink = sum(reading.nvlink_errors.values()) if reading.nvlink_errors is not None else None
    return FaultState(
        lost=False,
        ecc_uncorrected=_keep(ecc, prior.ecc_uncorrected),
        retired_dbe=_keep(reading.retired_pages_dbe, prior.retired_dbe),
        retired_pending=_keep(reading.retired_pages_pending, prior.retired_pending),
        remap_pending=_keep(reading.remap_pending, prior.remap_pending),
        remap_failure=_keep(reading.remap_failure, prior.remap_failure),
        nvlink_errors=_keep(nvlink, prior.nvlink_errors),
        nvlink_down=_keep(reading.nvlink_links_down, prior.nvlink_down),
        pcie_replays=_keep(reading.pcie_replays, prior.pcie_replays),
        pcie_degraded=pcie_degradation(reading),
        fabric_failed=fabric_failure(reading),
        recovery_action=_keep(reading.recovery_action, prior.recovery_action),
    )


def _keep(value: Any, prior: Any) -> Any:
    return prior if value is None else value


def diff_faults(
    node: str, gpu: GpuRef, before: FaultState | None, now: FaultState, at: float, source: str = "gpu-poll"
) -> list[Signal]:
    def signal(kind: SignalKind, value: float, message: str) -> Signal:
        return Signal(node, kind, gpu, 0, value, message, source, at)

    b = before or FaultState()
    first = before is None
    if now.lost:
        return [] if b.lost and not first else [signal(SignalKind.GPU_LOST, 1, "GPU is lost")]
    out = []
    if (grew := _growth(b.ecc_uncorrected, now.ecc_uncorrected, count_from_zero=first)) > 0:
        out.append(signal(SignalKind.ECC_DBE, grew, f"{grew} new uncorrectable (double-bit) ECC error(s)"))
    if now.remap_pending and not b.remap_pending:
        out.append(signal(SignalKind.ROW_REMAP_PENDING, 1, "row remap pending: the GPU needs a reset"))
    if now.remap_failure and not b.remap_failure:
        out.append(signal(SignalKind.ROW_REMAP_FAILURE, 1, "row remap failure: no spare rows left"))
    retired = _growth(b.retired_dbe, now.retired_dbe, count_from_zero=False)
    if retired > 0 or (now.retired_pending and not b.retired_pending):
        out.append(
            signal(SignalKind.RETIRED_PAGES, retired, f"{retired} page(s) newly retired; pending={now.retired_pending}")
        )
    new_down = sorted(set(now.nvlink_down) - set(b.nvlink_down))
    if (grew := _growth(b.nvlink_errors, now.nvlink_errors, count_from_zero=False)) > 0 or new_down:
        down = f"; link(s) {new_down} down" if new_down else ""
        out.append(signal(SignalKind.NVLINK_ERRORS, grew, f"{grew} new NVLink error(s){down}"))
    if (grew := _growth(b.pcie_replays, now.pcie_replays, count_from_zero=False)) > 0:
        out.append(signal(SignalKind.PCIE_REPLAY, grew, f"{grew} new PCIe replay(s)"))
    if now.pcie_degraded and now.pcie_degraded != b.pcie_degraded:
        out.append(signal(SignalKind.PCIE_LINK_DEGRADED, 1, f"PCIe link degraded: {now.pcie_degraded}"))
    if now.recovery_action != b.recovery_action:  # said as XID 154 says it, decided the same way
        out.append(_recovery_signal(node, gpu, b.recovery_action, now.recovery_action, at, source))
    if now.fabric_failed and not b.fabric_failed:
        what = f"NVLink fabric registration failed (NVML status {now.fabric_failed}): its NVLink peers are unreachable"
        out.append(signal(SignalKind.GPU_FABRIC_FAILED, now.fabric_failed, what))
    return out


def _recovery_signal(node: str, gpu: GpuRef, before: int, now: int, at: float, source: str) -> Signal:
    """NVML's recovery action changed: said in the words and numbers the driver's XID 154 line carries."""
    return Signal(node, SignalKind.XID, gpu, 154, float(now), f"{recovery_line(before, now)} (NVML)", source, at)


def _growth(before: int | None, now: int | None, count_from_zero: bool) -> int:
    if now is None:
        return 0
    if before is None:
        return now if count_from_zero else 0
    return max(0, now - before)


class FaultTracker:
    """Each GPU's last fault state, and the signals a new reading of it makes. One per source."""

    def __init__(self, node: str, source: str) -> None:
        self._node = node
        self._source = source
        self.states: dict[str, FaultState] = {}  # GpuRef.key -> state; persisted by the collector

    def observe(self, reading: GpuReading, at: float) -> list[Signal]:
        key = reading.gpu.key
        before = self.states.get(key)
        state = fault_state(reading, before)
        self.states[key] = state
        return diff_faults(self._node, reading.gpu, before, state, at, self._source)
