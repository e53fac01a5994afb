"""Application XIDs on most of a job's nodes: the job's own crash (``controller.nodes.app_faults``)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from controller.act.local_actuator import LocalActuator
from controller.compose import node_route
from controller.nodes.app_faults import (
    AppFaultConfig,
    AppFaults,
    JobMembership,
    job_crash_page,
    job_crashed,
    job_of_crash_page,
)
from controller.nodes.decide import decide
from controller.nodes.engine import Engine
from controller.store import Store
from controller.vocab.actions import Page, PageUpdate
from controller.vocab.node_state import Health, NodeState
from controller.vocab.policy import Policy, Severity
from tests.fakes.pagers import RecordingPager
from vigil_core.signals import GpuRef, Signal, SignalKind

NODES = ("n1", "n2", "n3", "n4")
CFG = AppFaultConfig(window_s=60.0, fraction=0.5)


def xid(node: str, code: int, at: float) -> Signal:
    return Signal(node, SignalKind.XID, GpuRef(0, "GPU-0", "0000:18:00"), code, observed_at=at, seq=1)


def test_more_than_half_of_the_jobs_nodes_within_the_window_is_the_jobs_crash() -> None:
    assert not job_crashed(NODES, {"n1": 100.0, "n2": 100.0}, 100.0, CFG)  # half is not more than half
    assert job_crashed(NODES, {"n1": 100.0, "n2": 100.0, "n3": 101.0}, 101.0, CFG)
    assert not job_crashed(NODES, {"n1": 10.0, "n2": 10.0, "n3": 101.0}, 101.0, CFG)  # two are too old
    assert not job_crashed(("n1",), {"n1": 100.0}, 100.0, CFG)  # a one-node job: judged node by node


def test_only_application_xids_of_a_known_job_count_and_the_job_is_paged_once() -> None:
    membership = JobMembership()
    membership.set("train", NODES)
    faults, policy = AppFaults(membership, CFG), Policy()
    assert faults.crash_of(xid("n9", 79, 100.0), policy, 100.0) == ("", None)  # hardware: never the job's
    assert faults.crash_of(xid("n1", 13, 100.0), policy, 100.0) == ("", None)
    assert faults.crash_of(xid("n2", 31, 100.5), policy, 100.5) == ("", None)
    job, page = faults.crash_of(xid("n3", 13, 101.0), policy, 101.0)
    assert job == "train" and page is not None and page.node == "" and "3 of its 4 nodes" in page.summary
    assert faults.crash_of(xid("n4", 13, 101.2), policy, 101.2) == ("train", None)  # paged already
    membership.forget("train")
    assert faults.crash_of(xid("n4", 13, 102.0), policy, 102.0) == ("", None)


def test_a_teardowns_xids_are_claimed_by_a_crash_but_never_make_one() -> None:
    membership = JobMembership()
    membership.set("train", NODES)
    faults, policy = AppFaults(membership, CFG), Policy()
    for i, node in enumerate(NODES):  # a job killed or preempted: XID 43 and 45 on every node
        assert faults.crash_of(xid(node, 43 if i % 2 else 45, 100.0 + i / 10), policy, 100.5) == ("", None)
    for node in ("n1", "n2", "n3"):  # then a real crash: the teardown's after it are the crash's
        job, _ = faults.crash_of(xid(node, 13, 110.0), policy, 110.0)
    assert job == "train" and faults.crash_of(xid("n4", 45, 110.2), policy, 110.2) == ("train", None)


def test_a_hardware_xid_among_a_jobs_crash_caused_it_the_job_is_not_paged_as_its_own() -> None:
    membership = JobMembership()
    membership.set("train", NODES)
    faults, policy = AppFaults(membership, CFG), Policy()
    assert faults.crash_of(xid("n2", 95, 100.0), policy, 100.0) == ("", None)  # decided (quarantined) on its own
    results = [faults.crash_of(xid(n, 13, 100.5), policy, 100.5) for n in NODES]
    assert [job for job, _ in results] == ["", "", "train", "train"] and all(p is None for _, p in results)
    assert faults.hardware_on(NODES, 100.5) == ["n2"]
    assert faults.hardware_on(NODES, 100.0 + CFG.window_s + 1) == []  # an old one caused nothing


def test_a_hardware_xid_after_the_jobs_crash_was_paged_corrects_that_page_once() -> None:
    membership = JobMembership()
    membership.set("train", NODES)
    faults, policy = AppFaults(membership, CFG), Policy()
    pages = [p for n in NODES if (p := faults.crash_of(xid(n, 13, 100.0), policy, 100.0)[1]) is not None]
    (crash,) = pages
    assert isinstance(crash, Page)
    job, word = faults.crash_of(xid("n3", 79, 103.0), policy, 103.0)
    assert job == "" and isinstance(word, PageUpdate) and word.incident_id == crash.incident_id
    assert "n3 then wrote XID 79" in word.text and "hardware likely caused this crash" in word.text
    assert faults.crash_of(xid("n4", 79, 104.0), policy, 104.0) == ("", None)  # said once
    membership.set("other", ("n9",))
    assert faults.crash_of(xid("n9", 79, 104.0), policy, 104.0) == ("", None)  # not that job's node


def test_a_hardware_xid_long_after_the_crash_page_leaves_it_alone() -> None:
    membership = JobMembership()
    membership.set("train", NODES)
    faults, policy = AppFaults(membership, CFG), Policy()
    for n in NODES:
        faults.crash_of(xid(n, 13, 100.0), policy, 100.0)
    later = 100.0 + CFG.window_s + 1
    assert faults.crash_of(xid("n2", 79, later), policy, later) == ("", None)


def test_an_application_xid_of_a_crashed_job_is_recorded_without_action() -> None:
    policy, state = Policy(), NodeState("n1")
    for i, at in enumerate((10.0, 12.0)):  # crashes, seconds apart
        state = decide(state, xid("n1", 13, at), policy, at, f"inc-{i}", job_fault="train").state
    d = decide(state, xid("n1", 13, 14.0), policy, 14.0, "inc-2", job_fault="train")
    assert d.state.health is Health.HEALTHY and all(a.__class__.__name__ != "Page" for a in d.actions)
    alone = decide(state, xid("n1", 13, 14.0), policy, 14.0, "inc-2")
    assert alone.state.health is Health.SUSPECT  # the same third XID 13 without the job's crash
    hardware = decide(NodeState("n1"), xid("n1", 79, 10.0), policy, 10.0, "inc-h", job_fault="train")
    assert hardware.state.health is Health.UNHEALTHY  # job_fault never hides a hardware XID


def _engine(tmp_path: Path, now: list[float]) -> tuple[Engine, RecordingPager, JobMembership]:
    store, pager, membership = Store(tmp_path / "ctl.db"), RecordingPager(), JobMembership()
    faults = AppFaults(membership, AppFaultConfig(grace_s=2.0))
    engine = node_route(store, Policy(), LocalActuator(store.db), pager, clock=lambda: now[0], app_faults=faults).engine
    for n in NODES:
        engine.hello(n, f"spool-{n}", 8)
    membership.set("train", NODES)
    return engine, pager, membership


def three_xid13(engine: Engine, node: str, at: float) -> None:
    """Three crashes on the node's GPU 0 (lines closer than the policy's crash_s are one crash)."""
    engine.receive(node, [replace(xid(node, 13, at + 1.5 * i), seq=i + 1) for i in range(3)])


def test_a_jobs_node_waits_the_grace_for_the_others_then_is_decided(tmp_path: Path) -> None:
    """Three XID 13 at once on one node of a four-node job: no page at once (the job's other nodes
    may be about to report theirs); after the grace, none having come, the node is SUSPECT and paged."""

    async def scenario() -> None:
        now = [1000.0]
        engine, pager, _ = _engine(tmp_path, now)
        three_xid13(engine, "n1", now[0])
        await engine.wait_for_actions()
        assert engine.fleet.nodes["n1"].state.health is Health.HEALTHY and pager.sent == []
        now[0] += 1.0
        assert engine.decide_held() == 0  # still within the grace
        now[0] += 1.5
        assert engine.decide_held() == 1
        await engine.wait_for_actions()
        assert engine.fleet.nodes["n1"].state.health is Health.SUSPECT
        assert [(p.node, p.severity) for p in pager.sent] == [("n1", Severity.SUSPECT)]
        (incident,) = engine.store.incidents.list(node="n1")
        assert incident.severity == "suspect" and incident.signal_count == 3  # held, not counted twice

    asyncio.run(scenario())


def test_the_others_reporting_within_the_grace_make_it_the_jobs_crash(tmp_path: Path) -> None:
    async def scenario() -> None:
        now = [1000.0]
        engine, pager, _ = _engine(tmp_path, now)
        three_xid13(engine, "n1", now[0])  # first, alone: held
        now[0] += 0.3
        three_xid13(engine, "n2", now[0])
        three_xid13(engine, "n3", now[0])  # more than half of the job: its own crash
        now[0] += 5.0
        assert engine.decide_held() == 0  # n1's held XIDs were part of the crash
        await engine.wait_for_actions()
        assert {n: engine.fleet.nodes[n].state.health for n in NODES} == dict.fromkeys(NODES, Health.HEALTHY)
        assert [p.node for p in pager.sent] == [""]  # one page, about the job

    asyncio.run(scenario())


def test_without_a_job_the_third_xid13_is_decided_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        now = [1000.0]
        engine, pager, membership = _engine(tmp_path, now)
        membership.forget("train")
        three_xid13(engine, "n1", now[0])
        await engine.wait_for_actions()
        assert engine.fleet.nodes["n1"].state.health is Health.SUSPECT and len(pager.sent) == 1

    asyncio.run(scenario())


def test_a_held_xid_outlives_a_controller_killed_within_the_grace(tmp_path: Path) -> None:
    """The held decision is stored with the batch that held it: a controller started after a kill
    within the grace (no flush, no shutdown) decides it when the grace is over, once."""

    async def scenario() -> None:
        now = [1000.0]
        engine, _, _ = _engine(tmp_path, now)
        three_xid13(engine, "n1", now[0])
        engine.store.writer.catch_up()  # written (a moment later), not flushed
        again, pager, _ = _engine(tmp_path, now)  # the same file, read at once: what a restart reads
        now[0] += 1.0
        assert again.decide_held() == 0  # still within the grace
        now[0] += 1.5
        assert again.decide_held() == 1
        await again.wait_for_actions()
        assert again.fleet.nodes["n1"].state.health is Health.SUSPECT
        assert [(p.node, p.severity) for p in pager.sent] == [("n1", Severity.SUSPECT)]
        third, _, _ = _engine(tmp_path, now)  # decided: a later start has nothing left to decide
        assert third.decide_held() == 0
        for e in (engine, again, third):
            await e.store.group.durable()
            await e.shutdown()

    asyncio.run(scenario())


def test_a_held_xid_its_jobs_crash_claimed_is_not_decided_after_a_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        now = [1000.0]
        engine, _, _ = _engine(tmp_path, now)
        three_xid13(engine, "n1", now[0])  # held
        now[0] += 0.3
        three_xid13(engine, "n2", now[0])
        three_xid13(engine, "n3", now[0])  # the job's crash claims n1's
        engine.store.writer.catch_up()
        again, pager, _ = _engine(tmp_path, now)
        now[0] += 5.0
        assert again.decide_held() == 0
        assert again.fleet.nodes["n1"].state.health is Health.HEALTHY and pager.sent == []
        for e in (engine, again):
            await e.store.group.durable()
            await e.shutdown()

    asyncio.run(scenario())


def test_with_every_hold_taken_a_jobs_node_is_decided_at_once_not_forgotten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("controller.nodes.app_faults.MAX_HELD", 1)

    async def scenario() -> None:
        now = [1000.0]
        engine, pager, _ = _engine(tmp_path, now)
        three_xid13(engine, "n1", now[0])  # the one hold
        three_xid13(engine, "n2", now[0])  # no room to wait: decided now
        assert engine.fleet.nodes["n2"].state.health is Health.SUSPECT
        now[0] += 2.5
        assert engine.decide_held() == 1
        await engine.wait_for_actions()
        assert {n: engine.fleet.nodes[n].state.health for n in ("n1", "n2")} == dict.fromkeys(
            ("n1", "n2"), Health.SUSPECT
        )
        assert sorted(p.node for p in pager.sent) == ["n1", "n2"]
        await engine.shutdown()

    asyncio.run(scenario())


def test_a_crash_seen_across_a_restart_claims_what_the_last_controller_held(tmp_path: Path) -> None:
    """n1 and n2 of a four-node job crash (half: not yet the job's); the controller restarts; n3's
    crash after it makes three of four: the job's own, and n1's and n2's held XIDs are part of it."""

    async def scenario() -> None:
        now = [1000.0]
        engine, _, _ = _engine(tmp_path, now)
        three_xid13(engine, "n1", now[0])
        three_xid13(engine, "n2", now[0])
        engine.store.writer.catch_up()
        again, pager, _ = _engine(tmp_path, now)
        now[0] += 0.5
        three_xid13(again, "n3", now[0])
        now[0] += 5.0
        assert again.decide_held() == 0
        await again.wait_for_actions()
        assert {n: again.fleet.nodes[n].state.health for n in NODES} == dict.fromkeys(NODES, Health.HEALTHY)
        assert [p.node for p in pager.sent] == [""]  # one page, about the job
        for e in (engine, again):
            await e.store.group.durable()
            await e.shutdown()

    asyncio.run(scenario())


def test_a_jobs_crash_paged_before_a_restart_is_not_paged_again_after_it(tmp_path: Path) -> None:
    """The job's crash is paged, the controller restarts, and the job's nodes write their XIDs again
    within ``page_every_s`` (the same crash, still being torn down, or the next): no second page."""

    async def scenario() -> None:
        now = [1000.0]
        engine, pager, _ = _engine(tmp_path, now)
        for node in NODES[:3]:
            three_xid13(engine, node, now[0])
        await engine.wait_for_actions()
        assert [p.node for p in pager.sent] == [""]  # the job's page
        engine.store.writer.catch_up()
        again, pager_after, _ = _engine(tmp_path, now)
        now[0] += 60.0
        for node in NODES[:3]:  # the agents' next signals (their spools number on)
            again.receive(node, [replace(xid(node, 13, now[0] + 1.5 * i), seq=4 + i) for i in range(3)])
        assert again.fleet.nodes["n3"].last_seq == 6  # taken, not dropped as replays
        now[0] += 5.0
        again.decide_held()
        await again.wait_for_actions()
        assert pager_after.sent == []
        assert {n: again.fleet.nodes[n].state.health for n in NODES} == dict.fromkeys(NODES, Health.HEALTHY)
        for e in (engine, again):
            await e.store.group.durable()
            await e.shutdown()

    asyncio.run(scenario())


def test_a_crash_pages_incident_names_its_job() -> None:
    assert job_of_crash_page(job_crash_page("train-7b", ["n1"], ["n1"], 1234.5).incident_id) == "train-7b"
    assert job_of_crash_page("inc-42") == "" and job_of_crash_page("app-train-latest") == ""


def test_a_hardware_xid_before_a_restart_still_explains_the_jobs_crash_after_it(tmp_path: Path) -> None:
    """n4 writes XID 79 (hardware: quarantined, paged on its own); the controller restarts; n1-n3's
    crash lines arrive just after: the crash is the hardware's, not paged as the job's own code."""

    async def scenario() -> None:
        now = [1000.0]
        engine, pager, _ = _engine(tmp_path, now)
        engine.receive("n4", [replace(xid("n4", 79, now[0]), seq=1)])
        await engine.wait_for_actions()
        assert [p.node for p in pager.sent] == ["n4"]
        engine.store.writer.catch_up()
        await engine.store.group.durable()
        again, pager_after, membership = _engine(tmp_path, now)
        now[0] += 5.0
        for node in NODES[:3]:
            three_xid13(again, node, now[0])
        now[0] += 5.0
        again.decide_held()
        await again.wait_for_actions()
        assert [p.node for p in pager_after.sent if not p.node] == []  # no page blaming the job's code
        assert {n: again.fleet.nodes[n].state.health for n in NODES[:3]} == dict.fromkeys(NODES[:3], Health.HEALTHY)
        for e in (engine, again):
            await e.store.group.durable()
            await e.shutdown()

    asyncio.run(scenario())


def test_the_nodes_agents_say_which_jobs_they_run_where_no_report_does() -> None:
    membership = JobMembership()
    for node in ("n1", "n2", "n3"):
        membership.agent_sees(node, frozenset({"train"}))
    membership.agent_sees("n3", frozenset({"train", "eval"}))
    assert membership.jobs_of("n3") == [("eval", ("n3",)), ("train", ("n1", "n2", "n3"))]
    membership.agent_sees("n2", frozenset())  # its processes ended
    assert membership.jobs_of("n1") == [("train", ("n1", "n3"))] and membership.jobs_of("n2") == []
    membership.set("train", ["n1", "n2", "n3", "n4"])  # the job's own report says better
    assert membership.jobs_of("n3") == [("train", ("n1", "n2", "n3", "n4")), ("eval", ("n3",))]


def test_a_jobs_crash_is_known_from_its_agents_where_no_report_says_the_job(tmp_path: Path) -> None:
    """No report of the job (it has no hook, or the controller restarted and forgot the reports); the
    job's agents say it with their Hellos: its crash is the job's own (one page, nobody SUSPECT), not
    three bad GPUs."""

    async def scenario() -> None:
        now = [1000.0]
        store, pager = Store(tmp_path / "ctl.db"), RecordingPager()
        faults = AppFaults(JobMembership(), AppFaultConfig(grace_s=2.0))
        route = node_route(store, Policy(), LocalActuator(store.db), pager, clock=lambda: now[0], app_faults=faults)
        engine = route.engine
        for n in NODES:  # no job reports: only the agents say what runs
            engine.hello(n, f"spool-{n}", 8, jobs=["train"])
        for node in NODES[:3]:
            three_xid13(engine, node, now[0])
        now[0] += 5.0
        engine.decide_held()
        await engine.wait_for_actions()
        assert [p.node for p in pager.sent] == [""]  # the job's page
        assert {n: engine.fleet.nodes[n].state.health for n in NODES} == dict.fromkeys(NODES, Health.HEALTHY)
        await engine.store.group.durable()
        await engine.shutdown()

    asyncio.run(scenario())
