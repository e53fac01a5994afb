"""The policy: what each signal means and what Vigil does about it. YAML, validated, frozen.

A policy file overrides the defaults rule by rule: naming XID 13 replaces only XID 13's rule.
The defaults are docs/design.md's XID table.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, model_validator

from vigil_core.config_file import ConfigModel, load_yaml_model
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


_APP_FAULT = "usually the application; check the job's code before the GPU"
DEFAULT_XID_RULES: dict[int, Rule] = {
    13: _rule("suspect", "graphics engine exception", _APP_FAULT, threshold=3, application=True),
    31: _rule("suspect", "GPU memory page fault", _APP_FAULT, threshold=3, application=True),
    43: _rule("record", "GPU stopped processing", application=True),
    45: _rule("record", "preemptive cleanup after an earlier error", application=True),
    48: _rule("quarantine", "double-bit ECC error", "reset the GPU"),
    63: _rule("record", "row remap event"),
    64: _rule("quarantine", "row remap failure", "replace the GPU"),
    74: _rule("quarantine", "NVLink error", "reset the GPU; check the NVLink/NVSwitch fabric"),
    79: _rule("quarantine", "GPU has fallen off the bus", "reboot the node; reseat or replace the GPU if it recurs"),
    92: _rule("suspect", "high single-bit ECC error rate", "watch for a DBE; plan a GPU reset"),
    94: _rule("record", "contained ECC error", "restart the application"),
    95: _rule("quarantine", "uncontained ECC error", "reset the GPU"),
    109: _rule("suspect", "context-switch timeout", "reset the GPU if it repeats", escalate_after=3, window_s=3600),
    119: _rule("quarantine", "GSP RPC timeout", "reset the GPU"),
    120: _rule("quarantine", "GSP error", "reset the GPU"),
    140: _rule("quarantine", "unrecovered ECC error", "reset the GPU"),
}
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
    kinds: dict[SignalKind, Rule] = Field(default_factory=lambda: dict(DEFAULT_KIND_RULES))
    fold_window_s: float = Field(300.0, gt=0, description="same GPU, kind and code within this: one incident")
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
        return merged

    def rule_for(self, signal: Signal) -> Rule:
        if signal.kind is SignalKind.XID:
            return self.xid.get(signal.code, self.unknown_xid)
        return self.kinds.get(signal.kind, self.unknown_xid)

    @property
    def longest_window_s(self) -> float:
        rules = [*self.xid.values(), *self.kinds.values(), self.unknown_xid]
        return max(r.window_s for r in rules)


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
