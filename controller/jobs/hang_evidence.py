"""Whether a hung job's hardware is to blame: its wavefront joined with its nodes' own signals. Pure.

A hang alone never says the hardware: most are the application's or the host's. What can say it is
a node of the job that reported a hardware signal of its own around the time the job stopped (from
``evidence_s`` before its last step on): NVLink or NVSwitch errors, an InfiniBand port flapping or
erroring, PCIe replays, a degraded link, throttling, a wedged driver (a hung collector), an XID that
is not the application's. Signals too small to act on alone (recorded only) count here: joined with
a hang, they are the evidence. How the wavefront decides which nodes may be blamed:

- a rank stuck in the job's own code or in a read (application, I/O): nobody, whatever the nodes say
  (the culprit is known, and it is not the hardware);
- every rank waiting in a collective that does not complete (network or GPU), every rank alike in
  its progress record, or no stacks at all (a job not under ``vigil launch``): any node of the job
  with evidence;
- a rank that does not answer (host), or a rank behind the others in the ranks' progress records:
  its node, if it has evidence.

No evidence: nobody is blamed, and the hang's page says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from controller.jobs.stacks import HangClass, Wavefront
from controller.vocab.xid_catalog import CATALOG, Fix
from vigil_core.signals import SignalKind

# Kinds that say something of the hardware a collective runs on.
EVIDENCE_KINDS = frozenset(
    {
        SignalKind.XID,
        SignalKind.ECC_DBE,
        SignalKind.ROW_REMAP_PENDING,
        SignalKind.ROW_REMAP_FAILURE,
        SignalKind.GPU_LOST,
        SignalKind.THROTTLE,
        SignalKind.NVLINK_ERRORS,
        SignalKind.PCIE_REPLAY,
        SignalKind.PCIE_LINK_DEGRADED,
        SignalKind.COLLECTOR_HUNG,
        SignalKind.NIC_ERRORS,
        SignalKind.SXID_FATAL,
        SignalKind.SXID_NONFATAL,
        SignalKind.IB_PORT_DOWN,
        SignalKind.IB_PORT_FLAP,
        SignalKind.IB_PORT_DEGRADED,
        SignalKind.IB_PORT_ERRORS,
        SignalKind.GPU_FABRIC_FAILED,
    }
)


@dataclass(frozen=True, slots=True)
class NodeFault:
    """One signal a node's incidents remember: its kind, code and when it was last seen."""

    node: str
    kind: SignalKind
    code: int
    at: float

    def describe(self) -> str:
        return f"{self.kind.value}" + (f" {self.code}" if self.code else "")


@dataclass(frozen=True, slots=True)
class HangBlame:
    nodes: tuple[str, ...]  # to take out of service, each with evidence of its own
    evidence: tuple[NodeFault, ...]  # what each was blamed on
    why: str  # said in the hang's thread, blamed or not


def is_evidence(fault: NodeFault) -> bool:
    """A hardware signal; an XID only when NVIDIA's catalog does not call it the application's or
    nothing (a code in no catalog counts: it is unknown, not known harmless)."""
    if fault.kind not in EVIDENCE_KINDS:
        return False
    if fault.kind is SignalKind.XID:
        entry = CATALOG.get(fault.code)
        return entry is None or entry.fix in (Fix.OUT_OF_SERVICE, Fix.RECOVERY_ACTION)
    return True


def fault_of(node: str, key: str, at: float) -> NodeFault | None:
    """A node incident's key (``gpu|KIND|code``, ``controller.nodes.decide.signal_key``) as a fault."""
    parts = key.rsplit("|", 2)
    if len(parts) != 3:
        return None
    try:
        return NodeFault(node, SignalKind(parts[1]), int(parts[2] or 0), at)
    except ValueError:
        return None


def hang_blame(
    wave: Wavefront | None, nodes: Sequence[str], faults: Sequence[NodeFault], since: float, evidence_s: float
) -> HangBlame:
    """Which of a hung job's ``nodes`` to blame: ``wave`` is where its ranks are stuck (None: no stacks
    came), ``faults`` its nodes' recent signals, ``since`` when its step last moved."""
    verdict = wave.verdict if wave is not None else None
    if verdict in (HangClass.APPLICATION, HangClass.IO):
        return HangBlame(
            (), (), f"the stacks name the {verdict.value} (not the hardware): nothing taken out of service"
        )
    if verdict in (HangClass.HOST, HangClass.BEHIND) and wave is not None:
        candidates = tuple(dict.fromkeys(c.node for c in wave.culprits))
    else:
        candidates = tuple(dict.fromkeys(nodes))
    found = [f for f in faults if f.node in candidates and f.at >= since - evidence_s and is_evidence(f)]
    blamed = tuple(n for n in candidates if any(f.node == n for f in found))
    where = (
        "a rank that does not answer"
        if verdict is HangClass.HOST
        else "a rank behind the others"
        if verdict is HangClass.BEHIND
        else "every rank waiting in a collective"
        if verdict is HangClass.COLLECTIVE
        else "every rank alike in its progress record"
        if verdict is HangClass.ALIKE
        else "no stacks to say where it is stuck"
    )
    if not blamed:
        nothing = "no node of the job shows a hardware signal of its own: nothing taken out of service"
        return HangBlame((), (), f"{where}, and {nothing}")
    said = "; ".join(f"{n}: " + ", ".join(sorted({f.describe() for f in found if f.node == n})) for n in blamed)
    return HangBlame(blamed, tuple(found), f"{where}, joined with the nodes' own signals ({said})")
