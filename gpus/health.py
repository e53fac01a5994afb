"""When a GPU reading is unhealthy: the rules the agent's ``gpu_health`` answer and the standalone
``python -m checks.gpu_health`` share. Pure."""

from __future__ import annotations

from gpus.backend import GpuReading, fabric_failure
from vigil_core.recovery import RecoveryAction
from vigil_core.signals import THROTTLE_HARMFUL_MASK, throttle_reason_names

BUSY_UTILIZATION_PCT = 50.0


def pcie_degradation(r: GpuReading) -> str:
    """A description when the link runs below its maximum width (or generation while busy)."""
    problems = []
    if r.pcie_width is not None and r.pcie_width_max is not None and r.pcie_width < r.pcie_width_max:
        problems.append(f"width x{r.pcie_width} of x{r.pcie_width_max}")
    busy = (r.utilization_pct or 0.0) >= BUSY_UTILIZATION_PCT
    gen, gen_max = r.pcie_generation, r.pcie_generation_max
    if busy and gen is not None and gen_max is not None and gen < gen_max:
        problems.append(f"generation {gen} of {gen_max} under load")
    return ", ".join(problems)


def health_problems(readings: list[GpuReading]) -> list[str]:
    problems = []
    for r in readings:
        name = f"GPU {r.gpu.index}"
        if r.lost:
            problems.append(f"{name} is lost")
            continue
        if r.remap_failure:
            problems.append(f"{name} row remap failure")
        if r.remap_pending:
            problems.append(f"{name} row remap pending")
        if r.ecc_volatile_uncorrected:
            problems.append(f"{name} has {r.ecc_volatile_uncorrected} uncorrectable ECC error(s) since driver load")
        if r.retired_pages_pending:
            problems.append(f"{name} has a page retirement pending")
        if r.nvlink_links_down:
            problems.append(f"{name} NVLink(s) {list(r.nvlink_links_down)} down")
        if status := fabric_failure(r):
            problems.append(f"{name} NVLink fabric registration failed (NVML status {status})")
        if degraded := pcie_degradation(r):
            problems.append(f"{name} PCIe link degraded: {degraded}")
        if r.recovery_action:  # the driver says the GPU needs a reset or a reboot before it is well
            action = RecoveryAction.numbered(r.recovery_action)
            problems.append(f"{name} needs a recovery action: {action.said if action else r.recovery_action}")
        if harmful := (r.throttle_reasons or 0) & THROTTLE_HARMFUL_MASK:
            problems.append(f"{name} throttled ({throttle_reason_names(harmful)})")
    return problems
