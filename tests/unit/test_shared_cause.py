from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.act.local_actuator import LocalActuator, LocalQuarantines
from controller.compose import NodeRoute, node_route
from controller.nodes.guards.rules import GuardrailConfig
from controller.nodes.guards.shared import (
    FleetIncident,
    SharedAdmission,
    SharedCauseConfig,
    SharedState,
    admit_shared,
    common_factors,
    fleet_summary,
    settles,
    shared_threshold,
)
from controller.store import Store
from controller.vocab.actions import Page
from controller.vocab.policy import Policy
from tests.fakes.pagers import RecordingPager
from vigil_core.signals import GpuRef, Signal, SignalKind

CFG = SharedCauseConfig(min_nodes=3, share=0.1, window_s=60)


def test_the_third_node_with_one_fault_opens_a_fleet_incident_and_later_ones_join() -> None:
    state = SharedState()
    admissions = []
    for t, node in enumerate(("n1", "n2", "n3", "n4")):
        state, admission = admit_shared(state, "xid-79", node, 8, CFG, 100.0 + t)
        admissions.append(admission)
    assert admissions == [SharedAdmission.GO, SharedAdmission.GO, SharedAdmission.OPEN, SharedAdmission.JOIN]
    incident = state.incident("xid-79")
    assert incident is not None and incident.nodes == ("n1", "n2", "n3", "n4") and incident.first_at == 100.0
    assert state.holds("xid-79", "n1") is incident and state.holds("xid-48", "n1") is None
    # Another fault on a node of the incident is that node's own.
    assert admit_shared(state, "xid-48", "n1", 8, CFG, 105.0)[1] is SharedAdmission.GO


def test_one_node_repeating_its_fault_is_not_a_shared_cause() -> None:
    state = SharedState()
    for t in range(10):
        state, admission = admit_shared(state, "xid-79", "n1", 8, CFG, 100.0 + t)
        assert admission is SharedAdmission.GO
    assert len(state.recent) == 1


def test_faults_further_apart_than_the_window_are_each_their_own() -> None:
    state = SharedState()
    for t, node in enumerate(("n1", "n2", "n3", "n4")):
        state, admission = admit_shared(state, "xid-79", node, 8, CFG, 100.0 + 40 * t)
        assert admission is SharedAdmission.GO


def test_the_threshold_is_a_share_of_a_large_fleet() -> None:
    assert shared_threshold(4, CFG) == 3
    assert shared_threshold(1000, CFG) == 100
    state = SharedState()
    for i in range(99):
        state, admission = admit_shared(state, "throttle", f"n{i}", 1000, CFG, 100.0)
        assert admission is SharedAdmission.GO
    assert admit_shared(state, "throttle", "n99", 1000, CFG, 100.0)[1] is SharedAdmission.OPEN
    assert admit_shared(SharedState(), "x", "n1", 8, SharedCauseConfig(enabled=False), 0.0)[1] is SharedAdmission.GO


def test_the_page_names_the_count_the_span_and_what_only_these_nodes_share() -> None:
    labels = {
        "n1": {"nvidia.com/cuda.driver-version.full": "575.51.03", "zone": "a"},
        "n2": {"nvidia.com/cuda.driver-version.full": "575.51.03", "zone": "a"},
        "n3": {"nvidia.com/cuda.driver-version.full": "570.124.06", "zone": "a"},
    }
    factors = common_factors(["n1", "n2"], labels, ["n1", "n2", "n3"])
    assert factors == ["nvidia.com/cuda.driver-version.full=575.51.03 (only these nodes)", "zone=a"]
    incident = FleetIncident("xid-79", opened_at=110.0, first_at=100.0, nodes=("n1", "n2", "n3"))
    text = fleet_summary(incident, 8, factors, acted=["n1"])
    assert "xid-79 on 3 of 8 nodes within 10.0 s" in text and "held: n2, n3" in text
    assert "acted on before it was seen as shared: n1" in text and "575.51.03 (only these nodes)" in text


def _route(tmp_path: Path, pages: list[Page], **shared: object) -> NodeRoute:
    store = Store(tmp_path / "ctl.db")
    guard = GuardrailConfig(breaker_max_fraction=1.0, breaker_page_delay_s=0, shared=shared)  # type: ignore[arg-type]
    return node_route(store, Policy(), LocalActuator(store.db), RecordingPager(pages), guardrails=guard)


