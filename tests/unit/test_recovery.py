from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from controller.act.actuators import NullPager
from controller.act.local_actuator import LocalActuator, LocalQuarantines
from controller.compose import node_route
from controller.nodes.decide import quarantine_confirmed, recovered
from controller.nodes.recovery.rules import (
    RecoveryConfig,
    check_releases,
    release_check_due,
    repeat_offender,
    repeat_offender_note,
)
from controller.store import Store
from controller.vocab.node_state import Health, NodeState, state_from_json, state_to_json
from controller.vocab.policy import Policy
from protos.vigil.v1 import common_pb2
from vigil_core.signals import GpuRef, Signal, SignalKind

CFG = RecoveryConfig(hold_down_s=600, check_every_s=60)
OUT = NodeState("n1", Health.QUARANTINED, quarantined_at=1000.0)


def test_no_check_before_the_hold_down() -> None:
    assert not release_check_due(OUT, None, CFG, 1599.0)
    assert release_check_due(OUT, None, CFG, 1600.0)
    assert not release_check_due(OUT, 1600.0, CFG, 1630.0)  # asked recently
    assert release_check_due(OUT, 1600.0, CFG, 1660.0)


def test_only_quarantined_nodes_and_only_when_enabled() -> None:
    assert not release_check_due(NodeState("n1", Health.UNHEALTHY), None, CFG, 1e9)
    assert not release_check_due(OUT, None, RecoveryConfig(auto_release=False), 1e9)


def test_a_result_releases_only_if_it_passed_after_the_hold_down() -> None:
    assert check_releases(OUT, "OK", 1600.0, CFG)
    assert not check_releases(OUT, "OK", 1599.0, CFG)  # ran too early (a stale result)
    assert not check_releases(OUT, "FAIL", 1700.0, CFG)
    assert not check_releases(OUT, "UNKNOWN", 1700.0, CFG)  # a check that could not run never releases
    assert check_releases(OUT, "OK", 1600.0, CFG, gpus=8, expected_gpus=8)
    assert not check_releases(OUT, "OK", 1600.0, CFG, gpus=7, expected_gpus=8)  # back with fewer GPUs


def test_engine_asks_the_agent_and_releases_on_a_pass(tmp_path: Path) -> None:
    async def scenario() -> None:
        now = [1000.0]
        store = Store(tmp_path / "ctl.db")
        e = node_route(store, Policy(), LocalActuator(store.db), NullPager(), clock=lambda: now[0], recovery=CFG)
        to_n1 = e.outboxes.open("n1")  # as the gateway does when n1's agent connects
        e.engine.hello("n1", "s", 8)
        e.engine.receive("n1", [Signal("n1", SignalKind.XID, GpuRef(0), code=79, observed_at=now[0], seq=1)])
        await e.wait_for_actions()
        assert e.fleet.nodes["n1"].state.health is Health.QUARANTINED
        assert e.releases.ask() == []
        now[0] += 601
        assert e.releases.ask() == ["n1"]
        sent = [to_n1.get_nowait() for _ in range(to_n1.qsize())]
        (request,) = [m.run_check for m in sent if m.HasField("run_check")]
        assert request.check == "gpu_health"

        failed = common_pb2.CheckResult(
            request_id=request.request_id,
            node="n1",
            check="gpu_health",
            verdict=common_pb2.FAIL,
            reason="GPU 0 lost",
            started_at=now[0],
        )
        e.checks.answered("n1", failed)
        await e.wait_for_actions()
        assert e.fleet.nodes["n1"].state.health is Health.QUARANTINED
        assert e.releases.ask() == []  # not again before check_every_s
        now[0] += 61
        assert e.releases.ask() == ["n1"]
        (again,) = [m.run_check for m in (to_n1.get_nowait() for _ in range(to_n1.qsize())) if m.HasField("run_check")]
        passed = common_pb2.CheckResult(
            request_id=again.request_id,
            node="n1",
            check="gpu_health",
            verdict=common_pb2.OK,
            reason="8 GPUs healthy",
            started_at=now[0],
        )
        e.checks.answered("n1", passed)
        await e.wait_for_actions()  # the release runs in a thread: waited for, not slept on
        assert e.fleet.nodes["n1"].state.health is Health.HEALTHY
        assert LocalQuarantines(store.db).nodes() == {}
        (record,) = store.records.operator_actions()
        assert record[1:4] == ("uncordon", "n1", "vigil (automatic)")
        store.close()

    asyncio.run(scenario())


def test_a_node_back_with_fewer_gpus_is_quarantined_and_its_expectation_kept(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = Store(tmp_path / "ctl.db")
        e = node_route(store, Policy(), LocalActuator(store.db), NullPager())
        e.engine.hello("n1", "spool-a", 8)
        e.engine.hello("n1", "spool-a", 8)  # a reconnect with every GPU: nothing
        assert e.fleet.nodes["n1"].state.health is Health.HEALTHY
        e.engine.hello("n1", "spool-b", 7)
        await e.wait_for_actions()
        (incident,) = store.incidents.list(node="n1")
        assert incident.kind == "GPU_LOST" and "7 of its 8 GPUs" in incident.first_message
        assert e.fleet.nodes["n1"].state.health is Health.QUARANTINED
        # A restarted controller still expects 8 (the most ever seen), whatever the node said last.
        again = node_route(Store(tmp_path / "ctl.db"), Policy(), LocalActuator(store.db), NullPager())
        assert again.fleet.nodes["n1"].expected_gpus == 8 and again.fleet.nodes["n1"].gpus == 7
        await e.shutdown()

    asyncio.run(scenario())


def test_a_repeat_offender_is_not_released_automatically() -> None:
    config = RecoveryConfig(hold_down_s=10.0, max_quarantines=3, repeat_window_s=1000.0)
    state = NodeState("n1")
    for at in (100.0, 200.0):
        state = recovered(quarantine_confirmed(replace(state, health=Health.UNHEALTHY), at))
    assert state.quarantine_history == (100.0, 200.0)  # a release keeps the history
    third = quarantine_confirmed(replace(state, health=Health.UNHEALTHY), 300.0)
    assert repeat_offender(third, config, 400.0) == 3
    assert not release_check_due(third, None, config, 400.0)
    assert "candidate for replacement" in repeat_offender_note(3, config)
    # Out of the window, the old quarantines no longer count.
    assert repeat_offender(third, config, 1150.0) == 0 and release_check_due(third, None, config, 1150.0)
    assert state_from_json(state_to_json(third), "n1").quarantine_history == (100.0, 200.0, 300.0)
