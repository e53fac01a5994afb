"""What an NVSwitch SXid code means, and how grave it is, for pages and incidents. Pure data.

The catalog is a data file (``sxid_catalog.csv``: its source, NVIDIA's Fabric Manager user guide,
and the date it was read are at its top): each code the guide names, the table it is in (fatal or
non-fatal) and its meaning. For any other code the NVSwitch unit its thousands name (11xxx ingress,
12xxx egress, 14xxx transaction state, 15xxx route, 19xxx NVLink data link, 22xxx MINION, 24xxx SOE).

The driver says itself whether an SXid is fatal (``Fatal`` / ``Non-fatal`` on the line), and that
wins; a line that says neither is judged by the catalog (``agent.driver_lines``). The default policy
then follows the severity (``controller.vocab.policy``: fatal quarantines the node and pages;
non-fatal is counted and makes the node SUSPECT on repetition).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from importlib.resources import files

_UNITS = {
    11: "ingress",
    12: "egress",
    14: "transaction state (TSTATE)",
    15: "route",
    19: "NVLink data link",
    22: "NVLink MINION",
    24: "SOE (the switch's management engine)",
}
_SEVERITIES = {"fatal": True, "non-fatal": False}


@dataclass(frozen=True, slots=True)
class SxidEntry:
    code: int
    fatal: bool
    meaning: str


def parse_sxid_catalog(text: str) -> dict[int, SxidEntry]:
    """The catalog file's rows (``#`` lines are its provenance); a bad row raises ValueError naming it."""
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    found: dict[int, SxidEntry] = {}
    for n, row in enumerate(csv.DictReader(io.StringIO("\n".join(lines))), start=2):
        try:
            severity = row["severity"].strip()
            if severity not in _SEVERITIES:
                raise ValueError(f"severity {severity!r} is neither fatal nor non-fatal")
            entry = SxidEntry(int(row["code"]), _SEVERITIES[severity], row["meaning"].strip())
        except (KeyError, ValueError, AttributeError) as exc:
            raise ValueError(f"sxid catalog, row {n}: {exc}") from None
        if not entry.meaning:
            raise ValueError(f"sxid catalog, row {n}: SXid {entry.code} has no meaning")
        if entry.code in found:
            raise ValueError(f"sxid catalog, row {n}: SXid {entry.code} twice")
        found[entry.code] = entry
    return found


SXID_CATALOG: dict[int, SxidEntry] = parse_sxid_catalog(files("vigil_core").joinpath("sxid_catalog.csv").read_text())


def catalog_fatal(code: int) -> bool | None:
    """Whether the catalog calls the code fatal; None for a code it does not name."""
    entry = SXID_CATALOG.get(code)
    return entry.fatal if entry is not None else None


def sxid_meaning(code: int) -> str:
    """The code's meaning, or the NVSwitch unit it comes from; never empty."""
    if (entry := SXID_CATALOG.get(code)) is not None:
        return entry.meaning
    if unit := _UNITS.get(code // 1000):
        return f"an error in the NVSwitch {unit} unit"
    return "an NVSwitch error this catalog does not name"