def _xid(node: str, code: int = 79, seq: int = 1) -> Signal:
    return Signal(node, SignalKind.XID, GpuRef(0), code, seq=seq)


def test_a_burst_on_much_of_the_fleet_is_one_page_and_no_cordon_until_a_person_decides(tmp_path: Path) -> None:
    async def scenario() -> None:
        pages: list[Page] = []
        e = _route(tmp_path, pages)
        for node in ("n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8"):
            e.engine.hello(node, "s", 8)
        for node in ("n1", "n2", "n3", "n4"):  # within one settling window
            e.engine.receive(node, [_xid(node)])
        await e.wait_for_actions()
        await asyncio.sleep(0.05)  # the fleet page's task
        await e.wait_for_actions()
        assert LocalQuarantines(e.store.db).nodes() == {}
        (page,) = pages
        assert page.node == "" and "xid-79 on 4 of 8 nodes" in page.summary and "vigil resume" in page.remedy
        assert "fleet incident" in e.guard.automation
        e.engine.receive("n5", [_xid("n5")])  # a later node joins it: held, no page of its own
        await e.wait_for_actions()
        assert len(pages) == 1 and LocalQuarantines(e.store.db).nodes() == {}
        applied = await e.by_hand.resume("sre", "bad driver roll-out", apply_held=True)
        assert applied == (10, 0, ["n1", "n2", "n3", "n4", "n5"])
        await e.wait_for_actions()
        assert LocalQuarantines(e.store.db).nodes().keys() == {"n1", "n2", "n3", "n4", "n5"}
        assert not e.guard.holding
        await e.shutdown()
        e.store.close()

    asyncio.run(scenario())


def test_a_lone_fault_is_acted_on_after_the_settling_window(tmp_path: Path) -> None:
    async def scenario() -> None:
        pages: list[Page] = []
        e = _route(tmp_path, pages, settle_s=0.2)
        for node in ("n1", "n2", "n3", "n4"):
            e.engine.hello(node, "s", 8)
        e.engine.receive("n1", [_xid("n1")])
        await asyncio.sleep(0.1)
        assert LocalQuarantines(e.store.db).nodes() == {}  # still settling
        await e.wait_for_actions()
        assert LocalQuarantines(e.store.db).nodes().keys() == {"n1"}
        assert [p.node for p in pages] == ["n1"]
        await e.shutdown()
        e.store.close()

    asyncio.run(scenario())


def test_which_nodes_are_cordoned_does_not_depend_on_the_order_a_burst_arrives(tmp_path: Path) -> None:
    async def one(order: tuple[str, ...], folder: Path) -> set[str]:
        folder.mkdir()
        e = _route(folder, [])
        for node in ("n1", "n2", "n3", "n4", "n5"):
            e.engine.hello(node, "s", 8)
        e.engine.receive("n5", [_xid("n5", code=48)])  # another fault, its own
        for node in order:
            e.engine.receive(node, [_xid(node)])
        await e.wait_for_actions()
        cordoned = set(LocalQuarantines(e.store.db).nodes())
        await e.shutdown()
        e.store.close()
        return cordoned

    seen = {
        frozenset(asyncio.run(one(order, tmp_path / "".join(order))))
        for order in itertools.permutations(("n1", "n2", "n3"))
    }
    assert seen == {frozenset({"n5"})}  # its own fault; none of the XID 79 burst, whichever came first


def test_an_open_fleet_incident_holds_after_a_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        e = _route(tmp_path, [])
        for node in ("n1", "n2", "n3", "n4"):
            e.engine.hello(node, "s", 8)
        for node in ("n1", "n2", "n3"):
            e.engine.receive(node, [_xid(node)])
        await e.wait_for_actions()
        await e.shutdown()
        e.store.close()
        again = _route(tmp_path, [])
        assert "xid-79 on 3 node(s)" in again.guard.automation
        again.engine.receive("n4", [_xid("n4", seq=2)])
        await again.wait_for_actions()
        assert LocalQuarantines(again.store.db).nodes() == {}
        await again.shutdown()
        again.store.close()

    asyncio.run(scenario())


