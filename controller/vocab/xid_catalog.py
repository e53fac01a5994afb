"""NVIDIA's Xid catalog, as data (``xid_catalog.csv``: its source and the date it was read are at
its top), and what each resolution bucket means for Vigil: the default policy follows the catalog
code by code (``controller.vocab.policy``).

- The catalog's **immediate action** picks the rule: a GPU reset, a reboot, a service call, new
  software or a mechanical check takes the node out of service (quarantine) with that remedy; an
  application restart is the application's fault (recorded and judged against its job's other
  nodes; SUSPECT when it repeats); "ignore" is recorded only.
- XID 154 says in its text which recovery action the driver now needs ("GPU recovery action
  changed from 0x0 (None) to 0x2 (Node Reboot Required)"): ``vigil_core.recovery`` reads it (the
  agent writes NVML's recovery action in the same words).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from enum import StrEnum
from importlib.resources import files


class Bucket(StrEnum):
    """The catalog's resolution buckets (immediate action)."""

    RESTART_APP = "RESTART_APP"
    RESET_GPU = "RESET_GPU"
    RESTART_BM = "RESTART_BM"  # reboot the (bare-metal) node
    RESTART_VM = "RESTART_VM"
    CONTACT_SUPPORT = "CONTACT_SUPPORT"
    CHECK_MECHANICALS = "CHECK_MECHANICALS"  # power and cooling
    UPDATE_SWFW = "UPDATE_SWFW"  # driver and firmware
    CHECK_UVM = "CHECK_UVM"
    IGNORE = "IGNORE"
    WORKFLOW_XID_45 = "WORKFLOW_XID_45"  # the aftermath of an earlier error: see that one
    WORKFLOW_XID_48 = "WORKFLOW_XID_48"  # double-bit ECC: reset, then row remapping
    WORKFLOW_NVLINK_ERR = "WORKFLOW_NVLINK_ERR"
    WORKFLOW_NVLINK5_ERR = "WORKFLOW_NVLINK5_ERR"
    XID_154_EVAL = "XID_154_EVAL"  # follow the recovery action XID 154 names


class Fix(StrEnum):
    """What a bucket asks of the node."""

    OUT_OF_SERVICE = "out of service"  # hands or a machine must act on the node: quarantine
    APPLICATION = "application"  # the application's own fault
    NOTHING = "nothing"  # recorded only
    RECOVERY_ACTION = "recovery action"  # XID 154: what its text says


# Each bucket: what it asks, and the remedy said in the incident and the page.
BUCKETS: dict[Bucket, tuple[Fix, str]] = {
    Bucket.RESET_GPU: (Fix.OUT_OF_SERVICE, "reset the GPU"),
    Bucket.RESTART_BM: (Fix.OUT_OF_SERVICE, "reboot the node"),
    Bucket.RESTART_VM: (Fix.OUT_OF_SERVICE, "restart the VM"),
    Bucket.CONTACT_SUPPORT: (Fix.OUT_OF_SERVICE, "contact NVIDIA support with the log line"),
    Bucket.CHECK_MECHANICALS: (Fix.OUT_OF_SERVICE, "check the GPU's power and cooling (mechanicals)"),
    Bucket.UPDATE_SWFW: (Fix.OUT_OF_SERVICE, "update the driver and the GPU's firmware"),
    Bucket.WORKFLOW_XID_48: (Fix.OUT_OF_SERVICE, "reset the GPU (applies row remaps); replace it if remapping failed"),
    Bucket.WORKFLOW_NVLINK_ERR: (Fix.OUT_OF_SERVICE, "reset the GPU; check the NVLink links and NVSwitch fabric"),
    Bucket.WORKFLOW_NVLINK5_ERR: (Fix.OUT_OF_SERVICE, "reset the GPU; check the NVLink5 fabric and its trays"),
    Bucket.RESTART_APP: (Fix.APPLICATION, "restart the application; usually its own fault"),
    Bucket.CHECK_UVM: (Fix.APPLICATION, "restart the application; check its unified-memory use"),
    Bucket.WORKFLOW_XID_45: (Fix.APPLICATION, "look at the error that came before it"),
    Bucket.IGNORE: (Fix.NOTHING, ""),
    Bucket.XID_154_EVAL: (Fix.RECOVERY_ACTION, "follow the recovery action it names"),
}


@dataclass(frozen=True, slots=True)
class Entry:
    code: int
    mnemonic: str
    bucket: Bucket

    @property
    def fix(self) -> Fix:
        return BUCKETS[self.bucket][0]

    @property
    def remedy(self) -> str:
        """The remedy, with the catalog's own word for it."""
        said = BUCKETS[self.bucket][1]
        return f"{said} (NVIDIA: {self.bucket.value})" if said else f"NVIDIA: {self.bucket.value}"

    @property
    def meaning(self) -> str:
        return self.mnemonic.lower().replace("_", " ") if self.mnemonic else f"XID {self.code}"


def parse_catalog(text: str) -> dict[int, Entry]:
    """The catalog file's rows (``#`` lines are its provenance); a bad row raises ValueError naming it."""
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    found: dict[int, Entry] = {}
    for n, row in enumerate(csv.DictReader(io.StringIO("\n".join(lines))), start=2):
        try:
            entry = Entry(int(row["code"]), row["mnemonic"].strip(), Bucket(row["immediate_action"].strip()))
        except (KeyError, ValueError) as exc:
            raise ValueError(f"xid catalog, row {n}: {exc}") from None
        if entry.code in found:
            raise ValueError(f"xid catalog, row {n}: XID {entry.code} twice")
        found[entry.code] = entry
    return found


CATALOG: dict[int, Entry] = parse_catalog(files("controller.vocab").joinpath("xid_catalog.csv").read_text())
RECOVERY_XID = 154
