"""The SXid catalog is data with its source, and the default policy follows its severity code by code:
a line the driver wrote without a severity is judged by the catalog, one that says its severity by that."""

from __future__ import annotations

from importlib.resources import files

import pytest

from agent.kernel_log import KernelLogCollector
from controller.nodes.decide import decide
from controller.vocab.actions import Page, Quarantine
from controller.vocab.node_state import Health, NodeState
from controller.vocab.policy import Policy
from vigil_core.signals import Signal, SignalKind
from vigil_core.sxid import SXID_CATALOG, parse_sxid_catalog, sxid_meaning

POLICY = Policy()


def signals_of(lines: list[str]) -> list[Signal]:
    return KernelLogCollector("n1", lambda: lines, [], clock=lambda: 42.0).collect()


def line(code: int, rest: str, seq: int = 1) -> str:
    return f"3,{seq},{seq},-;nvidia-nvswitch2: SXid (PCI:0000:c6:00.0): {code}, {rest}"


@pytest.mark.parametrize("code", sorted(SXID_CATALOG))
def test_every_catalog_code_without_a_severity_on_its_line_gets_the_rule_its_table_asks_for(code: int) -> None:
    entry = SXID_CATALOG[code]
    (signal,) = signals_of([line(code, "Link 12 error (First)")])  # a line that says no severity
    assert signal.kind is (SignalKind.SXID_FATAL if entry.fatal else SignalKind.SXID_NONFATAL)
    assert entry.meaning in signal.describe()  # the page and the incident say what the code means
    decision = decide(NodeState("n1"), signal, POLICY, 42.0, "inc-1")
    if entry.fatal:
        assert decision.state.health is Health.UNHEALTHY
        assert any(isinstance(a, Quarantine) for a in decision.actions)
        assert any(isinstance(a, Page) for a in decision.actions)
    else:  # alone it is noise: counted, no action, no page
        assert decision.state.health is Health.HEALTHY
        assert not any(isinstance(a, Quarantine | Page) for a in decision.actions)


def test_the_drivers_own_severity_wins_over_the_catalog() -> None:
    corrected = next(c for c, e in SXID_CATALOG.items() if not e.fatal)
    grave = next(c for c, e in SXID_CATALOG.items() if e.fatal)
    said = signals_of([line(corrected, "Fatal, Link 3 (First)", 1), line(grave, "Non-fatal, Link 4 (First)", 2)])
    assert [s.kind for s in said] == [SignalKind.SXID_FATAL, SignalKind.SXID_NONFATAL]


def test_a_code_in_no_table_is_judged_by_its_text() -> None:
    assert 24007 not in SXID_CATALOG and 20034 not in SXID_CATALOG
    judged = signals_of([line(24007, "SOE watchdog error", 1), line(20034, "Link 9 replay (First)", 2)])
    assert [s.kind for s in judged] == [SignalKind.SXID_FATAL, SignalKind.SXID_NONFATAL]
    assert sxid_meaning(15999) == "an error in the NVSwitch route unit"
    assert sxid_meaning(99001) == "an NVSwitch error this catalog does not name"


def test_the_catalog_file_says_where_it_comes_from() -> None:
    text = files("vigil_core").joinpath("sxid_catalog.csv").read_text()
    assert "DU-09883-001" in text and "2026-11-26" in text
    assert {c // 1000 for c in SXID_CATALOG} == {11, 12, 14, 15, 19, 24}
    assert any(e.fatal for e in SXID_CATALOG.values()) and any(not e.fatal for e in SXID_CATALOG.values())


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("code,severity,meaning\n12022,fatal,a\n12022,fatal,b\n", "row 3: SXid 12022 twice"),
        ("code,severity,meaning\n12022,deadly,a\n", "row 2: severity 'deadly'"),
        ("code,severity,meaning\ntwelve,fatal,a\n", "row 2"),
        ("code,severity,meaning\n12022,fatal,\n", "row 2: SXid 12022 has no meaning"),
        ("code,severity\n12022,fatal\n", "row 2"),
    ],
)
def test_a_bad_catalog_row_is_named(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_sxid_catalog(text)
