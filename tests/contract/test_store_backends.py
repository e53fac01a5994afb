"""The store's contract, on both backends: SQLite (a file) and PostgreSQL (a real server, Debian's
``postgresql`` package, started privately; skipped with the reason where it cannot be).

Each test drives the engine as the gateway does and then opens a second engine on the same
database, as a restarted controller or a new leader would: what one wrote, the other continues.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from controller.act.actuators import NullPager
from controller.act.local_actuator import LocalActuator
from controller.compose import NodeRoute, node_route
from controller.nodes.guards.rules import GuardrailConfig
from controller.store import DatabaseRefused, Opened, Store
from controller.vocab.node_state import Health
from controller.vocab.policy import Policy
from vigil_core.signals import GpuRef, Signal, SignalKind


def xid(node: str, code: int, at: float, seq: int, gpu: int = 0) -> Signal:
    return Signal(node, SignalKind.XID, GpuRef(gpu, f"GPU-{gpu}", "0000:18:00"), code, observed_at=at, seq=seq)


def engine(store: Store, now: list[float], **guardrails: object) -> NodeRoute:
    """The breaker alone (three nodes with XID 79 in a row would otherwise be one fleet incident;
    tests/unit/test_shared_cause.py holds that one across a restart)."""
    guardrails.setdefault("shared", {"enabled": False})
    guard = GuardrailConfig(**guardrails)  # type: ignore[arg-type]
    return node_route(store, Policy(), LocalActuator(store.db), NullPager(), clock=lambda: now[0], guardrails=guard)


def test_incidents_counts_and_states_carry_over_to_the_next_controller(store_target: Path | str) -> None:
    async def scenario() -> None:
        now = [1000.0]
        store = Store(store_target)
        assert store.opened is Opened.NEW
        first = engine(store, now, breaker_max_fraction=1.0)
        for node in ("n1", "n2", "n3"):
            first.engine.hello(node, f"spool-{node}", 8)
        first.engine.receive("n1", [xid("n1", 79, now[0], 1)])
        first.engine.receive("n2", [xid("n2", 13, now[0], 1), xid("n2", 13, now[0] + 2, 2)])  # 2 crashes of the 3
        await first.wait_for_actions()
        assert first.engine.receive("n1", [xid("n1", 79, now[0], 1)]) == 1  # a replay adds nothing
        assert first.fleet.nodes["n1"].state.health is Health.QUARANTINED
        store.close()

        again = Store(store_target)  # a restarted controller, or a new leader on the shared database
        assert again.opened is Opened.EXISTING
        second = engine(again, now, breaker_max_fraction=1.0)
        assert second.fleet.nodes["n1"].state.health is Health.QUARANTINED
        assert second.fleet.open_incident["n1"]
        second.engine.hello("n2", "spool-n2", 8)
        assert second.engine.ack_seq("n2") == 2
        second.engine.receive("n2", [xid("n2", 13, now[0] + 4, 3)])  # the third, counted with the two before
        await second.wait_for_actions()
        assert second.fleet.nodes["n2"].state.health is Health.SUSPECT
        incidents = {(i.node, i.kind, i.code): i for i in again.incidents.list()}
        assert incidents[("n2", "XID", 13)].signal_count == 3
        assert [a.kind for a in incidents[("n1", "XID", 79)].actions].count("QUARANTINE") == 1
        assert again.incidents.signals_from("n1") == 1
        again.close()

    asyncio.run(scenario())


def test_held_actions_and_the_breaker_window_carry_over(store_target: Path | str) -> None:
    """The breaker trips on the second quarantine of a three-node fleet (1 allowed): the third node's
    quarantine is HELD. A new controller on the same database still holds it, and its breaker
    remembers the window: a fourth fault is held too, not let through by a fresh count."""

    async def scenario() -> None:
        now = [1000.0]
        store = Store(store_target)
        first = engine(store, now, breaker_max_nodes=1, breaker_page_delay_s=0)
        for node in ("n1", "n2", "n3", "n4"):
            first.engine.hello(node, f"spool-{node}", 8)
        first.engine.receive("n1", [xid("n1", 79, now[0], 1)])
        first.engine.receive("n2", [xid("n2", 79, now[0], 1)])
        await first.wait_for_actions()
        assert {h.action.node for h in store.actions.held()} == {"n2"}
        first.guard.cancel()
        store.close()

        again = Store(store_target)
        second = engine(again, now, breaker_max_nodes=1, breaker_page_delay_s=0)
        assert {h.action.node for h in again.actions.held()} == {"n2"}
        second.engine.receive("n3", [xid("n3", 79, now[0] + 5, 1)])
        await second.wait_for_actions()
        assert {h.action.node for h in again.actions.held()} == {"n2", "n3"}
        assert second.fleet.nodes["n3"].state.health is not Health.QUARANTINED
        second.guard.cancel()
        again.close()

    asyncio.run(scenario())


def test_records_and_retention(store_target: Path | str) -> None:
    async def scenario() -> None:
        now = [1_000_000.0]
        store = Store(store_target)
        e = engine(store, now)
        e.upkeep.retention_s = 28 * 86400.0
        e.engine.hello("n1", "spool-n1", 8)
        e.engine.receive("n1", [xid("n1", 13, now[0], 1)])  # recorded only
        store.records.check_result("r1", "n1", "gpu_health", "OK", "8 GPUs healthy", {"gpus": 8.0}, now[0], now[0])
        store.records.sweep("s1", "sre", now[0], now[0], '{"v": 1}')
        store.records.sweep("s1", "sre", now[0], now[0] + 1, '{"v": 2}')  # the same sweep, finished later
        assert store.records.sweep_summary("s1") == '{"v": 2}'
        store.records.operator_action("uncordon", "n1", "sre", "why", "done", now[0])
        store.records.set_meta("k", "a")
        store.records.set_meta("k", "b")
        assert store.records.get_meta("k") == "b"
        now[0] += 29 * 86400.0
        gone = e.upkeep.apply_retention()
        assert gone == {
            "incidents": 1,
            "signals": 1,
            "check_results": 1,
            "sweeps": 1,
            "operator_actions": 1,
        }
        assert store.incidents.list() == []
        store.close()

    asyncio.run(scenario())


def test_a_database_of_another_cluster_or_a_newer_schema_is_refused(store_target: Path | str) -> None:
    Store(store_target, cluster="prod-a").close()
    with pytest.raises(DatabaseRefused, match="belongs to cluster 'prod-a'"):
        Store(store_target, cluster="prod-b")
    store = Store(store_target, cluster="prod-a")
    store.records.set_meta("schema_version", "999")
    store.close()
    with pytest.raises(DatabaseRefused, match="written by a newer Vigil"):
        Store(store_target, cluster="prod-a")
