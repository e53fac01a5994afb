"""The admin service over real gRPC: status, incidents and uncordon, as the CLI uses them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from controller.act.local_actuator import LocalQuarantines
from controller.nodes.guards.rules import GuardrailConfig
from controller.nodes.guards.shared import SharedCauseConfig
from protos.vigil.v1 import admin_pb2, admin_pb2_grpc
from tests.contract.test_agent_link import raw_batch, send_raw
from tests.helpers import start_controller, stop_controller


def test_status_incidents_and_uncordon(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        await send_raw(controller.port, raw_batch("s1", [1], code=79), until_ack=1)  # node-a: XID 79
        await controller.engine.wait_for_actions()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            admin = admin_pb2_grpc.AdminStub(channel)
            status = await admin.GetStatus(admin_pb2.StatusRequest())
            (node,) = status.nodes
            assert (node.node, node.health, node.last_seq) == ("node-a", "QUARANTINED", 1)
            assert node.open_incident == "node-a-s1-1"

            (incident,) = (await admin.ListIncidents(admin_pb2.IncidentsRequest(open_only=True))).incidents
            assert incident.code == 79 and incident.status == "OPEN" and "bus" in incident.reason
            assert sorted(a.kind for a in incident.actions if a.status == "DONE") == [
                "NOTE:QUARANTINED",
                "PAGE:quarantine",
                "QUARANTINE",
            ]

            reply = await admin.Uncordon(admin_pb2.UncordonRequest(node="node-a", requested_by="sre", reason="rma"))
            assert reply.health == "HEALTHY" and "1 incident(s) resolved" in reply.detail
            assert not (await admin.ListIncidents(admin_pb2.IncidentsRequest(open_only=True))).incidents
            assert (await admin.GetStatus(admin_pb2.StatusRequest())).nodes[0].open_incident == ""
            assert LocalQuarantines(controller.store.db).nodes() == {}

            again = await admin.Uncordon(admin_pb2.UncordonRequest(node="node-a"))
            assert again.health == "HEALTHY" and "not quarantined by Vigil" in again.detail

            with pytest.raises(grpc.aio.AioRpcError) as err:
                await admin.Uncordon(admin_pb2.UncordonRequest(node="no-such-node"))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
        await stop_controller(controller)

    asyncio.run(scenario())


def test_open_incidents_in_status_survive_a_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        await send_raw(controller.port, raw_batch("s1", [1], code=79), until_ack=1)
        await stop_controller(controller)
        again = await start_controller(tmp_path / "ctl.db")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{again.port}") as channel:
            status = await admin_pb2_grpc.AdminStub(channel).GetStatus(admin_pb2.StatusRequest())
        assert [(n.node, n.open_incident) for n in status.nodes] == [("node-a", "node-a-s1-1")]
        await stop_controller(again)

    asyncio.run(scenario())


def test_a_person_resolves_an_incident_of_a_node_in_service_and_only_that(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        await send_raw(controller.port, raw_batch("s1", [1], code=4000), until_ack=1)  # node-a: SUSPECT (in no catalog)
        await controller.engine.wait_for_actions()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            admin = admin_pb2_grpc.AdminStub(channel)
            assert (await admin.GetStatus(admin_pb2.StatusRequest())).nodes[0].health == "SUSPECT"
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await admin.Resolve(admin_pb2.ResolveRequest(incident_id="no-such-incident"))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND

            request = admin_pb2.ResolveRequest(incident_id="node-a-s1-1", requested_by="sre", note="a bad kernel")
            reply = await admin.Resolve(request)
            assert (reply.node, reply.health) == ("node-a", "HEALTHY")
            assert not (await admin.ListIncidents(admin_pb2.IncidentsRequest(open_only=True))).incidents
            (record,) = controller.store.records.operator_actions()
            assert record[1:5] == ("resolve", "node-a", "sre", "a bad kernel")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await admin.Resolve(request)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "RESOLVED" in err.value.details()

            await send_raw(controller.port, raw_batch("s1", [2], code=79), until_ack=2)  # now quarantined
            await controller.engine.wait_for_actions()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await admin.Resolve(admin_pb2.ResolveRequest(incident_id="node-a-s1-2"))
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "vigil uncordon" in err.value.details()
        await stop_controller(controller)

    asyncio.run(scenario())


def test_rules_count_a_quarantine_a_person_undid_soon_after(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        await send_raw(controller.port, raw_batch("s1", [1], code=79), until_ack=1)
        await controller.engine.wait_for_actions()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            admin = admin_pb2_grpc.AdminStub(channel)
            (rule,) = (await admin.ListRules(admin_pb2.RulesRequest())).rules
            assert (rule.rule, rule.quarantines, rule.pages, rule.undone, rule.precision) == ("xid-79", 1, 1, 0, 1.0)
            await admin.Uncordon(admin_pb2.UncordonRequest(node="node-a", requested_by="sre", reason="false alarm"))
            reply = await admin.ListRules(admin_pb2.RulesRequest())
            (rule,) = reply.rules
            assert (rule.quarantines, rule.undone, rule.precision) == (1, 1, 0.0) and reply.undo_window_s == 3600
        metrics = controller.engine.metrics.registry
        assert metrics.get_sample_value("vigil_controller_rule_undone_total", {"rule": "xid-79"}) == 1
        decided = {"rule": "xid-79", "action": "QUARANTINE"}
        assert metrics.get_sample_value("vigil_controller_rule_decisions_total", decided) == 1
        await stop_controller(controller)

    asyncio.run(scenario())


def test_a_release_said_repaired_or_after_a_passing_check_is_not_held_against_the_rule(tmp_path: Path) -> None:
    """node-a released "--repaired", node-b after a check of it passed, node-c "--not-a-fault":
    one undone, two repaired (before, each counted as undone: a correct rule read 0%)."""

    async def scenario() -> None:
        # Three nodes with one fault at once would be a shared cause (and trip the breaker): not here.
        guard = GuardrailConfig(breaker_max_nodes=10, breaker_max_fraction=1.0, shared=SharedCauseConfig(enabled=False))
        controller = await start_controller(tmp_path / "ctl.db", guardrails=guard)
        for node, spool in (("node-a", "s1"), ("node-b", "s2"), ("node-c", "s3")):
            messages = raw_batch(spool, [1], code=79)
            messages[0].hello.node = node
            for signal in messages[1].signals.signals:
                signal.node = node
            await send_raw(controller.port, messages, until_ack=1)
        await controller.engine.wait_for_actions()
        now = time.time()
        controller.store.records.check_result("r1", "node-b", "gpu_health", "OK", "fine", {}, now, now + 0.001)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            admin = admin_pb2_grpc.AdminStub(channel)
            for node, verdict in (("node-a", "repaired"), ("node-b", ""), ("node-c", "not-a-fault")):
                await admin.Uncordon(admin_pb2.UncordonRequest(node=node, requested_by="sre", verdict=verdict))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await admin.Uncordon(admin_pb2.UncordonRequest(node="node-a", requested_by="sre", verdict="fixed"))
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "'repaired'" in (err.value.details() or "")
            (rule,) = (await admin.ListRules(admin_pb2.RulesRequest())).rules
            assert (rule.quarantines, rule.undone, rule.repaired) == (3, 1, 2)
            assert rule.precision == pytest.approx(2 / 3)
        metrics = controller.engine.metrics.registry
        assert metrics.get_sample_value("vigil_controller_rule_undone_total", {"rule": "xid-79"}) == 1
        await stop_controller(controller)

    asyncio.run(scenario())


def test_a_persons_overlong_words_are_refused_by_name_and_nothing_is_recorded(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        await send_raw(controller.port, raw_batch("s1", [1], code=4000), until_ack=1)  # node-a: SUSPECT (in no catalog)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            admin = admin_pb2_grpc.AdminStub(channel)
            calls = [
                admin.Resolve(admin_pb2.ResolveRequest(incident_id="node-a-s1-1", note="n" * 3_000_000)),
                admin.Uncordon(admin_pb2.UncordonRequest(node="node-a", requested_by="x" * 500)),
                admin.Resume(admin_pb2.ResumeRequest(reason="r" * 5000)),
            ]
            for call, field in zip(calls, ("note is 3000000", "requested_by is 500", "reason is 5000"), strict=True):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in str(err.value.details())
            assert controller.store.records.operator_actions() == []
            assert (await admin.GetStatus(admin_pb2.StatusRequest())).nodes[0].health == "SUSPECT"
        await stop_controller(controller)

    asyncio.run(scenario())
