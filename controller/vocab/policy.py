"""The policy: what each signal means and what Vigil does about it. YAML, validated, frozen.

A policy file overrides the defaults rule by rule: naming XID 13 replaces only XID 13's rule.
The XID defaults follow NVIDIA's Xid catalog code by code (``controller.vocab.xid_catalog``): its
immediate action picks the rule, and Vigil's own words and thresholds for the codes it sees most
(docs/design.md's XID table) keep to it. XID 154 is decided by the recovery action its text names.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from controller.vocab.repair_steps import RepairStep, check_ladder
from controller.vocab.xid_catalog import CATALOG, RECOVERY_XID, Entry, Fix
from vigil_core.config_file import ConfigModel, load_yaml_model
from vigil_core.recovery import RecoveryAction, recovery_action
from vigil_core.signals import Signal, SignalKind


class Severity(StrEnum):
    """What a rule does once its threshold is reached, mildest first."""

    RECORD = "record"  # keep it in the incident store; no page, no state change
    SUSPECT = "suspect"  # node SUSPECT, page a person
    QUARANTINE = "quarantine"  # take the node out of service, page

    @property
    def rank(self) -> int:
        return list(Severity).index(self)


class Rule(ConfigModel):
    action: Severity
    threshold: int = Field(1, ge=1, description="signals within window_s before the action fires")
    window_s: float = Field(600.0, gt=0)
    escalate_after: int | None = Field(None, ge=1, description="this many within window_s: quarantine")
    min_value: float = Field(0.0, ge=0, description="ignore signals whose value is below this")
    meaning: str = ""
    remedy: str = ""
    application: bool = Field(False, description="usually the application's fault: on most of a job's nodes, the job's")
    ladder: tuple[RepairStep, ...] | None = Field(
        None, description="its faults' repair ladder, mildest first (remediation); default: from the driver's word"
    )

    @field_validator("ladder")
    @classmethod
    def _ladder(cls, value: tuple[RepairStep, ...] | None) -> tuple[RepairStep, ...] | None:
        return None if value is None else check_ladder(value)

    @property
    def count_cap(self) -> int:
        """Observations worth remembering per key: past the highest threshold, more change nothing."""
        return max(self.threshold, self.escalate_after or 0)

    def severity_at(self, count: int) -> Severity:
        if self.escalate_after is not None and count >= self.escalate_after:
            return Severity.QUARANTINE
        return self.action if count >= self.threshold else Severity.RECORD


def _rule(action: str, meaning: str, remedy: str = "", **kw: Any) -> Rule:
    return Rule(action=Severity(action), meaning=meaning, remedy=remedy, **kw)


def catalog_rule(entry: Entry) -> Rule:
    """The rule NVIDIA's catalog entry asks for: out of service (quarantine), the application's
    fault (SUSPECT when it repeats, judged against its job's other nodes), or recorded only."""
    if entry.fix is Fix.OUT_OF_SERVICE:
        return _rule("quarantine", entry.meaning, entry.remedy)
    if entry.fix is Fix.APPLICATION:
        return _rule("suspect", entry.meaning, entry.remedy, threshold=3, application=True)
    return _rule("record", entry.meaning, entry.remedy)


def _tuned(code: int, action: str, meaning: str, remedy: str = "", **kw: Any) -> Rule:
    """Vigil's words for a code it sees often, with the catalog's bucket named in the remedy."""
    bucket = f"NVIDIA: {CATALOG[code].bucket.value}"
    return _rule(action, meaning, f"{remedy} ({bucket})" if remedy else bucket, **kw)


_APP_FAULT = "usually the application; check the job's code before the GPU"
DEFAULT_XID_RULES: dict[int, Rule] = {
    **{code: catalog_rule(entry) for code, entry in CATALOG.items()},
    13: _tuned(13, "suspect", "graphics engine exception", _APP_FAULT, threshold=3, application=True),
    31: _tuned(31, "suspect", "GPU memory page fault", _APP_FAULT, threshold=3, application=True),
    43: _tuned(43, "record", "GPU stopped processing", application=True),
    45: _tuned(45, "record", "preemptive cleanup after an earlier error", application=True),
    48: _tuned(48, "quarantine", "double-bit ECC error", "reset the GPU"),
    63: _tuned(63, "record", "row remap event"),
    64: _tuned(64, "quarantine", "row remap failure", "replace the GPU"),
    74: _tuned(74, "quarantine", "NVLink error", "reset the GPU; check the NVLink/NVSwitch fabric"),
    79: _tuned(
        79, "quarantine", "GPU has fallen off the bus", "reboot the node; reseat or replace the GPU if it recurs"
    ),
    92: _tuned(92, "record", "high single-bit ECC error rate", "watch for a DBE"),
    94: _tuned(94, "record", "contained ECC error", "restart the application", application=True),
    95: _tuned(95, "quarantine", "uncontained ECC error", "reset the GPU"),
    109: _tuned(109, "quarantine", "context-switch timeout", "reset the GPU"),
    119: _tuned(119, "quarantine", "GSP RPC timeout", "reset the GPU"),
    120: _tuned(120, "quarantine", "GSP error", "reset the GPU"),
    140: _tuned(140, "quarantine", "unrecovered ECC error", "reset the GPU"),
}
_XID154 = "the driver's GPU recovery action (XID 154): "
DEFAULT_RECOVERY_RULES: dict[RecoveryAction, Rule] = {
    RecoveryAction.NONE: _rule("record", _XID154 + "none; an earlier one it raised is cleared"),
    RecoveryAction.GPU_RESET: _rule("quarantine", _XID154 + "GPU reset", "reset the GPU"),
    RecoveryAction.BUS_RESET: _rule("quarantine", _XID154 + "PCIe bus reset", "reset the GPU's PCIe bus"),
    RecoveryAction.DRAIN_AND_RESET: _rule(
        "quarantine", _XID154 + "drain P2P and reset", "let its peer-to-peer traffic drain, then reset the GPU"
    ),
    RecoveryAction.DRAIN_P2P: _rule(
        "quarantine", _XID154 + "drain P2P", "let its peer-to-peer traffic drain (no new work), then re-check"
    ),
    RecoveryAction.NODE_REBOOT: _rule("quarantine", _XID154 + "node reboot", "reboot the node"),
    RecoveryAction.SYSTEM_REBOOT: _rule("quarantine", _XID154 + "system reboot", "reboot the system (a cold boot)"),
    RecoveryAction.RECOVER_IMEX_DOMAIN: _rule(
        "quarantine", _XID154 + "recover the IMEX domain", "recover the node's IMEX domain (nvidia-imex)"
    ),
}
DEFAULT_UNKNOWN_RECOVERY = _rule(
    "suspect", _XID154 + "one Vigil cannot read", "read the line and follow the recovery action it names"
)
DEFAULT_UNKNOWN_XID = _rule("suspect", "XID not in the policy", "contact NVIDIA support with the log line")
DEFAULT_KIND_RULES: dict[SignalKind, Rule] = {
    SignalKind.ECC_DBE: _rule("quarantine", "double-bit ECC error", "reset the GPU"),
    SignalKind.ROW_REMAP_PENDING: _rule("quarantine", "row remap pending", "reset the GPU to apply the remap"),
    SignalKind.ROW_REMAP_FAILURE: _rule("quarantine", "row remap failure", "replace the GPU"),
    SignalKind.GPU_LOST: _rule("quarantine", "GPU lost", "reboot the node"),
    SignalKind.THROTTLE: _rule("suspect", "hardware throttling", "check cooling and power", min_value=30.0),
    SignalKind.RETIRED_PAGES: _rule("record", "retired pages"),
    SignalKind.NVLINK_ERRORS: _rule("record", "NVLink error counters grew"),
    SignalKind.PCIE_REPLAY: _rule("record", "PCIe replays"),
    SignalKind.PCIE_LINK_DEGRADED: _rule("suspect", "PCIe link below its maximum", "reseat the GPU or riser"),
    SignalKind.COLLECTOR_HUNG: _rule("suspect", "a collector hung (driver wedged?)", "check the node's driver"),
    SignalKind.CHECK_FAILED: _rule("quarantine", "a health check failed", "see the check's reason"),
    SignalKind.HOST_MEMORY_PRESSURE: _rule("suspect", "host memory nearly exhausted", "find the leak before OOM kills"),
    SignalKind.DISK_FULL: _rule("suspect", "checkpoint filesystem nearly full", "free space before the checkpoint"),
    SignalKind.NIC_ERRORS: _rule("record", "network interface errors or drops"),
    # A drain someone else made in Slurm (a health check, a person, Slurm itself): recorded, so the
    # fleet's story is whole; the node is already out of the scheduler's hands and the drain is theirs.
    SignalKind.SCHEDULER_DRAIN: _rule(
        "record", "drained in the scheduler by someone else", "read the drain's reason: it is theirs to lift"
    ),
    SignalKind.SPOOL_LOST: _rule(
        "suspect",
        "the agent's spool was damaged or lost: faults it had not delivered may be gone",
        "check the node's disk; read its kernel log for faults since the agent last reported",
    ),
    # NVSwitch errors (the driver's own severity): a fatal one breaks the node's NVLink fabric; a
    # non-fatal one alone is noise, repeated it is a link or switch going bad.
    SignalKind.SXID_FATAL: _rule(
        "quarantine",
        "NVSwitch fatal error (SXid): the node's NVLink fabric is broken",
        "reset the fabric (reboot the node); read nv-fabricmanager's log; replace the tray if it recurs",
    ),
    SignalKind.SXID_NONFATAL: _rule(
        "suspect",
        "NVSwitch non-fatal errors (SXid), repeated",
        "watch for a fatal SXid; check the link's cable or the switch tray",
        threshold=3,
    ),
    # InfiniBand/RoCE ports: down past the transport timeout failed every collective through it; a
    # leaf switch or its uplink failing takes many nodes' ports at once, which the domain guard
    # turns into one "shared component" incident.
    SignalKind.IB_PORT_DOWN: _rule(
        "quarantine",
        "InfiniBand/RoCE port down past the transport timeout",
        "check the cable and the switch port; the leaf switch if its other nodes' ports went down too",
    ),
    SignalKind.IB_PORT_FLAP: _rule(
        "suspect", "InfiniBand/RoCE port flapping", "reseat or replace the cable; check the switch port", threshold=3
    ),
    SignalKind.IB_PORT_DEGRADED: _rule(
        "suspect", "InfiniBand/RoCE link below its rate or width", "reseat or replace the cable or transceiver"
    ),
    SignalKind.GPU_FABRIC_FAILED: _rule(
        "quarantine",
        "the GPU did not join its NVLink fabric (NVSwitch): its NVLink peers are unreachable",
        "check nv-fabricmanager on the node; reset the GPU or reboot",
    ),
    SignalKind.IB_PORT_ERRORS: _rule(
        "suspect", "InfiniBand/RoCE error counters growing", "check the cable, transceiver and switch port"
    ),
}


XidCode = Annotated[int, Field(ge=1, le=65535, strict=True)]  # an XID number, as the driver prints it


class Policy(ConfigModel):
    xid: dict[XidCode, Rule] = Field(default_factory=lambda: dict(DEFAULT_XID_RULES))
    unknown_xid: Rule = DEFAULT_UNKNOWN_XID
    recovery: dict[RecoveryAction, Rule] = Field(default_factory=lambda: dict(DEFAULT_RECOVERY_RULES))
    unknown_recovery: Rule = DEFAULT_UNKNOWN_RECOVERY
    kinds: dict[SignalKind, Rule] = Field(default_factory=lambda: dict(DEFAULT_KIND_RULES))
    fold_window_s: float = Field(300.0, gt=0, description="same GPU, kind and code within this: one incident")
    crash_s: float = Field(
        1.0, ge=0, le=60, description="application XID lines on one GPU this close together: one crash, counted once"
    )
    # A silent node becomes UNKNOWN and is never cordoned for silence alone (no knob for that yet).
    heartbeat_timeout_s: float = Field(30.0, gt=0, description="silence after which a node is UNKNOWN")
    suspect_clear_s: float | None = Field(
        21600.0,
        gt=0,
        description="a SUSPECT node quiet this long is HEALTHY again, its incidents resolved (null: never)",
    )

    @model_validator(mode="before")
    @classmethod
    def _merge_defaults(cls, data: Any) -> Any:
        """A policy file names only the rules it changes; the rest stay as the defaults."""
        if not isinstance(data, dict):
            return data
        merged = dict(data)
        if isinstance(data.get("xid"), dict):
            merged["xid"] = {**DEFAULT_XID_RULES, **data["xid"]}
        if isinstance(data.get("kinds"), dict):
            merged["kinds"] = {**DEFAULT_KIND_RULES, **data["kinds"]}
        if isinstance(data.get("recovery"), dict):
            merged["recovery"] = {**DEFAULT_RECOVERY_RULES, **data["recovery"]}
        return merged

    def rule_for(self, signal: Signal) -> Rule:
        if signal.kind is SignalKind.XID and signal.code == RECOVERY_XID:
            action = recovery_action(signal.message)
            return self.unknown_recovery if action is None else self.recovery.get(action, self.unknown_recovery)
        if signal.kind is SignalKind.XID:
            return self.xid.get(signal.code, self.unknown_xid)
        return self.kinds.get(signal.kind, self.unknown_xid)

    def may_act(self, signal: Signal) -> bool:
        """Whether the signal's rule can do more than record it (at its threshold or escalation)."""
        return _acts(self.rule_for(signal))

    def record_only(self) -> RecordOnly:
        """``may_act`` as sets, by XID code and by kind, for a relay (``controller.vocab.lanes``):
        the recovery XID's rule depends on its message, so it counts as one that may act."""
        xids = {code: _acts(rule) for code, rule in self.xid.items()} | {RECOVERY_XID: True}
        kinds = {kind: _acts(rule) for kind, rule in self.kinds.items() if kind is not SignalKind.XID}
        return RecordOnly(
            xids=frozenset(c for c, acts in xids.items() if not acts),
            acting_xids=frozenset(c for c, acts in xids.items() if acts),
            kinds=frozenset(k for k, acts in kinds.items() if not acts),
            acting_kinds=frozenset(k for k, acts in kinds.items() if acts),
            unlisted=not _acts(self.unknown_xid),
        )

    @cached_property
    def longest_window_s(self) -> float:
        """Read on every decision: a pass over some two hundred rules, once per policy (frozen)."""
        rules = [*self.xid.values(), *self.kinds.values(), *self.recovery.values(), self.unknown_xid]
        return max(r.window_s for r in rules)


def _acts(rule: Rule) -> bool:
    return rule.action is not Severity.RECORD or rule.escalate_after is not None


@dataclass(frozen=True, slots=True)
class RecordOnly:
    """What a policy only records (``Policy.record_only``): XID codes and kinds a rule names and
    records only, those a rule names that may act, and for anything no rule names, the unknown-XID
    rule's word (``unlisted``: it records only)."""

    xids: frozenset[int]
    acting_xids: frozenset[int]
    kinds: frozenset[SignalKind]
    acting_kinds: frozenset[SignalKind]
    unlisted: bool

    def may_act(self, kind: SignalKind, code: int) -> bool:
        """``Policy.may_act`` for a signal of this kind and code. Pure."""
        if kind is SignalKind.XID:
            return code in self.acting_xids or (code not in self.xids and not self.unlisted)
        return kind in self.acting_kinds or (kind not in self.kinds and not self.unlisted)


def load_policy(path: Path | None) -> Policy:
    return load_yaml_model(Policy, path)


# Signs that a node may fail soon: a job on it is asked to save now (controller.save_now).
EARLY_WARNING_KINDS = frozenset(
    {
        SignalKind.THROTTLE,
        SignalKind.IB_PORT_FLAP,
        SignalKind.IB_PORT_DEGRADED,
        SignalKind.IB_PORT_ERRORS,
        SignalKind.NVLINK_ERRORS,
        SignalKind.PCIE_REPLAY,
        SignalKind.SXID_NONFATAL,
        SignalKind.RETIRED_PAGES,
    }
)