Plain = tuple[tuple[tuple[str, str, float], ...], tuple[FleetIncident, ...]]  # every (rule, node, when), open


def _admit_by_definition(
    state: Plain, rule: str, node: str, fleet_size: int, config: SharedCauseConfig, now: float
) -> tuple[Plain, SharedAdmission]:
    """The admission as the window defines it, written plainly (every node of the rule in the window,
    this one last unless already there, the window a tuple of (rule, node, when) filtered anew each
    time): what the faster code must answer."""
    recent, open_ = state
    recent = tuple(r for r in recent if r[2] > now - config.window_s)
    if (incident := next((i for i in open_ if i.rule == rule), None)) is not None:
        joined = incident if node in incident.nodes else replace(incident, nodes=(*incident.nodes, node))
        return (recent, tuple(joined if i.rule == rule else i for i in open_)), SharedAdmission.JOIN
    seen = [(n, t) for r, n, t in recent if r == rule]
    nodes = list(dict.fromkeys([*(n for n, _ in seen), node]))
    if not config.enabled or len(nodes) < shared_threshold(fleet_size, config):
        mine = () if (rule, node) in {(r, n) for r, n, _ in recent} else ((rule, node, now),)
        return ((*recent, *mine), open_), SharedAdmission.GO
    first = min((t for _, t in seen), default=now)
    opened = FleetIncident(rule=rule, opened_at=now, first_at=first, nodes=tuple(nodes))
    return (recent, (*open_, opened)), SharedAdmission.OPEN


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["xid-79", "xid-48", "xid-94"]), st.integers(0, 9), st.floats(0, 40)),
        max_size=60,
    ),
    st.integers(3, 6),
)
def test_admission_is_what_the_window_defines(faults: list[tuple[str, int, float]], min_nodes: int) -> None:
    config = SharedCauseConfig(min_nodes=min_nodes, share=0.1, window_s=30)
    fast, plain = SharedState(), ((), ())
    now = 1000.0
    for rule, n, step in faults:
        now += step
        fast, said = admit_shared(fast, rule, f"n{n}", 40, config, now)
        plain, meant = _admit_by_definition(plain, rule, f"n{n}", 40, config, now)
        assert (said, fast.open) == (meant, plain[1])
        assert fast.recent.entries() == list(plain[0])  # the same window, in the same order


def test_nothing_settles_where_no_fleet_incident_could_open(tmp_path: Path) -> None:
    """The settling window holds a quarantine only so that a fleet incident opening meanwhile may hold
    it: with the guard off, or fewer nodes than its threshold, a fault is acted on at once (here a
    5 s window, against 2 s of patience), and the fleet page counts it as acted on all the same."""

    async def acted_within_2s(folder: Path, nodes: int, **shared: object) -> bool:
        folder.mkdir()
        e = _route(folder, [], settle_s=5.0, **shared)
        for i in range(nodes):
            e.engine.hello(f"n{i}", "s", 8)
        e.engine.receive("n0", [_xid("n0")])
        try:
            await asyncio.wait_for(e.wait_for_actions(), 2.0)
            return set(LocalQuarantines(e.store.db).nodes()) == {"n0"}
        except TimeoutError:
            return False
        finally:
            await e.shutdown()
            e.store.close()

    assert asyncio.run(acted_within_2s(tmp_path / "off", 8, enabled=False))
    assert asyncio.run(acted_within_2s(tmp_path / "small", 2, min_nodes=3))  # 3 needed, 2 in the fleet
    assert not asyncio.run(acted_within_2s(tmp_path / "on", 3, min_nodes=3))  # 3 of 3 could: it settles


def test_settles_only_where_the_threshold_is_within_the_fleet() -> None:
    assert settles(8, CFG) and settles(3, CFG) and not settles(2, CFG)
    assert settles(100_000, CFG)  # 10% of it: 10,000 nodes
    assert not settles(100_000, CFG.model_copy(update={"min_nodes": 100_001}))
    assert not settles(8, CFG.model_copy(update={"enabled": False})) and not settles(
        8, CFG.model_copy(update={"settle_s": 0.0})
    )
