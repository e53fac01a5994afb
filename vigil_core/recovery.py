"""The driver's GPU recovery action: what XID 154's line says the GPU needs now, and what NVML
reports as ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (the same numbers). The agent writes NVML's in
the driver's words (``recovery_line``); the controller reads either (``recovery_action``). Pure."""

from __future__ import annotations

import re
from enum import StrEnum


class RecoveryAction(StrEnum):
    """The driver's GPU recovery action (XID 154's text; NVML's ``nvmlGpuRecoveryAction_t``, whose
    numbers are the order below, and ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``)."""

    NONE = "none"
    GPU_RESET = "gpu_reset"
    NODE_REBOOT = "node_reboot"
    DRAIN_P2P = "drain_p2p"
    DRAIN_AND_RESET = "drain_and_reset"
    RECOVER_IMEX_DOMAIN = "recover_imex_domain"
    BUS_RESET = "bus_reset"
    SYSTEM_REBOOT = "system_reboot"

    @classmethod
    def numbered(cls, number: int) -> RecoveryAction | None:
        """NVML's number for it (0 none, 1 GPU reset, ... 7 system reboot); None for one we do not know."""
        actions = list(cls)
        return actions[number] if 0 <= number < len(actions) else None

    @property
    def said(self) -> str:
        """As the driver's XID 154 line prints it."""
        return _SAID[self]


_SAID = {
    RecoveryAction.NONE: "None",
    RecoveryAction.GPU_RESET: "GPU Reset Required",
    RecoveryAction.NODE_REBOOT: "Node Reboot Required",
    RecoveryAction.DRAIN_P2P: "Drain P2P",
    RecoveryAction.DRAIN_AND_RESET: "Drain and Reset",
    RecoveryAction.RECOVER_IMEX_DOMAIN: "Recover IMEX Domain",
    RecoveryAction.BUS_RESET: "Bus Reset",
    RecoveryAction.SYSTEM_REBOOT: "System Reboot",
}


def recovery_line(before: int, now: int) -> str:
    """NVML's recovery action changed from ``before`` to ``now`` (its numbers), in the words and
    numbers the driver's XID 154 line carries, so both are read alike (``recovery_action``)."""

    def said(number: int) -> str:
        action = RecoveryAction.numbered(number)
        return f"0x{number:x} ({action.said if action is not None else 'Unknown'})"

    return f"GPU recovery action changed from {said(before)} to {said(now)}"


# The words drivers print, lower-cased, for when the number alone is not enough.
_WORDS: tuple[tuple[str, RecoveryAction], ...] = (
    ("drain and reset", RecoveryAction.DRAIN_AND_RESET),
    ("drain p2p", RecoveryAction.DRAIN_P2P),
    ("imex", RecoveryAction.RECOVER_IMEX_DOMAIN),
    ("bus reset", RecoveryAction.BUS_RESET),
    ("flr", RecoveryAction.GPU_RESET),  # "PF FLR": a function-level reset of the GPU's PCIe function
    ("system reboot", RecoveryAction.SYSTEM_REBOOT),
    ("os reboot", RecoveryAction.SYSTEM_REBOOT),
    ("node reboot", RecoveryAction.NODE_REBOOT),
    ("reboot", RecoveryAction.NODE_REBOOT),
    ("reset", RecoveryAction.GPU_RESET),
    ("none", RecoveryAction.NONE),
)
_CHANGED_TO = re.compile(r"\bto\s+(0x[0-9a-fA-F]+|\d+)\s*(?:\(([^)]*)\))?")


def recovery_action(text: str) -> RecoveryAction | None:
    """The recovery action an XID 154 line says the GPU needs now; None when it names none we know.
    The words win over the number where both are there (drivers have printed "0x1 (PF FLR)"). Pure."""
    match = _CHANGED_TO.search(text)
    if match is None:
        return None
    words = (match.group(2) or "").strip().lower()
    for said, action in _WORDS:
        if said in words:
            return action
    return RecoveryAction.numbered(int(match.group(1), 0))
