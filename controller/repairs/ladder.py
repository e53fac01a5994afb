"""Which repair a quarantined node gets, as data: the ladder. Pure.

A ladder is the rungs a node's repair climbs, mildest first, from the one its faults ask for:
re-check only → GPU reset → PCIe bus reset → node reboot → replace (a person's hands). The first
rung comes from what the driver itself says recovers the GPU: the recovery action (NVML's, or the
one XID 154's text names), else NVIDIA's Xid catalog bucket for the code, else the signal kind's
own. A step that fails or times out climbs to the next rung; "replace" pages a person. Where the
node has faults of several kinds, the repair starts at the highest rung any of them needs. The
configuration can give a code or a kind a ladder of its own (``by_xid``, ``by_kind``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from controller.vocab.xid_catalog import CATALOG, RECOVERY_XID, Bucket
from vigil_core.recovery import RecoveryAction, recovery_action
from vigil_core.signals import SignalKind


class Step(StrEnum):
    """A rung of the ladder, mildest first."""

    RECHECK = "recheck"  # nothing to do on the node: certify it again
    GPU_RESET = "gpu_reset"  # the agent resets the faulted GPUs (nvidia-smi -r)
    BUS_RESET = "bus_reset"  # the agent resets their PCIe bus (the kernel's secondary bus reset)
    REBOOT = "reboot"  # the node is rebooted by the configured executor
    REPLACE = "replace"  # hands: a person repairs or replaces it (paged, a ticket opened)

    @property
    def on_agent(self) -> bool:
        """Carried out by the node's own agent."""
        return self in (Step.GPU_RESET, Step.BUS_RESET)

    @property
    def said(self) -> str:
        return _SAID[self]


_SAID = {
    Step.RECHECK: "re-check",
    Step.GPU_RESET: "GPU reset",
    Step.BUS_RESET: "PCIe bus reset",
    Step.REBOOT: "node reboot",
    Step.REPLACE: "replace (hands needed)",
}
ORDER: tuple[Step, ...] = tuple(Step)

# What the driver's recovery action asks for. Draining P2P needs no work on the node once its job
# has left: re-check it. The IMEX domain spans nodes: a person recovers it.
BY_RECOVERY_ACTION: dict[RecoveryAction, Step] = {
    RecoveryAction.NONE: Step.RECHECK,
    RecoveryAction.DRAIN_P2P: Step.RECHECK,
    RecoveryAction.GPU_RESET: Step.GPU_RESET,
    RecoveryAction.DRAIN_AND_RESET: Step.GPU_RESET,
    RecoveryAction.BUS_RESET: Step.BUS_RESET,
    RecoveryAction.NODE_REBOOT: Step.REBOOT,
    RecoveryAction.SYSTEM_REBOOT: Step.REBOOT,
    RecoveryAction.RECOVER_IMEX_DOMAIN: Step.REPLACE,
}
# What NVIDIA's catalog bucket asks for. A service call, new firmware or the mechanicals need hands.
BY_BUCKET: dict[Bucket, Step] = {
    Bucket.RESET_GPU: Step.GPU_RESET,
    Bucket.WORKFLOW_XID_48: Step.GPU_RESET,
    Bucket.WORKFLOW_NVLINK_ERR: Step.GPU_RESET,
    Bucket.WORKFLOW_NVLINK5_ERR: Step.GPU_RESET,
    Bucket.RESTART_BM: Step.REBOOT,
    Bucket.RESTART_VM: Step.REBOOT,
    Bucket.CONTACT_SUPPORT: Step.REPLACE,
    Bucket.CHECK_MECHANICALS: Step.REPLACE,
    Bucket.UPDATE_SWFW: Step.REPLACE,
}
# Vigil's own word where it differs from the bucket: a row remap that failed cannot be reset away.
BY_XID: dict[int, Step] = {64: Step.REPLACE}
BY_KIND: dict[SignalKind, Step] = {
    SignalKind.ECC_DBE: Step.GPU_RESET,
    SignalKind.ROW_REMAP_PENDING: Step.GPU_RESET,  # a reset applies the pending remap
    SignalKind.ROW_REMAP_FAILURE: Step.REPLACE,
    SignalKind.GPU_LOST: Step.REBOOT,
    SignalKind.GPU_FABRIC_FAILED: Step.GPU_RESET,
    SignalKind.SXID_FATAL: Step.REBOOT,  # the NVSwitch fabric is reset with the node
    SignalKind.CHECK_FAILED: Step.RECHECK,
    SignalKind.COLLECTOR_HUNG: Step.REBOOT,  # a wedged driver
    SignalKind.IB_PORT_DOWN: Step.REPLACE,  # a cable or a switch port: hands
}


@dataclass(frozen=True, slots=True)
class Fault:
    """What the ladder needs to know of one of the node's open incidents."""

    kind: SignalKind
    code: int = 0
    message: str = ""
    gpu: str = ""  # its GPU's PCI bus id ("" for the node)


def first_step(fault: Fault) -> Step:
    """The rung one fault asks for (REPLACE for a fault nothing here knows how to repair)."""
    if fault.kind is SignalKind.XID and fault.code == RECOVERY_XID:
        action = recovery_action(fault.message)
        return BY_RECOVERY_ACTION.get(action, Step.REPLACE) if action is not None else Step.REPLACE
    if fault.kind is SignalKind.XID:
        if fault.code in BY_XID:
            return BY_XID[fault.code]
        entry = CATALOG.get(fault.code)
        return BY_BUCKET.get(entry.bucket, Step.REPLACE) if entry is not None else Step.REPLACE
    return BY_KIND.get(fault.kind, Step.REPLACE)


def own_ladder(
    fault: Fault, by_xid: dict[int, tuple[Step, ...]], by_kind: dict[SignalKind, tuple[Step, ...]]
) -> tuple[Step, ...] | None:
    """The ladder the configuration gives this fault's code or kind, if any."""
    if fault.kind is SignalKind.XID and fault.code in by_xid:
        return by_xid[fault.code]
    return by_kind.get(fault.kind)


def plan_ladder(
    faults: Sequence[Fault],
    steps: Sequence[Step] = ORDER,
    by_xid: dict[int, tuple[Step, ...]] | None = None,
    by_kind: dict[SignalKind, tuple[Step, ...]] | None = None,
) -> tuple[Step, ...]:
    """The rungs a node with these faults climbs: from the highest first rung any of them asks for,
    through the configured ``steps`` (a rung left out of them is skipped), ending with REPLACE. A
    code or kind with its own ladder uses it; with several faults, their ladders' rungs merge in the
    order of the rungs, from the highest first rung on."""
    by_xid, by_kind = by_xid or {}, by_kind or {}
    if not faults:
        return (Step.REPLACE,)
    ladders = []
    for fault in faults:
        own = own_ladder(fault, by_xid, by_kind)
        if own is None:
            start = ORDER.index(first_step(fault))
            own = tuple(s for s in steps if ORDER.index(s) >= start)
        ladders.append(tuple(own) if Step.REPLACE in own else (*own, Step.REPLACE))
    start = max(ORDER.index(ladder[0]) for ladder in ladders)
    rungs = {s for ladder in ladders for s in ladder if ORDER.index(s) >= start}
    return tuple(s for s in ORDER if s in rungs)


def gpus_to_reset(faults: Sequence[Fault]) -> tuple[str, ...]:
    """The GPUs a reset is for: those the faults name, in order, once each (none: the node's)."""
    return tuple(dict.fromkeys(f.gpu for f in faults if f.gpu))
