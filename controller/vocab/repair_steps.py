"""The rungs of the repair ladder (``controller.repairs``), named here so that a policy rule can give
its faults a ladder of their own (``ladder:``). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum


class RepairStep(StrEnum):
    """A rung of the ladder, mildest first."""

    RECHECK = "recheck"  # nothing to do on the node: certify it again
    GPU_RESET = "gpu_reset"  # the agent resets the faulted GPUs (nvidia-smi -r)
    BUS_RESET = "bus_reset"  # the agent resets their PCIe bus (the kernel's secondary bus reset)
    REBOOT = "reboot"  # the node is rebooted by the configured executor
    REPLACE = "replace"  # hands: a person repairs or replaces it (paged, a ticket opened)

    @property
    def on_agent(self) -> bool:
        """Carried out by the node's own agent."""
        return self in (RepairStep.GPU_RESET, RepairStep.BUS_RESET)

    @property
    def said(self) -> str:
        return _SAID[self]


_SAID = {
    RepairStep.RECHECK: "re-check",
    RepairStep.GPU_RESET: "GPU reset",
    RepairStep.BUS_RESET: "PCIe bus reset",
    RepairStep.REBOOT: "node reboot",
    RepairStep.REPLACE: "replace (hands needed)",
}
ORDER: tuple[RepairStep, ...] = tuple(RepairStep)


def check_ladder(ladder: Sequence[RepairStep]) -> tuple[RepairStep, ...]:
    """A ladder as configured: at least one rung, mildest first, each once; raises ValueError."""
    if not ladder:
        raise ValueError("a ladder needs at least one rung")
    if list(ladder) != sorted(set(ladder), key=ORDER.index):
        raise ValueError(f"rungs go mildest first, each once: {', '.join(s.value for s in ORDER)}")
    return tuple(ladder)
