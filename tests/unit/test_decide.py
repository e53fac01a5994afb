"""The decision function, table-driven over docs/design.md's XID table and over windows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.nodes.decide import (
    MAX_KEYS,
    Decision,
    decide,
    heartbeat_returned,
    heartbeat_silence,
    quarantine_confirmed,
    quarantine_not_carried_out,
    recovered,
    silence_deadline,
    silenced,
    suspicion_lapsed,
)
from controller.vocab.actions import EscalateIncident, FoldIntoIncident, OpenIncident, Page, Quarantine
from controller.vocab.node_state import Health, NodeState, state_to_json
from controller.vocab.policy import Policy, Rule, Severity
from vigil_core.signals import THROTTLE_HW_SLOWDOWN, GpuRef, Signal, SignalKind

POLICY = Policy()
GPU0 = GpuRef(0, "GPU-0000", "0000:18:00")
GPU1 = GpuRef(1, "GPU-1111", "0000:2a:00")


def xid(code: int, at: float, gpu: GpuRef = GPU0, seq: int = 1) -> Signal:
    return Signal("n1", SignalKind.XID, gpu, code, 0.0, f"Xid {code}", "kmsg", at, seq)


def run(signals: Sequence[Signal], policy: Policy = POLICY, state: NodeState | None = None) -> list[Decision]:
    state = state or NodeState("n1")
    out = []
    for i, s in enumerate(signals):
        d = decide(state, s, policy, s.observed_at, f"inc-{i}")
        out.append(d)
        state = d.state
    return out


def kinds(decisions: Sequence[Decision]) -> list[type]:
    return [type(a) for d in decisions for a in d.actions]


@pytest.mark.parametrize(
    ("code", "health", "quarantines", "pages"),
    [
        (13, Health.HEALTHY, 0, 0),
        (31, Health.HEALTHY, 0, 0),
        (43, Health.HEALTHY, 0, 0),
        (45, Health.HEALTHY, 0, 0),
        (48, Health.UNHEALTHY, 1, 1),
        (63, Health.HEALTHY, 0, 0),
        (64, Health.UNHEALTHY, 1, 1),
        (74, Health.UNHEALTHY, 1, 1),
        (79, Health.UNHEALTHY, 1, 1),
        (92, Health.HEALTHY, 0, 0),  # NVIDIA: IGNORE
        (94, Health.HEALTHY, 0, 0),
        (95, Health.UNHEALTHY, 1, 1),
        (109, Health.UNHEALTHY, 1, 1),  # NVIDIA: RESET_GPU
        (8, Health.HEALTHY, 0, 0),  # RESTART_APP: the application's, SUSPECT only when it repeats
        (62, Health.UNHEALTHY, 1, 1),  # PMU halt: RESET_GPU
        (121, Health.HEALTHY, 0, 0),  # IGNORE
        (145, Health.UNHEALTHY, 1, 1),  # NVLink5: its workflow
        (151, Health.UNHEALTHY, 1, 1),  # RESTART_VM
        (154, Health.SUSPECT, 0, 1),  # a recovery action its text does not name: a person reads it
        (119, Health.UNHEALTHY, 1, 1),
        (120, Health.UNHEALTHY, 1, 1),
        (140, Health.UNHEALTHY, 1, 1),
        (999, Health.SUSPECT, 0, 1),  # unknown XID: suspect and page
    ],
)
def test_one_xid_follows_the_default_table(code: int, health: Health, quarantines: int, pages: int) -> None:
    (d,) = run([xid(code, 100.0)])
    assert d.state.health is health
    assert kinds([d]).count(Quarantine) == quarantines
    assert kinds([d]).count(Page) == pages
    assert kinds([d]).count(OpenIncident) == 1  # every XID is at least recorded


def test_unknown_xid_page_says_contact_support() -> None:
    (d,) = run([xid(4242, 1.0)])
    page = next(a for a in d.actions if isinstance(a, Page))
    assert "support" in page.remedy


def test_xid_13_three_times_in_window_is_suspect_with_one_incident() -> None:
    ds = run([xid(13, 0.0, seq=1), xid(13, 60.0, seq=2), xid(13, 120.0, seq=3)])
    assert [d.state.health for d in ds] == [Health.HEALTHY, Health.HEALTHY, Health.SUSPECT]
    assert kinds(ds) == [OpenIncident, FoldIntoIncident, EscalateIncident, Page]
    page = ds[-1].actions[-1]
    assert isinstance(page, Page) and page.incident_id == "inc-0"  # the first incident, escalated
    assert Quarantine not in kinds(ds)  # never cordon on XID 13


def test_xid_13_spread_beyond_the_window_stays_healthy() -> None:
    ds = run([xid(13, 0.0), xid(13, 400.0), xid(13, 800.0)])  # never 3 within 600 s
    assert ds[-1].state.health is Health.HEALTHY
    assert Page not in kinds(ds)


def test_xid_13_counts_per_gpu() -> None:
    ds = run([xid(13, 0.0, GPU0), xid(13, 1.0, GPU1), xid(13, 2.0, GPU0), xid(13, 3.0, GPU1)])
    assert ds[-1].state.health is Health.HEALTHY


def test_flood_of_xid_45_is_one_record_and_no_action() -> None:
    ds = run([xid(45, float(t), seq=t + 1) for t in range(200)])
    assert kinds(ds).count(OpenIncident) == 1
    assert kinds(ds).count(FoldIntoIncident) == 199
    assert Page not in kinds(ds) and Quarantine not in kinds(ds)
    assert ds[-1].state.health is Health.HEALTHY


def test_xid_45_after_the_fold_window_opens_a_new_record() -> None:
    ds = run([xid(45, 0.0), xid(45, POLICY.fold_window_s + 1)])
    assert kinds(ds) == [OpenIncident, OpenIncident]


def test_a_rule_that_escalates_quarantines_on_its_count() -> None:
    policy = Policy(xid={109: Rule(action=Severity.SUSPECT, escalate_after=3, window_s=3600)})
    ds = run([xid(109, 0.0), xid(109, 600.0), xid(109, 1200.0)], policy)
    assert [d.state.health for d in ds] == [Health.SUSPECT, Health.SUSPECT, Health.UNHEALTHY]
    assert kinds(ds).count(Quarantine) == 1


def test_an_out_of_service_node_is_not_quarantined_twice() -> None:
    ds = run([xid(79, 0.0), xid(48, 1.0, GPU1), xid(45, 2.0)])
    assert kinds(ds).count(Quarantine) == 1
    assert kinds(ds).count(Page) == 1
    assert kinds(ds).count(OpenIncident) == 3  # the evidence is still kept


def test_repeated_xid_79_folds_into_the_open_incident() -> None:
    ds = run([xid(79, 0.0), xid(79, 1.0)])
    assert kinds(ds) == [OpenIncident, Quarantine, Page, FoldIntoIncident]


@pytest.mark.parametrize(
    ("kind", "health"),
    [
        (SignalKind.ECC_DBE, Health.UNHEALTHY),
        (SignalKind.ROW_REMAP_PENDING, Health.UNHEALTHY),
        (SignalKind.ROW_REMAP_FAILURE, Health.UNHEALTHY),
        (SignalKind.GPU_LOST, Health.UNHEALTHY),
        (SignalKind.RETIRED_PAGES, Health.HEALTHY),
    ],
)
def test_gpu_poll_signal_kinds(kind: SignalKind, health: Health) -> None:
    (d,) = run([Signal("n1", kind, GPU0, 0, 1.0, "", "gpu-poll", 5.0, 1)])
    assert d.state.health is health


def test_throttling_counts_only_past_the_policy_window() -> None:
    short = Signal("n1", SignalKind.THROTTLE, GPU0, THROTTLE_HW_SLOWDOWN, 5.0, "", "gpu-poll", 5.0, 1)
    long = Signal("n1", SignalKind.THROTTLE, GPU0, THROTTLE_HW_SLOWDOWN, 35.0, "", "gpu-poll", 35.0, 2)
    ended = Signal("n1", SignalKind.THROTTLE, GPU0, 0, 0.0, "", "gpu-poll", 40.0, 3)
    ds = run([short, long, ended])
    assert [len(d.actions) for d in ds] == [0, 2, 0]
    assert ds[1].state.health is Health.SUSPECT


def test_policy_file_overrides_one_rule_and_keeps_the_rest() -> None:
    policy = Policy.model_validate({"xid": {13: {"action": "quarantine"}}})
    (d,) = run([xid(13, 0.0)], policy)
    assert d.state.health is Health.UNHEALTHY
    assert policy.xid[79] == POLICY.xid[79]


def test_silence_makes_a_node_unknown_and_a_heartbeat_restores_it() -> None:
    suspect = NodeState("n1", Health.SUSPECT)
    assert heartbeat_silence(suspect, 10.0, POLICY) is suspect
    silent = heartbeat_silence(suspect, POLICY.heartbeat_timeout_s + 1, POLICY)
    assert silent.health is Health.UNKNOWN
    assert heartbeat_returned(silent).health is Health.SUSPECT


def test_silence_comes_after_the_stream_closes_or_after_three_quiet_idle_heartbeats() -> None:
    timeout = POLICY.heartbeat_timeout_s
    # The stream closed at 100 (heard last at 95): silent at 130, however long its idle heartbeats.
    assert silence_deadline(95.0, False, 100.0, 60.0, POLICY) == 100.0 + timeout
    # The stream open: three idle heartbeats after it last said anything...
    assert silence_deadline(95.0, True, 0.0, 60.0, POLICY) == 95.0 + 180.0
    # ...never sooner than the policy's timeout; an agent that beats steadily (0) gets the timeout.
    assert silence_deadline(95.0, True, 0.0, 1.0, POLICY) == 95.0 + timeout
    assert silence_deadline(95.0, True, 0.0, 0.0, POLICY) == 95.0 + timeout
    # The controller held (its event loop late) 7 s since the agent last spoke: that much later.
    held = {95.0: 7.0, 100.0: 5.0}
    assert silence_deadline(95.0, True, 0.0, 0.0, POLICY, held.__getitem__) == 95.0 + timeout + 7.0
    assert silence_deadline(95.0, False, 100.0, 0.0, POLICY, held.__getitem__) == 100.0 + timeout + 5.0
    assert silenced(NodeState("n1", Health.HEALTHY)).health is Health.UNKNOWN


def test_silence_never_hides_a_quarantine() -> None:
    quarantined = quarantine_confirmed(NodeState("n1", Health.UNHEALTHY), 5.0)
    assert quarantined.health is Health.QUARANTINED
    assert heartbeat_silence(quarantined, 1e6, POLICY).health is Health.QUARANTINED


def test_recovery_forgets_old_counts() -> None:
    ds = run([xid(13, 0.0), xid(13, 1.0)])
    fresh = recovered(ds[-1].state)
    (d,) = run([xid(13, 2.0)], state=fresh)
    assert d.state.health is Health.HEALTHY


def test_rule_thresholds() -> None:
    rule = Rule(action=Severity.SUSPECT, threshold=3, escalate_after=5)
    assert [rule.severity_at(n) for n in (1, 3, 5)] == [Severity.RECORD, Severity.SUSPECT, Severity.QUARANTINE]


_HEALTH_RANK = {Health.HEALTHY: 0, Health.SUSPECT: 1, Health.UNHEALTHY: 2}


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([13, 31, 43, 45, 48, 79, 92, 109, 999]), st.integers(0, 1), st.floats(0, 5.0)),
        max_size=40,
    )
)
def test_signals_never_lower_health_nor_quarantine_twice(events: list[tuple[int, int, float]]) -> None:
    at, signals = 0.0, []
    for i, (code, gpu, gap) in enumerate(events):
        at += gap
        signals.append(xid(code, at, GPU0 if gpu == 0 else GPU1, seq=i + 1))
    ds = run(signals)
    ranks = [_HEALTH_RANK[d.state.health] for d in ds]
    assert ranks == sorted(ranks)
    assert kinds(ds).count(Quarantine) <= 1
    assert all(kinds([d]).count(Page) <= 1 for d in ds)


# A hung collector: the node is UNKNOWN (Vigil is blind to it), never HEALTHY -------------------


def hung(code: int, at: float, collector: str = "gpu-poll", seq: int = 1) -> Signal:
    return Signal("n1", SignalKind.COLLECTOR_HUNG, GpuRef(), code, 30.0, f"{collector} hung", collector, at, seq)


def test_hung_collector_makes_the_node_unknown_and_pages() -> None:
    decision = run([hung(1, 100.0)])[-1]
    assert decision.state.health is Health.UNKNOWN
    assert decision.state.hung_collectors == frozenset({"gpu-poll"})
    assert any(isinstance(a, Page) for a in decision.actions)
    assert not any(isinstance(a, Quarantine) for a in decision.actions)


def test_heartbeats_do_not_clear_a_hung_collector() -> None:
    state = run([hung(1, 100.0)])[-1].state
    assert heartbeat_returned(state).health is Health.UNKNOWN


def test_recovery_of_the_last_hung_collector_ends_unknown() -> None:
    decisions = run([hung(1, 100.0, "gpu-poll"), hung(1, 101.0, "nvml-events", 2), hung(0, 110.0, "gpu-poll", 3)])
    assert decisions[-1].state.health is Health.UNKNOWN  # nvml-events is still stuck
    state = decide(decisions[-1].state, hung(0, 120.0, "nvml-events", 4), POLICY, 120.0, "i5").state
    # One hang was worth a page: the node comes back SUSPECT, not HEALTHY.
    assert state.health is Health.SUSPECT
    assert state.hung_collectors == frozenset()


def test_a_fault_while_blind_still_quarantines() -> None:
    decisions = run([hung(1, 100.0), xid(79, 101.0, seq=2)])
    assert decisions[-1].state.health is Health.UNHEALTHY
    assert any(isinstance(a, Quarantine) for a in decisions[-1].actions)


def test_hung_collectors_survive_the_store_round_trip() -> None:
    from controller.vocab.node_state import state_from_json, state_to_json

    state = run([hung(1, 100.0)])[-1].state
    assert state_from_json(state_to_json(state), "n1") == state


def test_a_storm_folded_at_the_agent_counts_as_its_observations() -> None:
    """One signal standing for three observations crosses a threshold of three on its own (an
    application XID's storm counts its crashes instead: below)."""
    policy = Policy(xid={200: Rule(action=Severity.SUSPECT, threshold=3)})
    storm = Signal("n1", SignalKind.XID, GPU0, 200, 0.0, "Xid 200", "kmsg", 5.0, 1, count=3, first_observed_at=4.0)
    (d,) = run([storm], policy)
    assert d.state.health is Health.SUSPECT
    assert kinds([d]) == [OpenIncident, Page]
    opened = d.actions[0]
    assert isinstance(opened, OpenIncident) and opened.count == 3
    (d2,) = run([replace(storm, seq=2, count=500)], policy, state=d.state)
    fold = d2.actions[0]
    assert isinstance(fold, FoldIntoIncident) and fold.count == 500
    # An application XID's storm: one crash when its lines came within crash_s, else two at most
    # (its first and its last), however many lines it folded.
    app = replace(storm, code=13, count=300, first_observed_at=4.5)
    assert run([app])[0].state.recent["GPU-0000|XID|13"] == (5.0,)
    assert run([replace(app, first_observed_at=1.0)])[0].state.recent["GPU-0000|XID|13"] == (5.0, 5.0)


def test_a_flood_keeps_the_node_state_small() -> None:
    """A decision's cost and the state written stay bounded however long the flood: per key only as
    many times as the rule's threshold needs, per node at most MAX_KEYS keys and incident refs."""
    state = NodeState("n1")
    for i in range(20_000):
        state = decide(state, xid(45, 1.0 + i * 0.001, seq=i + 1), POLICY, 100.0, f"inc-{i}").state
    assert sum(len(v) for v in state.recent.values()) == 1 and len(state.incidents) == 1
    for i in range(2_000):  # made-up codes on made-up GPUs: each a new key
        signal = xid(100_000 + i, 30.0 + i * 0.001, GpuRef(i % 64, f"GPU-{i % 64}"), seq=30_000 + i)
        state = decide(state, signal, POLICY, 100.0, f"junk-{i}").state
    assert len(state.recent) <= MAX_KEYS and len(state.incidents) <= MAX_KEYS
    assert len(state_to_json(state)) < 100_000


def test_a_quarantine_not_carried_out_leaves_the_node_in_service_as_suspect() -> None:
    (d,) = run([xid(79, 10.0)])
    assert d.state.health is Health.UNHEALTHY
    assert quarantine_not_carried_out(d.state).health is Health.SUSPECT
    confirmed = quarantine_confirmed(d.state, 11.0)
    assert quarantine_not_carried_out(confirmed) is confirmed  # only an undone decision is undone


def test_suspicion_lapses_after_the_quiet_period_and_only_then() -> None:
    policy = Policy(suspect_clear_s=60.0)
    *_, d = run([xid(13, 10.0), xid(13, 11.0), xid(13, 12.0)], policy)
    assert d.state.health is Health.SUSPECT
    assert not suspicion_lapsed(d.state, 12.0 + 60.0, policy)
    assert suspicion_lapsed(d.state, 12.0 + 60.1, policy)
    # A recorded-only signal after the page is no reason to stay suspect; a new page-worthy one is.
    later = decide(d.state, xid(43, 50.0, seq=9), policy, 50.0, "inc-x").state
    assert suspicion_lapsed(later, 12.0 + 60.1, policy)
    again = decide(d.state, xid(999, 50.0, GPU1, seq=10), policy, 50.0, "inc-y").state
    assert not suspicion_lapsed(again, 12.0 + 60.1, policy)
    assert not suspicion_lapsed(d.state, 1e9, Policy(suspect_clear_s=None))  # null: never
    (q,) = run([xid(79, 10.0)], policy)
    assert not suspicion_lapsed(q.state, 1e9, policy)  # only SUSPECT lapses


def test_the_time_the_controller_was_held_is_not_a_suspects_quiet() -> None:
    # Held 5 s since the last fault (a new one may wait unread): the quiet period ends 5 s later.
    policy = Policy(suspect_clear_s=60.0)
    *_, d = run([xid(13, 10.0), xid(13, 11.0), xid(13, 12.0)], policy)
    held = {12.0: 5.0}.get
    assert not suspicion_lapsed(d.state, 12.0 + 60.1, policy, lambda t: held(t, 0.0))
    assert suspicion_lapsed(d.state, 12.0 + 65.1, policy, lambda t: held(t, 0.0))


def test_a_fatal_sxid_quarantines_and_non_fatal_ones_make_the_node_suspect_only_when_repeated() -> None:
    switch = GpuRef(pci_bus_id="0000:c6:00")
    (fatal,) = run([Signal("n1", SignalKind.SXID_FATAL, switch, 24007, 0.0, "Fatal", "kmsg", 5.0, 1)])
    assert fatal.state.health is Health.UNHEALTHY
    assert any(a.__class__.__name__ == "Quarantine" for a in fatal.actions)
    nonfatal = [
        Signal("n1", SignalKind.SXID_NONFATAL, switch, 12028, 0.0, "", "kmsg", 5.0 + i, i + 1) for i in range(3)
    ]
    ds = run(nonfatal)
    assert [d.state.health for d in ds] == [Health.HEALTHY, Health.HEALTHY, Health.SUSPECT]
    assert not any(a.__class__.__name__ == "Page" for d in ds[:2] for a in d.actions)


def test_an_application_xid_counts_crashes_not_lines() -> None:
    burst = run([xid(13, 10.0 + i / 100) for i in range(6)])  # one crash: a line per SM, within a second
    assert burst[-1].state.health is Health.HEALTHY and Page not in kinds(burst)
    crashes = run([xid(13, 10.0), xid(13, 10.2), xid(13, 12.0), xid(13, 14.0)])  # three crashes
    assert [d.state.health for d in crashes][-2:] == [Health.HEALTHY, Health.SUSPECT]
    storm = run([replace(xid(13, 10.0), count=50)])  # folded at the agent: one crash still
    assert storm[0].state.recent["GPU-0000|XID|13"] == (10.0,)
    hardware = run([replace(xid(48, 10.0), count=1), xid(48, 10.1, GPU1)])  # not the application's: every one
    assert kinds(hardware).count(Quarantine) == 1
