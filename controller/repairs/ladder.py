"""Which repair a quarantined node gets, as data: the ladder. Pure.

A ladder is the rungs a node's repair climbs, mildest first, from the one its faults ask for:
re-check only → GPU reset → PCIe bus reset → node reboot → replace (a person's hands). The first
rung comes from what the driver itself says recovers the GPU: the recovery action (NVML's, or the
one XID 154's text names), else NVIDIA's Xid catalog bucket for the code, else the signal kind's
own. A step that fails or times out climbs to the next rung; "replace" pages a person. Where the
node has faults of several kinds, the repair starts at the highest rung any of them needs. A policy
rule can give its faults a ladder of their own (``ladder:`` in the policy file).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controller.vocab.policy import Policy
from controller.vocab.repair_steps import ORDER, RepairStep
from controller.vocab.xid_catalog import CATALOG, RECOVERY_XID, Bucket
from vigil_core.recovery import RecoveryAction, recovery_action
from vigil_core.signals import Signal, SignalKind

Step = RepairStep

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


OwnLadder = Callable[[Fault], "tuple[Step, ...] | None"]  # the policy rule's own ladder for a fault


def rule_ladder(policy: Policy) -> OwnLadder:
    """The ladder the policy file gives a fault's rule (``ladder:``), if any."""

    def own(fault: Fault) -> tuple[Step, ...] | None:
        return policy.rule_for(Signal("", fault.kind, code=fault.code, message=fault.message)).ladder

    return own


def plan_ladder(
    faults: Sequence[Fault], steps: Sequence[Step] = ORDER, own_ladder: OwnLadder = lambda fault: None
) -> tuple[Step, ...]:
    """The rungs a node with these faults climbs: from the highest first rung any of them asks for,
    through the configured ``steps`` (a rung left out of them is skipped), ending with REPLACE. A
    fault whose policy rule has its own ladder uses it; with several faults, their ladders' rungs
    merge in the order of the rungs, from the highest first rung on."""
    if not faults:
        return (Step.REPLACE,)
    ladders = []
    for fault in faults:
        own = own_ladder(fault)
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
