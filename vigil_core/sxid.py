"""What an NVSwitch SXid code means, for pages and incidents. Pure data.

The driver says itself whether an SXid is fatal (``Fatal`` / ``Non-fatal`` on the line), and that
decides the default action (``controller.vocab.policy``: fatal quarantines the node and pages; non-fatal
is counted and makes the node SUSPECT on repetition). This catalog adds the meaning, from NVIDIA's
Fabric Manager user guide (DU-09883-001, "NVSwitch SXid errors"): the named codes below, and for
any other the NVSwitch unit its thousands name (11xxx ingress, 12xxx egress, 14xxx transaction
state, 15xxx route, 19xxx NVLink data link, 22xxx MINION, 24xxx SOE).
"""

from __future__ import annotations

_CORRECTED_ECC = "single-bit ECC error, corrected by the switch (no impact by itself)"
_NAMED = {
    11004: "ingress invalid ACL: the fabric's partition routing is wrong; NVLink traffic stalls",
    12022: "egress input ECC double-bit error",
    12024: "egress output ECC double-bit error",
    12025: "egress credit overflow",
    12026: "egress destination request ID error",
    12027: "egress destination response ID error",
    12028: "egress non-posted PRIV error",
    12030: "egress control parity error",
    12031: "egress credit parity error",
    12032: "egress flit type mismatch",
    14017: "transaction state ATO timeout",
    15001: "route buffer over/underflow",
    15006: "route transdone over/underflow",
    15009: "route GLT double-bit ECC error",
    15010: "route parity error",
    15012: "route incoming double-bit ECC error",
    15013: "route credit parity error",
} | dict.fromkeys(
    (
        11012,
        11021,
        11022,
        11023,
        12021,
        12023,
        15008,
        15011,
        19049,
        19055,
        19057,
        19059,
        19062,
        19065,
        19068,
        19071,
        24001,
    ),
    _CORRECTED_ECC,
)
_UNITS = {
    11: "ingress",
    12: "egress",
    14: "transaction state (TSTATE)",
    15: "route",
    19: "NVLink data link",
    22: "NVLink MINION",
    24: "SOE (the switch's management engine)",
}


def sxid_meaning(code: int) -> str:
    """The code's meaning, or the NVSwitch unit it comes from; never empty."""
    if named := _NAMED.get(code):
        return named
    if unit := _UNITS.get(code // 1000):
        return f"an error in the NVSwitch {unit} unit"
    return "an NVSwitch error this catalog does not name"
