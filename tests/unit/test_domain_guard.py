"""The blast-radius guard per failure domain (``controller.nodes.guards.domains``, pure)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from controller.act.actuators import NullPager
from controller.act.local_actuator import LocalActuator, LocalQuarantines
from controller.compose import node_route
from controller.nodes.found import Found, Result, Source
from controller.nodes.guards.domains import (
    DomainAdmission,
    DomainGuardConfig,
    DomainState,
    admit_in_domains,
    domain_summary,
    held_domains,
    hold_domain,
    node_domains,
)
from controller.nodes.guards.rules import GuardrailConfig
from controller.store import Store
from controller.sweeps.pairing import Finding
from controller.vocab.actions import Page
from controller.vocab.policy import Policy
from tests.fakes.pagers import RecordingPager
from vigil_core.signals import GpuRef, Signal, SignalKind

CFG = DomainGuardConfig(labels=("rack", "leaf"), max_nodes=2, window_s=600.0)
Plain = tuple[tuple[tuple[str, str, float], ...], tuple[tuple[str, str], ...]]  # every (domain, node, when), held


def test_a_nodes_domains_come_from_the_configured_labels() -> None:
    assert node_domains({"rack": "r1", "leaf": "sw3", "zone": "a"}, CFG) == ["rack=r1", "leaf=sw3"]
    assert node_domains({"zone": "a"}, CFG) == []


def test_past_the_limit_a_domain_is_suspect_and_its_later_quarantines_held() -> None:
    state, seen = DomainState(), []
    for i, node in enumerate(["n1", "n2", "n3", "n4"]):
        state, admission, domain = admit_in_domains(state, node, ["rack=r1"], CFG, 100.0 + i)
        seen.append((admission, domain))
    assert seen == [
        (DomainAdmission.GO, ""),
        (DomainAdmission.GO, ""),
        (DomainAdmission.SUSPECT, "rack=r1"),  # paged once
        (DomainAdmission.HOLD, "rack=r1"),
    ]
    assert state.suspect == ("rack=r1",) and [n for _, n in state.held] == ["n3", "n4"]
    # Another rack is not held; the same node again is not counted twice.
    assert admit_in_domains(state, "n9", ["rack=r2"], CFG, 105.0)[1] is DomainAdmission.GO
    assert "held: n3, n4" in domain_summary(state, "rack=r1", CFG)


def test_the_window_forgets_old_quarantines_and_a_node_counts_once() -> None:
    state, _, _ = admit_in_domains(DomainState(), "n1", ["rack=r1"], CFG, 0.0)
    state, _, _ = admit_in_domains(state, "n2", ["rack=r1"], CFG, 10.0)
    assert admit_in_domains(state, "n1", ["rack=r1"], CFG, 20.0)[1] is DomainAdmission.GO  # n1 again
    assert admit_in_domains(state, "n3", ["rack=r1"], CFG, 700.0)[1] is DomainAdmission.GO  # n1's aged out
    assert admit_in_domains(state, "n3", [], CFG, 20.0)[1] is DomainAdmission.GO  # no labels: no domain


def test_the_engine_holds_a_suspect_domain_until_a_person_resumes(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = Store(tmp_path / "ctl.db")
        labels = {n: {"vigil.dev/rack": "r1"} for n in ("n1", "n2", "n3")}
        guardrails = GuardrailConfig(
            breaker_max_fraction=1.0, breaker_page_delay_s=0, domains={"max_nodes": 1}, shared={"enabled": False}
        )
        e = node_route(store, Policy(), LocalActuator(store.db, labels), NullPager(), guardrails=guardrails)
        await e.upkeep.refresh_labels()
        for seq, node in enumerate(("n1", "n2", "n3"), start=1):
            e.engine.hello(node, "s", 8)
            e.engine.receive(node, [Signal(node, SignalKind.XID, GpuRef(0, "GPU-0", "0000:18:00"), 79, seq=seq)])
        await e.wait_for_actions()
        assert LocalQuarantines(store.db).nodes().keys() == {"n1"}
        assert e.guard.holding and "vigil.dev/rack=r1" in e.guard.automation
        assert (await e.by_hand.resume("sre", "the rack's switch was replaced", apply_held=True))[:2] == (4, 0)
        await e.wait_for_actions()
        assert LocalQuarantines(store.db).nodes().keys() == {"n1", "n2", "n3"} and not e.guard.holding
        await e.shutdown()

    asyncio.run(scenario())


def test_a_component_found_at_fault_holds_its_nodes_whatever_their_labels() -> None:
    state = hold_domain(DomainState(), "fabric=spine s1", ["n1", "n2"])
    assert state.suspect == ("fabric=spine s1",) and held_domains(state, "n1") == ["fabric=spine s1"]
    assert hold_domain(state, "fabric=spine s1", ["n2", "n3"]).held == (
        ("fabric=spine s1", "n1"),
        ("fabric=spine s1", "n2"),
        ("fabric=spine s1", "n3"),
    )


def test_a_blamed_leaf_pages_once_and_cordons_none_of_its_nodes(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = Store(tmp_path / "ctl.db")
        labels = {n: {"vigil.dev/leaf-switch": "leaf-a"} for n in ("n1", "n2", "n3")}
        guardrails = GuardrailConfig(breaker_max_fraction=1.0, breaker_page_delay_s=0)
        pages: list[Page] = []
        e = node_route(store, Policy(), LocalActuator(store.db, labels), RecordingPager(pages), guardrails=guardrails)
        await e.upkeep.refresh_labels()
        for node in ("n1", "n2", "n3"):
            e.engine.hello(node, "s", 8)
        leaf = Finding("leaf leaf-a", "3 of its 3 nodes slow in every pair", "leaf", ("n1", "n2", "n3"))
        domain = "vigil.dev/leaf-switch=leaf-a"
        said, again = (
            e.engine.found(Found(leaf.node, key, leaf.reason, Source.SWEEP, behind=leaf.nodes, domain=domain))
            for key in ("sweep-1", "sweep-2")
        )
        await e.wait_for_actions()
        assert said.result is again.result is Result.HELD_IN_DOMAIN and not said.quarantined
        assert (
            "3 node(s) behind it, none taken out of service; paged once" in str(said)
            and "not paged again" in again.detail
        )
        assert LocalQuarantines(store.db).nodes() == {}
        assert [p.summary.split(" is slow")[0] for p in pages] == ["leaf leaf-a"]
        assert e.guard.holding and "vigil.dev/leaf-switch=leaf-a" in e.guard.automation
        assert (await e.by_hand.resume("sre", "the leaf was replaced", apply_held=False))[:2] == (0, 6)
        await e.shutdown()

    asyncio.run(scenario())


def _admit_by_definition(
    state: Plain, node: str, domains: list[str], config: DomainGuardConfig, now: float
) -> tuple[Plain, DomainAdmission, str]:
    """The domain guard as its window defines it, written plainly (every quarantine kept while in
    the window, each domain's nodes counted anew each time): what the faster code must answer."""
    recent, held = state
    recent = tuple(r for r in recent if r[2] > now - config.window_s)
    suspect = dict.fromkeys(d for d, _ in held)
    for domain in domains:
        if domain in suspect:
            return (recent, held if (domain, node) in held else (*held, (domain, node))), DomainAdmission.HOLD, domain
        nodes = {n for d, n, _ in recent if d == domain}
        if node not in nodes and len(nodes) >= config.max_nodes:
            return (recent, (*held, (domain, node))), DomainAdmission.SUSPECT, domain
    return ((*recent, *((d, node, now) for d in domains)), held), DomainAdmission.GO, ""


@given(
    st.lists(
        st.tuples(
            st.sampled_from("abcdefgh"),
            st.lists(st.sampled_from(["rack=r1", "rack=r2", "leaf=s1", "leaf=s2"]), max_size=2, unique=True),
            st.floats(-100, 400),
        ),
        max_size=50,
    ),
    st.integers(1, 4),
)
def test_the_domain_guard_answers_what_its_window_defines_whatever_the_clock_did(
    steps: list[tuple[str, list[str], float]], max_nodes: int
) -> None:
    config = DomainGuardConfig(labels=("rack", "leaf"), max_nodes=max_nodes, window_s=600.0)
    fast, plain = DomainState(), ((), ())
    now = 1000.0
    for node, domains, step in steps:  # a negative step: the clock stepped back
        now += step
        fast, said, where = admit_in_domains(fast, node, domains, config, now)
        plain, meant, there = _admit_by_definition(plain, node, domains, config, now)
        assert (said, where, fast.held) == (meant, there, plain[1])
        assert {(d, n) for d, n, _ in fast.recent.entries()} == {(d, n) for d, n, _ in plain[0]}
